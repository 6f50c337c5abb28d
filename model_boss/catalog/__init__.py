"""What can be served: model manifests and the catalog built from them."""

from .catalog import Catalog, CatalogEntry
from .manifest import BackendKind, Category, ModelManifest, load_manifests, parse_manifest_text

__all__ = [
    "BackendKind",
    "Catalog",
    "CatalogEntry",
    "Category",
    "ModelManifest",
    "load_manifests",
    "parse_manifest_text",
]
