"""What can be served: model manifests and the catalog built from them."""

from .build import CatalogDiff, build_catalog, diff_catalogs
from .catalog import Catalog, CatalogEntry
from .context import ContextFit, context_view
from .manifest import BackendKind, Category, ModelManifest, load_manifests, parse_manifest_text
from .pipelines import media_refusal

__all__ = [
    "BackendKind",
    "Catalog",
    "CatalogDiff",
    "CatalogEntry",
    "Category",
    "ContextFit",
    "context_view",
    "build_catalog",
    "diff_catalogs",
    "ModelManifest",
    "load_manifests",
    "media_refusal",
    "parse_manifest_text",
]
