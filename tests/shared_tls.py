"""One TLS context for every httpx client a test process makes.

``httpx.get`` and its siblings make a client per call, and so do the SDK clients the tests
build (openai, anthropic, ollama): each client builds an SSL context from certifi's bundle,
23 ms of CPU here. A run made about 2,000 of them, a minute of the suite's CPU, though the
suite speaks plain http to everything (the https client test runs in a process of its own).
``share_default_context`` makes httpx build the default context (verify on, no client
certificate) once per process and hand the same one out after; anything else is built as
before. A hook in tests/conftest.py calls it, so benchmarks that import the conftest keep
httpx as their users have it.
"""

from __future__ import annotations

import os
import ssl


def share_default_context() -> None:
    try:
        from httpx._transports import default
    except ImportError:  # another httpx layout: nothing shared, nothing broken
        return
    build = getattr(default, "create_ssl_context", None)
    if build is None or getattr(build, "shared", False):
        return
    built: dict[tuple, ssl.SSLContext] = {}

    def create_ssl_context(verify=True, cert=None, trust_env: bool = True) -> ssl.SSLContext:
        if verify is not True or cert is not None:
            return build(verify=verify, cert=cert, trust_env=trust_env)
        key = (trust_env, os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
        if key not in built:
            built[key] = build(verify=True, trust_env=trust_env)
        return built[key]

    create_ssl_context.shared = True
    default.create_ssl_context = create_ssl_context
