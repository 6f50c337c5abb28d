"""What a launch is, as plain data: the daemon and model an agent is pointed at
(:class:`Target`), and what starting it takes (:class:`Launch`: its command line, the
environment set or removed, the files written, the lines shown)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# the key the agents are given when the daemon asks for none: they refuse to start keyless
NO_KEY = "model-boss"


@dataclass(frozen=True)
class Target:
    """The daemon (its root URL, no ``/v1``), the key to send, the model and its context
    per request in tokens."""

    url: str
    key: str | None
    model: str
    context: int

    @property
    def key_or_placeholder(self) -> str:
        return self.key or NO_KEY


@dataclass
class Launch:
    """How to start one agent: ``argv`` (the binary first), ``env`` to set (a value) or remove
    (``None``), ``files`` to write first, and what ``describe`` shows of each. The names in
    ``defaults`` are tunings the caller may have chosen: a value in the caller's environment
    is kept, launch's is set only where there is none."""

    argv: list[str]
    env: dict[str, str | None] = field(default_factory=dict)
    files: dict[Path, str] = field(default_factory=dict)
    secrets: frozenset[str] = frozenset()  # env names whose values are keys: never shown whole
    shown_args: list[str] = field(default_factory=list)  # the options the launcher added
    defaults: frozenset[str] = frozenset()  # env names whose value in the caller's is kept

    def environ(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` (the caller's environment) with this launch's changes."""
        merged = dict(base)
        for name, value in self.env.items():
            if name in self.defaults and name in base:
                continue
            if value is None:
                merged.pop(name, None)
            else:
                merged[name] = value
        return merged

    def describe(self, base: dict[str, str], written: bool = True) -> list[str]:
        """One line per thing set: each variable (a key masked), each file (``written``
        False: a dry run, which writes none), the options."""
        lines = []
        for name, value in self.env.items():
            if name in self.defaults and name in base:
                lines.append(f"{name}={base[name]} (yours, kept)")
            elif value is None:
                if name in base:
                    lines.append(f"unset {name}")
            elif name in self.secrets:
                lines.append(f"{name}={mask(value)}")
            else:
                lines.append(f"{name}={value}")
        lines += [f"{'wrote' if written else 'would write'} {path}" for path in self.files]
        lines += self.shown_args
        return lines


def mask(secret: str) -> str:
    """A key as it may be shown: its first four characters of a long one, and its length."""
    if secret == NO_KEY:
        return f"{NO_KEY} (no key: the daemon asks for none)"
    shown = secret[:4] if len(secret) >= 16 else ""
    return f"{shown}… ({len(secret)} characters)"
