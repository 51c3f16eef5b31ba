"""The built-in model catalogue and model source references (pure: no network, no clock).

A model reference given to ``serve --model`` or ``hydra models pull`` is one of:

* a catalogue name (``Qwen3-8B-Q4_K_M``; the table is ``catalogue.toml`` in this package);
* ``hf://OWNER/REPO[@REV]/FILE`` → ``{hub}/OWNER/REPO/resolve/REV/FILE`` (REV defaults to ``main``;
  ``hub`` is ``https://huggingface.co`` unless ``HF_ENDPOINT`` says otherwise);
* a plain ``https://`` (or, for tests and local mirrors, ``http://``) URL of a ``.gguf`` file.

An entry may pair the model with its multimodal projector (``mmproj_sources``, ``mmproj_file`` and,
when known, ``mmproj_sha256``, ``mmproj_size_bytes`` or ``mmproj_approx_gb``): ``serve --model NAME``
then fetches both. A ``--mmproj`` value (a catalogue name: that entry's projector, or ``hf://`` /
``https://``) becomes a :class:`RemoteModel` through :func:`resolve_projector`.

Each becomes a :class:`RemoteModel`: the id it is served under, the URLs to try, the cache file
name and, when known, the exact size and sha256.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any
from urllib.parse import quote, urlsplit

from hydra_node.models import MAX_MODEL_ID_CHARS, InvalidModelId, check_model_id

__all__ = [
    "DEFAULT_HUB",
    "BadModelSource",
    "CatalogueEntry",
    "CatalogueError",
    "RemoteModel",
    "hf_url",
    "is_remote_ref",
    "load_catalogue",
    "parse_catalogue",
    "projector_remote",
    "resolve_projector",
    "resolve_remote",
    "with_sha256",
]

DEFAULT_HUB = "https://huggingface.co"
#: Longest URL accepted (a Hub URL is ~150 characters).
MAX_URL_CHARS = 2048
#: Most entries a catalogue file may hold (it is read whole at every start).
MAX_CATALOGUE_ENTRIES = 512

_SHA256 = re.compile(r"[0-9a-f]{64}")
_HF_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")


class CatalogueError(ValueError):
    """The catalogue file is malformed (a packaging bug; the message names the entry and field)."""


class BadModelSource(ValueError):
    """A model reference that is neither a catalogue name nor a usable hf:// or https:// URL."""


@dataclass(frozen=True)
class CatalogueEntry:
    name: str
    sources: tuple[str, ...]
    file: str
    size_bytes: int | None = None
    approx_gb: float | None = None
    sha256: str | None = None
    licence: str = ""
    quant: str = ""
    context: int | None = None
    bundled: bool = False
    note: str = ""
    #: The multimodal projector served beside the model (docs/vision.md): where it comes from, its
    #: cache file name and, when known, its exact size or approximate one and sha256; () / "": none.
    mmproj_sources: tuple[str, ...] = ()
    mmproj_file: str = ""
    mmproj_size_bytes: int | None = None
    mmproj_approx_gb: float | None = None
    mmproj_sha256: str | None = None

    @property
    def has_projector(self) -> bool:
        return bool(self.mmproj_sources)

    @property
    def projector_id(self) -> str:
        """The id the projector is cached under (``hydra models`` lists it): NAME + ``.mmproj``."""
        return self.name + PROJECTOR_SUFFIX

    def __post_init__(self) -> None:
        where = f"catalogue entry {self.name!r}"
        try:
            check_model_id(self.name)
        except InvalidModelId as exc:
            raise CatalogueError(f"{where}: {exc}") from None
        if not self.sources or not all(isinstance(s, str) and is_remote_ref(s) for s in self.sources):
            raise CatalogueError(f"{where}: sources must be hf:// or https:// URLs")
        if not _FILE_NAME.fullmatch(self.file) or not self.file.endswith(".gguf"):
            raise CatalogueError(f"{where}: file must be a plain .gguf file name, not {self.file!r}")
        if self.sha256 is not None and not _SHA256.fullmatch(self.sha256):
            raise CatalogueError(f"{where}: sha256 must be 64 lower-case hex digits")
        if self.size_bytes is not None and (isinstance(self.size_bytes, bool) or self.size_bytes <= 0):
            raise CatalogueError(f"{where}: size_bytes must be a positive integer")
        self._check_projector(where)

    def _check_projector(self, where: str) -> None:
        given = [k for k in _PROJECTOR_FIELDS if getattr(self, k) not in ((), "", None)]
        if not given:
            return
        if not self.mmproj_sources or not self.mmproj_file:
            raise CatalogueError(f"{where}: a projector needs mmproj_sources and mmproj_file (it has {given})")
        if not all(isinstance(s, str) and is_remote_ref(s) for s in self.mmproj_sources):
            raise CatalogueError(f"{where}: mmproj_sources must be hf:// or https:// URLs")
        if not _FILE_NAME.fullmatch(self.mmproj_file) or not self.mmproj_file.endswith(".gguf"):
            raise CatalogueError(f"{where}: mmproj_file must be a plain .gguf file name, not {self.mmproj_file!r}")
        if self.mmproj_file == self.file:
            raise CatalogueError(f"{where}: mmproj_file must differ from file")
        if self.mmproj_sha256 is not None and not _SHA256.fullmatch(self.mmproj_sha256):
            raise CatalogueError(f"{where}: mmproj_sha256 must be 64 lower-case hex digits")
        if self.mmproj_size_bytes is not None and (
            isinstance(self.mmproj_size_bytes, bool) or self.mmproj_size_bytes <= 0
        ):
            raise CatalogueError(f"{where}: mmproj_size_bytes must be a positive integer")
        try:
            check_model_id(self.projector_id)
        except InvalidModelId as exc:
            raise CatalogueError(f"{where}: the projector's id: {exc}") from None

    @property
    def display_size(self) -> str:
        if self.size_bytes is not None:
            return f"{self.size_bytes / 1e9:.2f} GB"
        return f"~{self.approx_gb:.2f} GB" if self.approx_gb else "?"


@dataclass(frozen=True)
class RemoteModel:
    """A model to fetch: served as ``model_id``, cached as ``file``, fetched from ``urls`` in order."""

    model_id: str
    urls: tuple[str, ...]
    file: str
    size_bytes: int | None = None
    sha256: str | None = None
    #: True for hf:// sources: the HF_TOKEN (if any) is sent to these hosts as a Bearer token.
    hub: bool = False
    #: Who vouches for ``sha256``: "catalogue", "given" (``pull --sha256``), "hub-lfs", "peer:<node id>".
    sha256_origin: str = "catalogue"
    #: The catalogue's approximate size (``approx_gb``) when it has no exact one: checked loosely.
    approx_bytes: int | None = None


_FIELDS: dict[str, type | tuple[type, ...]] = {
    "sources": list,
    "file": str,
    "size_bytes": int,
    "approx_gb": (int, float),
    "sha256": str,
    "licence": str,
    "quant": str,
    "context": int,
    "bundled": bool,
    "note": str,
    "mmproj_sources": list,
    "mmproj_file": str,
    "mmproj_size_bytes": int,
    "mmproj_approx_gb": (int, float),
    "mmproj_sha256": str,
}
_PROJECTOR_FIELDS = tuple(k for k in _FIELDS if k.startswith("mmproj_"))
#: What a catalogue projector's cache id adds to its entry's name.
PROJECTOR_SUFFIX = ".mmproj"


def parse_catalogue(text: str) -> dict[str, CatalogueEntry]:
    """Catalogue TOML → name → entry; :class:`CatalogueError` naming the entry and field otherwise."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogueError(f"catalogue: not valid TOML: {exc}") from None
    models = data.get("models")
    if set(data) != {"models"} or not isinstance(models, Mapping):
        raise CatalogueError("catalogue: must hold exactly one table, [models]")
    if len(models) > MAX_CATALOGUE_ENTRIES:
        raise CatalogueError(f"catalogue: more than {MAX_CATALOGUE_ENTRIES} entries")
    out: dict[str, CatalogueEntry] = {}
    for name, raw in models.items():
        if not isinstance(raw, Mapping):
            raise CatalogueError(f"catalogue entry {name!r}: must be a table")
        kwargs: dict[str, Any] = {}
        for key, value in raw.items():
            typ = _FIELDS.get(key)
            if typ is None:
                raise CatalogueError(f"catalogue entry {name!r}: unknown field {key!r}")
            if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
                raise CatalogueError(f"catalogue entry {name!r}: field {key!r} has the wrong type")
            if isinstance(value, list):  # sources, mmproj_sources (the only list fields: checked)
                value = tuple(value)
            kwargs[key] = value
        if "sources" not in kwargs or "file" not in kwargs:
            raise CatalogueError(f"catalogue entry {name!r}: needs sources and file")
        out[name] = CatalogueEntry(name=name, **kwargs)
    return out


def load_catalogue() -> dict[str, CatalogueEntry]:
    """The catalogue shipped in this package (``catalogue.toml``)."""
    text = resources.files(__package__).joinpath("catalogue.toml").read_text(encoding="utf-8")
    return parse_catalogue(text)


def is_remote_ref(ref: str) -> bool:
    return ref.startswith(("hf://", "https://", "http://"))


def hf_url(ref: str, hub: str = DEFAULT_HUB) -> tuple[str, str]:
    """``hf://OWNER/REPO[@REV]/FILE`` → (download URL, file name); :class:`BadModelSource` otherwise.
    FILE may sit in folders of the repository (``dir/x.gguf``)."""
    rest = ref[len("hf://") :]
    parts = rest.split("/")
    if len(parts) < 3:
        raise BadModelSource(f"{ref!r}: expected hf://OWNER/REPO[@REV]/FILE")
    owner, repo_rev, path = parts[0], parts[1], parts[2:]
    repo, _, rev = repo_rev.partition("@")
    rev = rev or "main"
    if not (_HF_PART.fullmatch(owner) and _HF_PART.fullmatch(repo) and re.fullmatch(r"[A-Za-z0-9._/-]{1,96}", rev)):
        raise BadModelSource(f"{ref!r}: owner, repository and revision may hold letters, digits and . _ -")
    if any(p in ("", ".", "..") for p in path) or not _FILE_NAME.fullmatch(path[-1]):
        raise BadModelSource(f"{ref!r}: FILE must be a path of plain names")
    url = f"{hub.rstrip('/')}/{owner}/{repo}/resolve/{quote(rev, safe='')}/{'/'.join(quote(p) for p in path)}"
    return url, path[-1]


def with_sha256(remote: RemoteModel, sha256: str) -> RemoteModel:
    """``remote`` verified against a digest given by the user (``pull --sha256``); :class:`BadModelSource`
    for a malformed digest or one that contradicts the catalogue's."""
    digest = sha256.strip().lower()
    if not _SHA256.fullmatch(digest):
        raise BadModelSource(f"--sha256 {sha256[:80]!r}: expected 64 hex digits")
    if remote.sha256 is not None and remote.sha256 != digest:
        raise BadModelSource(
            f"--sha256 {digest} contradicts the catalogue's {remote.sha256} for {remote.model_id}; drop --sha256"
        )
    if remote.sha256 is not None:
        return remote
    return replace(remote, sha256=digest, sha256_origin="given")


def _check_url(url: str) -> str:
    if len(url) > MAX_URL_CHARS:
        raise BadModelSource(f"URL is {len(url)} characters; the most is {MAX_URL_CHARS}")
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise BadModelSource(f"{url[:200]!r}: expected an https:// URL with a host")
    if not url.isprintable() or " " in url:
        raise BadModelSource(f"{url[:200]!r}: URL holds spaces or control characters")
    return url


def _file_from_url(url: str) -> str:
    name = urlsplit(url).path.rsplit("/", 1)[-1]
    if not _FILE_NAME.fullmatch(name) or not name.endswith(".gguf"):
        raise BadModelSource(f"{url[:200]!r}: the URL must end in a .gguf file name")
    return name


def resolve_remote(ref: str, catalogue: Mapping[str, CatalogueEntry], hub: str = DEFAULT_HUB) -> RemoteModel:
    """A catalogue name, ``hf://`` reference or URL → :class:`RemoteModel`. An ``ID=URL`` form sets the
    served id. :class:`BadModelSource` for anything else (the message lists what is accepted)."""
    entry = catalogue.get(ref)
    if entry is not None:
        urls = tuple(_check_url(hf_url(s, hub)[0] if s.startswith("hf://") else s) for s in entry.sources)
        return RemoteModel(
            entry.name,
            urls,
            entry.file,
            entry.size_bytes,
            entry.sha256,
            hub=any(s.startswith("hf://") for s in entry.sources),
            approx_bytes=int(entry.approx_gb * 1e9) if entry.approx_gb and entry.size_bytes is None else None,
        )
    model_id = None
    if "=" in ref.split("://", 1)[0]:
        model_id, ref = ref.split("=", 1)
    if ref.startswith("hf://"):
        url, file = hf_url(ref, hub)
        hub_source = True
    elif ref.startswith(("https://", "http://")):
        url, file, hub_source = _check_url(ref), _file_from_url(ref), False
    else:
        names = ", ".join(sorted(catalogue)) or "none"
        raise BadModelSource(
            f"model {ref!r:.80} is not in the catalogue ({names}), a .gguf file, "
            f"hf://OWNER/REPO[@REV]/FILE or an https:// URL"
        )
    try:
        served = check_model_id(model_id if model_id is not None else file[: -len(".gguf")])
    except InvalidModelId as exc:
        raise BadModelSource(str(exc)) from None
    return RemoteModel(served, (_check_url(url),), file, hub=hub_source)


def projector_remote(entry: CatalogueEntry, hub: str = DEFAULT_HUB) -> RemoteModel:
    """The projector of the catalogue entry ``entry`` (which has one), cached as ``NAME.mmproj``."""
    urls = tuple(_check_url(hf_url(s, hub)[0] if s.startswith("hf://") else s) for s in entry.mmproj_sources)
    approx = entry.mmproj_approx_gb
    return RemoteModel(
        entry.projector_id,
        urls,
        entry.mmproj_file,
        entry.mmproj_size_bytes,
        entry.mmproj_sha256,
        hub=any(s.startswith("hf://") for s in entry.mmproj_sources),
        approx_bytes=int(approx * 1e9) if approx and entry.mmproj_size_bytes is None else None,
    )


def resolve_projector(ref: str, catalogue: Mapping[str, CatalogueEntry], hub: str = DEFAULT_HUB) -> RemoteModel:
    """A ``--mmproj`` value that is not a local file → :class:`RemoteModel`: a catalogue name (that
    entry's projector), ``hf://OWNER/REPO[@REV]/FILE`` or an https:// URL. A URL's projector is cached
    as its file's stem plus 8 hex digits of the URL's sha256: projector files often share a name
    (``mmproj-model-f16.gguf``) across repositories, and one must never stand for another."""
    entry = catalogue.get(ref)
    if entry is not None:
        if not entry.has_projector:
            with_one = ", ".join(sorted(n for n, e in catalogue.items() if e.has_projector)) or "none"
            raise BadModelSource(
                f"--mmproj {ref}: the catalogue entry has no projector (entries with one: {with_one}); "
                f"give a projector GGUF file or hf://OWNER/REPO[@REV]/FILE"
            )
        return projector_remote(entry, hub)
    if ref.startswith("hf://"):
        url, file = hf_url(ref, hub)
        hub_source = True
    elif ref.startswith(("https://", "http://")):
        url, file, hub_source = _check_url(ref), _file_from_url(ref), False
    else:
        raise BadModelSource(
            f"--mmproj {ref!r:.80}: not a file, a catalogue name with a projector, hf://OWNER/REPO[@REV]/FILE "
            f"or an https:// URL"
        )
    tag = hashlib.sha256(url.encode()).hexdigest()[:8]
    stem = file[: -len(".gguf")][: MAX_MODEL_ID_CHARS - len(tag) - 1]
    return RemoteModel(f"{stem}-{tag}", (_check_url(url),), file, hub=hub_source)
