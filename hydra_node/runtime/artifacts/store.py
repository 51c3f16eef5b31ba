"""What every artifact store offers (:class:`ArtifactStore`) and the pieces the stores share.

Every method is a plain blocking function; trio code calls it through ``trio.to_thread.run_sync``.

* ``publish`` is atomic: a reader sees the previous complete artifact or the new one, never half.
* ``fetch`` materialises into ``dest`` through a staging sibling (:class:`StagedDirectory`) and a
  rename, verifying every file's size and sha256 and the manifest's signature (and ``trust`` of
  its node when given); on any error nothing is left at ``dest`` (a previous ``dest`` stays).
* ``progress(done)`` is called with the bytes handled so far in that call.

:func:`crash_point` lets the crash tests kill a publishing process at each stage boundary
(docs/placement.md lists the stages of each store).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from hydra_node.runtime.artifacts.errors import (
    ArtifactError,
    InvalidRequest,
    ManifestInvalid,
    SignatureInvalid,
    StoreUnavailable,
)
from hydra_node.runtime.artifacts.manifest import Manifest, validate_kind, validate_name

__all__ = [
    "CRASH_ENV",
    "STALE_STAGING_S",
    "ArtifactStore",
    "Progress",
    "Signer",
    "StagedDirectory",
    "Trust",
    "check_manifest",
    "check_request",
    "crash_point",
    "fsync_dir",
    "remove_entry",
    "sweep_stale",
    "sweep_stale_fd",
    "wrap_os_error",
]

Progress = Callable[[int], None]
Signer = Callable[[Manifest], Manifest]
Trust = Callable[[str], bool]

#: The test-only environment variable naming the stage at which :func:`crash_point` kills the process.
CRASH_ENV = "HYDRA_TEST_CRASH_AT"
#: Age after which a staging directory left by a crashed process is removed (no live transfer of
#: one artifact lasts an hour without touching its staging directory's files).
STALE_STAGING_S = 3600.0


@runtime_checkable
class ArtifactStore(Protocol):
    """A place artifacts are published to and fetched from (``posix.PosixStore``, ``s3.S3Store``)."""

    location: str

    def publish(
        self,
        kind: str,
        name: str,
        files: Mapping[str, Path],
        *,
        identity: Mapping[str, Any],
        sign: Signer,
        progress: Progress | None = None,
    ) -> Manifest: ...

    def fetch(
        self, kind: str, name: str, dest: Path, *, progress: Progress | None = None, trust: Trust | None = None
    ) -> Manifest: ...

    def manifest(self, kind: str, name: str) -> Manifest | None: ...

    def list(self, kind: str | None = None) -> list[Manifest]: ...

    def remove(self, kind: str, name: str) -> bool: ...


def crash_point(stage: str) -> None:
    """Kill this process with SIGKILL when ``HYDRA_TEST_CRASH_AT`` names ``stage`` (crash tests only)."""
    if os.environ.get(CRASH_ENV) == stage:
        os.kill(os.getpid(), signal.SIGKILL)


def check_manifest(manifest: Manifest, kind: str, name: str, trust: Trust | None) -> Manifest:
    """The manifest of ``kind``/``name``, signed by a node ``trust`` accepts, or the typed error."""
    if (manifest.kind, manifest.name) != (kind, name):
        raise ManifestInvalid(f"the manifest found for {kind}/{name} describes {manifest.kind}/{manifest.name}")
    manifest.verify()
    if trust is not None and not trust(manifest.node_id):
        raise SignatureInvalid(f"{kind}/{name} is signed by node {manifest.node_id[:16]}, which is not trusted")
    return manifest


def check_request(kind: str, name: str) -> None:
    """:class:`InvalidRequest` unless ``kind`` is a kind and ``name`` a valid artifact name."""
    try:
        validate_kind(kind)
        validate_name(name)
    except ManifestInvalid as exc:
        raise InvalidRequest(exc.message) from None


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sweep_stale(directory: Path, prefix: str, now: float, stale_after_s: float = STALE_STAGING_S) -> int:
    """Remove the entries of ``directory`` starting with ``prefix`` untouched for ``stale_after_s``;
    how many went. Errors are skipped (another process may be sweeping the same entry). The
    removals go through the folder's descriptor (:func:`sweep_stale_fd`)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        return sweep_stale_fd(fd, prefix, now, stale_after_s)
    finally:
        os.close(fd)


def sweep_stale_fd(dir_fd: int, prefix: str, now: float, stale_after_s: float = STALE_STAGING_S) -> int:
    """:func:`sweep_stale` in the folder open as ``dir_fd``: every look-up and removal is relative
    to it and follows no symbolic link (a link is removed, never what it points at)."""
    removed = 0
    try:
        with os.scandir(dir_fd) as it:
            entries = list(it)
    except OSError:
        return 0
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        try:
            if now - entry.stat(follow_symlinks=False).st_mtime < stale_after_s:
                continue
            remove_entry(dir_fd, entry.name)
            removed += 1
        except OSError:
            continue
    return removed


def remove_entry(dir_fd: int, name: str) -> None:
    """Remove ``name`` of the folder open as ``dir_fd``: a real folder with its whole subtree
    (``shutil.rmtree``'s descriptor-based walk, which follows no link), anything else (a symbolic
    link included) with ``unlink``."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)


class StagedDirectory:
    """``dest`` built in a staging sibling and renamed into place on success; removed on failure.

    ``with StagedDirectory(dest) as staging: ...write files under staging...`` (the writer fsyncs
    each file it writes) — on a clean exit every folder is fsynced, a previous ``dest`` is moved aside, the staging folder is
    renamed to ``dest`` and the previous one removed (a reader of ``dest`` sees the old
    directory, the new one, or for an instant none, never a half-written one). Stale staging
    siblings of ``dest`` left by a killed process are swept (by age) on entry."""

    PREFIX = ".staging-"

    def __init__(self, dest: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.dest = Path(dest)
        self._clock = clock
        self.path = self.dest.parent / f".{self.dest.name}{self.PREFIX}{secrets.token_hex(6)}"

    def __enter__(self) -> Path:
        try:
            self.dest.parent.mkdir(parents=True, exist_ok=True)
            sweep_stale(self.dest.parent, f".{self.dest.name}{self.PREFIX}", self._clock())
            self.path.mkdir()
        except OSError as exc:
            raise StoreUnavailable(f"cannot create a staging folder beside {self.dest}: {exc.strerror}") from None
        return self.path

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        try:
            _fsync_tree(self.path)
            self._move_into_place()
        except OSError as error:
            shutil.rmtree(self.path, ignore_errors=True)
            raise StoreUnavailable(f"cannot move the fetched artifact to {self.dest}: {error.strerror}") from None

    def _move_into_place(self) -> None:
        aside = None
        if self.dest.exists() or self.dest.is_symlink():
            aside = self.dest.parent / f".{self.dest.name}{self.PREFIX}old-{secrets.token_hex(6)}"
            os.rename(self.dest, aside)
        try:
            os.rename(self.path, self.dest)
        except OSError:
            if aside is not None:
                os.rename(aside, self.dest)
            raise
        fsync_dir(self.dest.parent)
        if aside is not None:
            if aside.is_dir() and not aside.is_symlink():
                shutil.rmtree(aside, ignore_errors=True)
            else:
                aside.unlink(missing_ok=True)


def _fsync_tree(root: Path) -> None:
    """fsync every folder under ``root``, deepest first (the files were fsynced by their writer)."""
    folders = [Path(d) for d, _, _ in os.walk(root)]
    for folder in reversed(folders):
        fsync_dir(folder)


def wrap_os_error(what: str, exc: OSError) -> ArtifactError:
    """The typed error for an OS error while touching a store."""
    return StoreUnavailable(f"{what}: {exc.strerror or exc}")
