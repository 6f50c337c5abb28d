"""What a spare worker of any kind shares: the body of its ``POST /load`` and the model flags
it takes there, parsed as a cold start's command line would be, but raising instead of
exiting (they arrive over HTTP)."""

from __future__ import annotations

import argparse
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class InvalidOptions(ValueError):
    """Model flags given to a spare's ``POST /load`` that do not parse."""


class RaisingParser(argparse.ArgumentParser):
    """Raises :class:`InvalidOptions` instead of exiting."""

    def error(self, message: str):  # type: ignore[override]
        raise InvalidOptions(message)


def refuse_owned(flags: list[str], owned: frozenset[str]) -> None:
    """Flags that are the spare's own (its address, parent, key) are not a model's."""
    if any(flag.split("=")[0] in owned for flag in flags):
        raise InvalidOptions(f"{', '.join(sorted(owned))} are the spare's own")


class LoadRequest(BaseModel):
    """The body of ``POST /load``: a spare's model, as the flags a cold start would get."""

    model_config = ConfigDict(extra="forbid")

    args: list[Annotated[str, Field(max_length=4096)]] = Field(min_length=1, max_length=200)
    cuda_visible_devices: str | None = Field(default=None, max_length=256,
                                             pattern=r"^[0-9A-Za-z,-]*$")
