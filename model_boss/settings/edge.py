"""The HTTP edge: which browser origins and Host names are let in, how large a body may be."""

from __future__ import annotations

import re

from pydantic import BaseModel, Field, field_validator

# the default CORS origins: pages served from this machine, on any port (as Ollama allows)
LOOPBACK_ORIGINS = tuple(f"{scheme}://{host}:*" for scheme in ("http", "https")
                         for host in ("localhost", "127.0.0.1", "[::1]"))
_ORIGIN = re.compile(r"^[a-z][a-z0-9+.-]*://[^/\s:]+(\]?)(:(\d{1,5}|\*))?$|"
                     r"^[a-z][a-z0-9+.-]*://\[[0-9a-f:]+\](:(\d{1,5}|\*))?$", re.IGNORECASE)
# an allowed_hosts entry: a DNS name, or "*." and one (any of its subdomains)
_LABEL = r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?"
_HOST_NAME = re.compile(rf"^(\*\.)?{_LABEL}(\.{_LABEL})*\.?$", re.IGNORECASE)


class EdgeSettings(BaseModel):
    """CORS origins, allowed Host names and the body limit (docs/SECURITY.md)."""

    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    # browser origins that may call the API (CORS): "scheme://host", ":*" for any port, or "*"
    cors_origins: list[str] = Field(default_factory=lambda: list(LOOPBACK_ORIGINS))
    # names a request's Host may carry besides this machine's own and any IP address
    # (docs/SECURITY.md): "name", "*.example.org" (its subdomains) or "*" (any)
    allowed_hosts: list[str] = Field(default_factory=list)

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, value: list[str]) -> list[str]:
        for origin in value:
            if origin != "*" and not _ORIGIN.match(origin):
                raise ValueError(f"{origin!r} is not an origin: 'scheme://host', "
                                 "'scheme://host:port', 'scheme://host:*' (any port) or '*'")
        return value

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if name != "*" and not _HOST_NAME.match(name):
                raise ValueError(f"{name!r} is not a host name: 'name', '*.example.org' (its "
                                 "subdomains) or '*' (any); no scheme, no port (IP addresses "
                                 "are always allowed)")
        return [name.lower().rstrip(".") for name in value]
