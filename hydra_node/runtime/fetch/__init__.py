"""Models by name: the built-in catalogue, verified resumable downloads into the node's one cache, and
model transfers between mesh peers (docs/models.md)."""

from hydra_node.runtime.fetch.cache import CachedModel, ModelCache
from hydra_node.runtime.fetch.catalogue import (
    BadModelSource,
    CatalogueEntry,
    RemoteModel,
    load_catalogue,
    resolve_remote,
)
from hydra_node.runtime.fetch.errors import DownloadError, PeerFetchError
from hydra_node.runtime.fetch.fetcher import (
    FetchSettings,
    LocalModel,
    ensure_local,
    needs_fetch,
)
from hydra_node.runtime.fetch.peer import ModelShare
from hydra_node.runtime.fetch.peer_wire import FETCH_KIND
from hydra_node.runtime.fetch.serve_fetch import fetch_for_serve
from hydra_node.runtime.fetch.settings import ModelsSection, parse_models_section

__all__ = [
    "FETCH_KIND",
    "BadModelSource",
    "CachedModel",
    "CatalogueEntry",
    "DownloadError",
    "FetchSettings",
    "LocalModel",
    "ModelCache",
    "ModelShare",
    "ModelsSection",
    "PeerFetchError",
    "RemoteModel",
    "ensure_local",
    "fetch_for_serve",
    "load_catalogue",
    "needs_fetch",
    "parse_models_section",
    "resolve_remote",
]
