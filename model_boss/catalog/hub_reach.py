"""Reaching the hub, as a person waiting on a pull sees it: each try and retry as it happens,
and, when the hub cannot be reached, why (name resolution, refused, TLS, a timeout) and how to
point model-boss at a mirror.

``huggingface_hub`` retries a failed request itself (five times, waiting 1, 2, 4, 8 and 8 s)
and says so only in its log; :class:`HubRetries` turns those lines, from the pull's own
thread, into ``retrying`` reports while they happen.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from typing import Any

from ..errors import ModelBossError, network_reason

Report = Callable[[dict[str, Any]], None]
HUB_HTTP_LOGGER = "huggingface_hub.utils._http"  # where the hub client logs its retries
_THROWN = re.compile(r"^'(?P<error>.*)' thrown while requesting (?P<method>\w+) (?P<url>\S+)")
_HTTP = re.compile(r"^HTTP Error (?P<status>\d+) thrown while requesting")
_RETRY = re.compile(r"(?:Retrying in|Waiting) (?P<wait>[\d.]+)s.*"
                    r"\[Retry (?P<n>\d+)/(?P<of>\d+)\]")
MIRROR_HINT = ("to pull through a mirror, set HF_ENDPOINT in the daemon's environment (or "
               "hf_endpoint in its settings) to the mirror's URL and restart it")


# what the hub client's log says of a failed try (only its text), in words
_WORDS = (("name or service not known", "name resolution failed"),
          ("temporary failure in name resolution", "name resolution failed"),
          ("nodename nor servname", "name resolution failed"),
          ("getaddrinfo failed", "name resolution failed"),
          ("connection refused", "connection refused"),
          ("certificate", "TLS certificate not trusted"),
          ("ssl", "TLS handshake failed"),
          ("timed out", "timed out"))


def in_words(error: str) -> str:
    """A failed try's error text with what it means in front: "name resolution failed
    ([Errno -2] Name or service not known)"."""
    lowered = error.lower()
    words = next((words for text, words in _WORDS if text in lowered), None)
    return f"{words} ({error})" if words else error


class HubUnavailable(ModelBossError):
    status_code = 503
    error_type = "server_error"
    code = "hub_unavailable"


def hub_endpoint(endpoint: str | None) -> str:
    """The hub a pull asks: ``endpoint`` (the ``hf_endpoint`` setting), else what
    ``huggingface_hub`` read from ``HF_ENDPOINT``, else huggingface.co."""
    if endpoint:
        return endpoint.rstrip("/")
    from huggingface_hub import constants

    return constants.ENDPOINT.rstrip("/")


class HubRetries(logging.Handler):
    """While it is installed (``with HubRetries(report):``), each retry the hub client makes
    for this thread becomes a report: ``{"status": "retrying", "attempt", "of", "wait_s",
    "reason"}``. ``tries`` counts the failed tries seen."""

    def __init__(self, report: Report) -> None:
        super().__init__(logging.WARNING)
        self.report = report
        self.thread = threading.get_ident()
        self.reason: str | None = None
        self.tries = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread != self.thread:  # another pull's, or another request's
            return
        try:
            message = record.getMessage()
            if (thrown := _THROWN.match(message)) is not None:
                self.reason, self.tries = in_words(thrown["error"]), self.tries + 1
            elif (status := _HTTP.match(message)) is not None:
                self.reason, self.tries = f"the hub answered {status['status']}", self.tries + 1
            elif (retry := _RETRY.search(message)) is not None:
                self.report({"status": "retrying", "attempt": int(retry["n"]),
                             "of": int(retry["of"]), "wait_s": float(retry["wait"]),
                             "reason": self.reason})
        except Exception:  # a report must never break the pull it describes
            self.handleError(record)

    def __enter__(self) -> HubRetries:
        logging.getLogger(HUB_HTTP_LOGGER).addHandler(self)
        return self

    def __exit__(self, *_: object) -> None:
        logging.getLogger(HUB_HTTP_LOGGER).removeHandler(self)


def unreachable(exc: BaseException, what: str, endpoint: str, tries: int = 1,
                retry_after_s: float = 30) -> HubUnavailable:
    """The error of a hub that could not be reached for ``what``: why, after how many tries,
    and how to use a mirror."""
    after = f" after {tries} tries" if tries > 1 else ""
    return HubUnavailable(f"the hub at {endpoint} could not be reached for {what}{after}: "
                          f"{network_reason(exc)}; {MIRROR_HINT}", retry_after_s=retry_after_s)
