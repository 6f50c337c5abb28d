"""Client libraries imported on first use, not at collection.

Every test process collects every test file, so a client imported at the top of one file was
imported by all of them: ``anthropic`` alone is 1.2 s, ``openai`` 0.5 s, numpy, PIL, PyAV and
``ollama`` another 0.5 s, in each of the suite's processes. ``openai = lazy("openai")``
imports it at the first attribute read (``openai.OpenAI``), in the process that runs the
file. A stand-in object, not a lazily loaded module: collection looks at every name in a test
module (``isinstance``, ``__test__``, fixture markers), and on a module object that alone
would load it. Names that start with ``_`` are not passed on.
"""

from __future__ import annotations

import importlib
from typing import Any


class lazy:  # used like the module it stands for
    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("_"):  # what collection looks for (``__test__``,
            raise AttributeError(attribute)  # ``_pytestfixturefunction``): not the module's
        return getattr(importlib.import_module(self._name), attribute)

    def __repr__(self) -> str:
        return f"<lazy {self._name}>"
