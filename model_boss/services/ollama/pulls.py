"""Ollama's ``/api/pull`` and ``/api/delete`` over model-boss's pulls: a hub GGUF named as
Ollama names one (``hf.co/ORG/REPO:QUANT``) is pulled into the models folder, with Ollama's
progress lines; a name already served answers ``success`` at once, as Ollama does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from ...catalog.hub_source import InvalidHubName, parse_source
from ...errors import BadRequest, ModelNotFound

if TYPE_CHECKING:
    from ...coordinator import Coordinator


def check(coord: Coordinator, name: str | None) -> str:
    """The name to pull; 400 without one, 404 when it is neither served nor a hub GGUF."""
    if not name:
        raise BadRequest("model: Field required", param="model", code="missing_field")
    if name not in coord.catalog:
        try:
            parse_source(name)
        except InvalidHubName:  # a hub source with a part the hub could not have: say which
            raise
        except BadRequest:
            raise ModelNotFound(
                f"pull model manifest: '{name}' is not served here, and model-boss pulls "
                "GGUF files from the Hugging Face Hub: hf.co/ORG/REPO:QUANT",
                param="model") from None
    return name


async def pull_lines(coord: Coordinator, name: str) -> AsyncIterator[dict[str, Any]]:
    """Ollama's progress lines for the pull of ``name`` (checked by :func:`check`)."""
    if name in coord.catalog:
        yield {"status": "success"}
        return
    yield {"status": "pulling manifest"}
    async for report in coord.pulls.follow(name):
        status = report.get("status")
        if status == "downloading":
            yield {"status": f"pulling {report['file']}", "digest": report.get("digest", ""),
                   "total": report["total"], "completed": report["completed"]}
        elif status == "retrying":  # the hub not reached yet: each retry as it comes
            yield {"status": f"retrying in {report['wait_s']:g}s (try {report['attempt']} "
                             f"of {report['of']}): {report.get('reason') or 'no answer'}"}
        elif status == "verifying":
            yield {"status": "verifying sha256 digest"}
        elif status == "placed":
            yield {"status": "writing manifest"}
        elif status == "success":
            yield {"status": "success"}
