"""One entry point from a model reference to a verified local file: the cache, else a download.

``needs_fetch(ref)`` tells whether a ``--model`` value is a catalogue name or URL (everything else
is the bundled id or a local path, handled by ``hydra_node.models.resolve_model``);
:func:`ensure_local` returns the cached file, downloading it when it is missing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from hydra_node.models import BUNDLED_MODEL_ID, ModelNotFound, bundled_model_path
from hydra_node.runtime.fetch.cache import ModelCache
from hydra_node.runtime.fetch.catalogue import (
    DEFAULT_HUB,
    CatalogueEntry,
    RemoteModel,
    is_remote_ref,
    load_catalogue,
    resolve_projector,
    resolve_remote,
    with_sha256,
)
from hydra_node.runtime.fetch.errors import ChecksumMismatch
from hydra_node.runtime.fetch.http_fetch import Progress, download_http
from hydra_node.runtime.fetch.migrate import migrate_models
from hydra_node.runtime.fetch.settings import ModelsSection

__all__ = [
    "FetchSettings",
    "LocalModel",
    "catalogue_projector",
    "ensure_local",
    "ensure_projector",
    "needs_fetch",
    "open_cache",
    "remote_for",
]


@dataclass(frozen=True)
class FetchSettings:
    """Where models are cached and fetched from (built by the CLI from the config and environment)."""

    #: The node's one cache (``<home>/placement/cache``): models and placement's artifacts.
    cache_dir: Path
    hub: str = DEFAULT_HUB
    token: str | None = None
    models: ModelsSection = field(default_factory=ModelsSection)
    #: The one capacity (``[placement] cache_capacity_gb`` in bytes; 0: no limit).
    capacity_bytes: int = 0
    #: The model cache of the previous generation (``<home>/models``), moved in when the cache is opened.
    old_models_dir: Path | None = None


def open_cache(settings: FetchSettings) -> ModelCache:
    """The models of the one cache, the previous generation's layout moved in first (:mod:`.migrate`)."""
    cache = ModelCache(settings.cache_dir, capacity_bytes=settings.capacity_bytes)
    if settings.old_models_dir is not None:
        migrate_models(settings.old_models_dir, cache)
    return cache


@dataclass(frozen=True)
class LocalModel:
    model_id: str
    path: Path
    source: str  # "cache", "bundled", or where it was just fetched from


def needs_fetch(ref: str, catalogue: dict[str, CatalogueEntry] | None = None) -> bool:
    """True for a catalogue name (not the bundled one) or an hf:// / http(s):// reference (``ID=`` allowed)."""
    catalogue = load_catalogue() if catalogue is None else catalogue
    entry = catalogue.get(ref)
    if entry is not None:
        return not entry.bundled
    target = ref.split("=", 1)[1] if "=" in ref.split("://", 1)[0] else ref
    return is_remote_ref(target)


def remote_for(ref: str, settings: FetchSettings, catalogue: dict[str, CatalogueEntry] | None = None) -> RemoteModel:
    return resolve_remote(ref, load_catalogue() if catalogue is None else catalogue, settings.hub)


def ensure_local(
    ref: str,
    settings: FetchSettings,
    *,
    in_use: frozenset[str] = frozenset(),
    progress: Progress | None = None,
    force: bool = False,
    sha256: str | None = None,
) -> LocalModel:
    """The verified local file for ``ref``: the bundled file for the bundled name, the cached copy
    (its size re-checked), or a fresh download (``force``: even when cached). ``sha256``: the digest
    the file must have (``pull --sha256``; a cached copy with another is refused). Typed errors:
    ``BadModelSource``, ``DownloadError`` and its subclasses, ``ModelNotFound``."""
    catalogue = load_catalogue()
    entry = catalogue.get(ref)
    if entry is not None and entry.bundled and not force:
        try:
            return LocalModel(BUNDLED_MODEL_ID, bundled_model_path(), "bundled")
        except ModelNotFound:
            pass  # not installed: download it like any other entry
    remote = resolve_remote(ref, catalogue, settings.hub)
    if sha256 is not None:
        remote = with_sha256(remote, sha256)
    return _ensure_remote(remote, settings, in_use=in_use, progress=progress, force=force, sha256=sha256)


def catalogue_projector(ref: str, catalogue: dict[str, CatalogueEntry] | None = None) -> str | None:
    """The catalogue name whose projector serves beside the ``--model`` value ``ref`` (a catalogue
    name with ``mmproj_sources``), else None."""
    entry = (load_catalogue() if catalogue is None else catalogue).get(ref)
    return entry.name if entry is not None and entry.has_projector else None


def ensure_projector(ref: str, settings: FetchSettings, *, progress: Progress | None = None) -> LocalModel:
    """The verified local file of the projector ``ref`` (a catalogue name: its entry's projector, an
    ``hf://`` reference or a URL): cached, else downloaded like a model (the same cache, digest pinned on
    first download when none is published). Typed errors as :func:`ensure_local`."""
    return _ensure_remote(resolve_projector(ref, load_catalogue(), settings.hub), settings, progress=progress)


def _ensure_remote(
    remote: RemoteModel,
    settings: FetchSettings,
    *,
    in_use: frozenset[str] = frozenset(),
    progress: Progress | None = None,
    force: bool = False,
    sha256: str | None = None,
) -> LocalModel:
    cache = open_cache(settings)
    rec = cache.lookup(remote.model_id)
    if rec is not None and sha256 is not None and rec.sha256 != remote.sha256:
        raise ChecksumMismatch(
            f"{remote.model_id}: the cached copy has sha256 {rec.sha256}, not the --sha256 {remote.sha256}; "
            f"remove it with `hydra models rm {remote.model_id}` and pull again"
        )
    if rec is not None and not force:
        path = rec.path(cache.root)
        if path.stat().st_size == rec.size_bytes:
            cache.touch(remote.model_id, time.time())
            return LocalModel(remote.model_id, path, "cache")
        # changed on disk since it was verified: fetch it again (checked against the same pinned digest)
    rec = download_http(
        remote,
        cache,
        token=settings.token,
        read_timeout_s=settings.models.read_timeout_s,
        min_rate_bytes_s=settings.models.min_rate_bytes_s,
        in_use=in_use,
        progress=progress,
    )
    return LocalModel(rec.model_id, rec.path(cache.root), rec.source)
