"""What a pull may name: a Hugging Face Hub repository, and a file in it or a quantization.

``hf://ORG/REPO/FILE.gguf``, ``hf://ORG/REPO:QUANT`` or ``hf://ORG/REPO`` (also spelled
``hf.co/...``, Ollama's way, ``huggingface.co/...`` and ``https://huggingface.co/...``). An
org or repository name the Hub could not have (``..``, a leading dash, 97 characters) is a
400 naming the part, before any request leaves for the hub: the rules are the Hub's own
(``huggingface_hub.utils.validate_repo_id``'s, checked against it in the tests).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import BadRequest

# every spelling of a source: the repository, then a file path or a quantization
_SOURCE = re.compile(r"^(?:hf://|hf\.co/|huggingface\.co/|https://huggingface\.co/)"
                     r"(?P<org>[^/:\s]*)/(?P<repo>[^/:\s]*)"
                     r"(?:(?P<file>/\S+)|:(?P<quant>\S*))?$", re.IGNORECASE)
# a Hub name (an org or a repository): letters, digits, "-", "_", "."; 1 to 96 of them,
# neither first nor last a "-" or a "."
_NAME = re.compile(r"[A-Za-z0-9_](?:[\w.-]{0,94}[A-Za-z0-9_])?", re.ASCII)
_FILE_PART = re.compile(r"[\w.+-]+", re.ASCII)
_QUANT = re.compile(r"[\w.-]+", re.ASCII)
FORMS = ("hf://ORG/REPO/FILE.gguf", "hf://ORG/REPO:QUANT", "hf://ORG/REPO")


@dataclass(frozen=True, slots=True)
class PullSource:
    """``hf://ORG/REPO/FILE.gguf``, ``hf://ORG/REPO:QUANT`` or ``hf://ORG/REPO``."""

    repo: str
    filename: str | None = None
    quant: str | None = None

    def __str__(self) -> str:
        tail = f"/{self.filename}" if self.filename else f":{self.quant}" if self.quant else ""
        return f"hf://{self.repo}{tail}"


class InvalidHubName(BadRequest):
    """A source in a pull's shape whose org, repository, file or quantization the Hub could
    not have: refused before any request leaves."""

    code = "invalid_hub_name"


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be an org or repository name on the Hub; None when it can."""
    if not name:
        return "it is empty"
    if len(name) > 96:
        return f"it has {len(name)} characters; at most 96"
    for pair in ("--", ".."):
        if pair in name:
            return f"it contains {pair!r}, which the Hub does not allow"
    if not _NAME.fullmatch(name):
        return ("only letters, digits, '-', '_' and '.' are allowed, and it may not start "
                "or end with '-' or '.'")
    if name.endswith(".git"):
        return "it may not end in '.git'"
    return None


def _file_problem(path: str) -> str | None:
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "no empty, '.' or '..' parts"
    if not all(_FILE_PART.fullmatch(part) for part in parts):
        return "only letters, digits, '-', '_', '+' and '.' in each part"
    if not path.lower().endswith(".gguf"):
        return "a file pulled by name is a .gguf file (hf://ORG/REPO for a folder)"
    return None


def parse_source(text: object) -> PullSource:
    """The source ``text`` names; a 400 that names the wrong part when it is not one."""
    shape = f"expected {', '.join(FORMS[:-1])} or {FORMS[-1]}"
    match = _SOURCE.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise BadRequest(f"cannot pull {text!r}: {shape}", param="source")
    for part in ("org", "repo"):
        problem = name_problem(match[part])
        if problem is not None:
            raise InvalidHubName(f"cannot pull {text!r}: the {part} {match[part]!r} is not a "
                                 f"valid Hugging Face Hub name: {problem}", param="source")
    file = match["file"][1:] if match["file"] else None
    if file is not None and (problem := _file_problem(file)) is not None:
        raise InvalidHubName(f"cannot pull {text!r}: the file {file!r} is not a valid path "
                             f"in a Hub repository: {problem}", param="source")
    quant = match["quant"]
    if quant is not None and not _QUANT.fullmatch(quant):
        raise InvalidHubName(f"cannot pull {text!r}: the quantization {quant!r} is not one "
                             "(letters, digits, '-', '_' and '.': Q4_K_M, IQ4_XS)",
                             param="source")
    return PullSource(f"{match['org']}/{match['repo']}", file, quant)
