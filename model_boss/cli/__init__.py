"""The command line, one module per command group: ``serve`` and the dispatch (``dispatch``),
its parser, ``ps`` with its table (``ps``), watch (``watch``) and cluster view (``cluster``),
``pull`` (``pull``), ``keys``, ``usage``, ``launch`` and ``simulate``."""

from .dispatch import main

__all__ = ["main"]
