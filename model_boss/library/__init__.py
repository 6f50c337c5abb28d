"""The library: the models folder and the catalog changed while running (reloads, pulls,
removals)."""

from .live import LiveCatalog
from .pulls import Pulls

__all__ = ["LiveCatalog", "Pulls"]
