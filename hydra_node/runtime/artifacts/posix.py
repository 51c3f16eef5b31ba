"""Artifacts on a POSIX root (a local folder, an NFS or VAST DataSpace mount), published atomically.

Layout (docs/placement.md)::

    ROOT/.staging/VID/                    a publish in progress (swept after STALE_STAGING_S)
    ROOT/.trash/…                         a removal in progress
    ROOT/KIND/NAME/current -> VID         the committed version (a symlink, replaced by rename)
    ROOT/KIND/NAME/VID/manifest.cbor      the signed manifest (manifest.json: the same, for humans)
    ROOT/KIND/NAME/VID/files/PATH         the artifact's files

Publishing copies the files into ``.staging/VID/files`` (hashing the copy), fsyncs them, builds
and signs the manifest, writes it, fsyncs the folders, renames the staging folder to
``KIND/NAME/VID`` (a new name: a rename onto a fresh path is atomic), then points ``current``
at it (a new symlink renamed over the old one) and fsyncs the folder. Readers only ever follow
``current``, so they see the previous complete version or the new one. The version before the
new one is kept (a reader may still be copying it); older ones are removed, and versions that
never became current (a crashed publisher) once they are stale. :func:`store.crash_point` marks
each stage: ``staging_created``, ``file_copied``, ``files_staged``, ``manifest_written``,
``version_moved``, ``pointer_switched``.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hydra_node.runtime.artifacts.errors import (
    ArtifactError,
    ArtifactNotFound,
    ChecksumMismatch,
    InvalidRequest,
    ManifestInvalid,
    NamespaceTampered,
    SourceInvalid,
    StoreUnavailable,
)
from hydra_node.runtime.artifacts.filecopy import check_copy, copy_hashed
from hydra_node.runtime.artifacts.manifest import (
    KINDS,
    MAX_MANIFEST_BYTES,
    ArtifactFile,
    Manifest,
    validate_kind,
    validate_path,
)
from hydra_node.runtime.artifacts.store import (
    STALE_STAGING_S,
    Progress,
    Signer,
    StagedDirectory,
    Trust,
    check_manifest,
    check_request,
    crash_point,
    fsync_dir,
    remove_entry,
    sweep_stale_fd,
    wrap_os_error,
)

__all__ = ["FETCH_ATTEMPTS", "PUBLISH_STAGES", "PosixStore"]

log = logging.getLogger("hydra.placement.posix")

PUBLISH_STAGES = (
    "staging_created",
    "file_copied",
    "files_staged",
    "manifest_written",
    "version_moved",
    "pointer_switched",
)
#: Reads of ``current`` a fetch makes when a concurrent publish removes the version it was copying.
FETCH_ATTEMPTS = 3
MANIFEST_FILE = "manifest.cbor"
MANIFEST_JSON = "manifest.json"
FILES_DIR = "files"
CURRENT = "current"
_VID = re.compile(r"v[0-9]{15}-[0-9a-f]{8}")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class PosixStore:
    """An :class:`~hydra_node.runtime.artifacts.store.ArtifactStore` on the folder ``root`` (which must exist)."""

    def __init__(
        self, root: Path, *, stale_after_s: float = STALE_STAGING_S, clock: Callable[[], float] = time.time
    ) -> None:
        self.root = Path(os.path.abspath(root))
        self.location = f"posix:{self.root}"
        self.stale_after_s = stale_after_s
        self._clock = clock

    def __repr__(self) -> str:
        return f"PosixStore({str(self.root)!r})"

    # ---- publishing ------------------------------------------------------------------------
    def publish(
        self,
        kind: str,
        name: str,
        files: Mapping[str, Path],
        *,
        identity: Mapping[str, Any],
        sign: Signer,
        progress: Progress | None = None,
    ) -> Manifest:
        """Copy ``files`` (artifact path → source file) in as a new version of ``kind``/``name``, signed by ``sign``."""
        check_request(kind, name)
        now = int(self._clock())
        try:  # every bound (file count, paths, identity) is checked before a byte is copied
            sources = self._check_sources(files)
            Manifest(
                kind,
                name,
                tuple(ArtifactFile(p, os.stat(src).st_size, "0" * 64) for p, src in sources.items()),
                identity,
                self.location,
                now,
            )
        except ManifestInvalid as exc:
            raise InvalidRequest(exc.message) from None
        except OSError as exc:
            raise SourceInvalid(f"cannot read {exc.filename}: {exc.strerror}") from None

        def finish(staged: list[ArtifactFile]) -> Manifest:
            signed = sign(Manifest(kind, name, tuple(staged), identity, self.location, now))
            signed.verify()  # a signer that does not sign is our bug: never commit an unverifiable manifest
            return signed

        return self._install(kind, name, sources, finish, progress)

    def adopt(
        self, manifest: Manifest, source_dir: Path, *, progress: Progress | None = None, trust: Trust | None = None
    ) -> Manifest:
        """Install an artifact published elsewhere, unchanged (its manifest keeps its publisher's
        signature): the files under ``source_dir`` must match it exactly."""
        check_manifest(manifest, manifest.kind, manifest.name, trust)
        sources = {f.path: Path(source_dir) / f.path for f in manifest.files}
        by_path = {f.path: f for f in manifest.files}

        def finish(staged: list[ArtifactFile]) -> Manifest:
            for got in staged:
                check_copy(by_path[got.path], got.size, got.sha256)
            return manifest

        return self._install(manifest.kind, manifest.name, sources, finish, progress)

    def _check_sources(self, files: Mapping[str, Path]) -> dict[str, Path]:
        if not isinstance(files, Mapping) or not files:
            raise SourceInvalid("an artifact needs at least one file")
        out = {}
        for path, src in files.items():
            validate_path(path)
            try:
                st = os.stat(src)
            except OSError as exc:
                raise SourceInvalid(f"cannot read {src} for {path}: {exc.strerror}") from None
            if not os.path.isfile(src) or st.st_size < 0:
                raise SourceInvalid(f"{src} (for {path}) is not a regular file")
            out[path] = Path(src)
        return out

    def _install(
        self,
        kind: str,
        name: str,
        sources: dict[str, Path],
        finish: Callable[[list[ArtifactFile]], Manifest],
        progress: Progress | None,
    ) -> Manifest:
        self._check_root()
        vid = f"v{int(self._clock() * 1000):015d}-{secrets.token_hex(4)}"
        staging = self.root / ".staging" / vid
        staging_fd = name_fd = -1
        created = False
        try:
            try:
                staging_fd = self._open_dir(".staging", create=True)
                sweep_stale_fd(staging_fd, "v", self._clock(), self.stale_after_s)
                self._sweep_trash()
                os.mkdir(vid, dir_fd=staging_fd)
                created = True
                crash_point("staging_created")
                manifest = self._stage(staging, sources, finish, progress)
                self._write_manifest(staging, manifest)
                _fsync_folders(staging)
                crash_point("manifest_written")
                name_dir = self.root / kind / name
                name_fd = self._open_dir(kind, name, create=True)
                os.rename(vid, vid, src_dir_fd=staging_fd, dst_dir_fd=name_fd)
                created = False
                os.fsync(name_fd)
                os.fsync(staging_fd)
                crash_point("version_moved")
                try:
                    previous = self._current_vid(name_dir)
                except ManifestInvalid:  # a pointer we did not write: the new one replaces it
                    previous = None
                self._point_current(name_fd, vid)
                crash_point("pointer_switched")
            except BaseException as exc:  # whatever failed (the signer included), no staging folder is left
                if created:
                    try:
                        remove_entry(staging_fd, vid)
                    except OSError:
                        pass
                if isinstance(exc, OSError):
                    raise wrap_os_error(f"cannot publish {kind}/{name} under {self.root}", exc) from None
                raise
            self._remove_old_versions(name_fd, name_dir, vid, previous)
        finally:
            for fd in (staging_fd, name_fd):
                if fd >= 0:
                    os.close(fd)
        log.info(
            "event=artifact_published kind=%s name=%s version=%s bytes=%d files=%d",
            kind,
            name,
            vid,
            manifest.size,
            len(manifest.files),
        )
        return manifest

    def _open_dir(self, *parts: str, create: bool = False) -> int:
        """A descriptor of the folder ``ROOT/PART/…``, each part opened relative to the one before
        with ``O_NOFOLLOW | O_DIRECTORY`` (made first when ``create``). The root is the operator's
        and may be a link; a link (or anything not a folder) planted at a part is refused with
        :class:`NamespaceTampered`, so sweeps, renames and deletes never leave the namespace."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for i, part in enumerate(parts):
                if create:
                    try:
                        os.mkdir(part, dir_fd=fd)
                    except FileExistsError:
                        pass
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise self._tampered(self.root.joinpath(*parts[: i + 1]), "is not a folder") from None
                    raise
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _tampered(self, path: Path, what: str) -> NamespaceTampered:
        try:
            if os.path.islink(path):
                what = f"is a symbolic link (to {os.readlink(path)!r:.200})"
        except OSError:
            pass
        log.warning("event=namespace_tampered path=%s problem=%r", path, what)
        return NamespaceTampered(f"{path} {what}: refused, nothing is swept or deleted through it")

    def _sweep_trash(self) -> None:
        try:
            fd = self._open_dir(".trash")
        except FileNotFoundError:
            return
        try:
            sweep_stale_fd(fd, "", self._clock(), 0.0)
        finally:
            os.close(fd)

    def _stage(
        self,
        staging: Path,
        sources: dict[str, Path],
        finish: Callable[[list[ArtifactFile]], Manifest],
        progress: Progress | None,
    ) -> Manifest:
        staged: list[ArtifactFile] = []
        done = 0
        for path, src in sorted(sources.items()):
            dst = staging / FILES_DIR / path
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                size, digest = copy_hashed(src, dst, progress=progress, base=done)
            except FileNotFoundError:
                raise SourceInvalid(f"{src} (for {path}) disappeared while publishing") from None
            staged.append(ArtifactFile(path, size, digest))
            done += size
            if len(staged) == 1:
                crash_point("file_copied")
        crash_point("files_staged")
        return finish(staged)

    def _write_manifest(self, folder: Path, manifest: Manifest) -> None:
        for file_name, data in ((MANIFEST_FILE, manifest.to_cbor()), (MANIFEST_JSON, manifest.to_json().encode())):
            with open(folder / file_name, "xb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())

    def _point_current(self, name_fd: int, vid: str) -> None:
        tmp = f".current-{secrets.token_hex(6)}"
        os.symlink(vid, tmp, dir_fd=name_fd)
        try:
            os.replace(tmp, CURRENT, src_dir_fd=name_fd, dst_dir_fd=name_fd)
        except OSError:
            try:
                os.unlink(tmp, dir_fd=name_fd)
            except FileNotFoundError:
                pass
            raise
        os.fsync(name_fd)

    def _remove_old_versions(self, name_fd: int, name_dir: Path, vid: str, previous: str | None) -> None:
        """Keep ``current`` and the version it replaced (a reader may still be copying it), and
        versions newer than ``current`` until they are stale (another node may be publishing one);
        remove the rest. Best effort: a failure leaves a folder for the next publish. Everything
        goes through ``name_fd``; a link planted as a version is logged and left alone."""
        try:
            current = os.readlink(CURRENT, dir_fd=name_fd)
            if not _VID.fullmatch(current):
                current = vid
            versions = [e for e in os.listdir(name_fd) if _VID.fullmatch(e)]
        except OSError:
            return
        now = self._clock()
        for v in versions:
            if v in (current, previous):
                continue
            try:
                st = os.stat(v, dir_fd=name_fd, follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode):
                self._tampered(name_dir / v, "is not a folder")
                continue
            if v > current and now - st.st_mtime < self.stale_after_s:
                continue
            shutil.rmtree(v, dir_fd=name_fd, ignore_errors=True)
        sweep_stale_fd(name_fd, ".current-", now, self.stale_after_s)

    # ---- reading ---------------------------------------------------------------------------
    def _check_root(self) -> None:
        if not self.root.is_dir():
            raise StoreUnavailable(f"the POSIX root {self.root} is not a folder (is the namespace mounted?)")

    def _current_vid(self, name_dir: Path) -> str | None:
        try:
            vid = os.readlink(name_dir / CURRENT)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise wrap_os_error(f"cannot read {name_dir / CURRENT}", exc) from None
        if not _VID.fullmatch(vid):
            raise ManifestInvalid(f"{name_dir / CURRENT} points at {vid!r:.80}, which is not a version of this store")
        return vid

    def _current_dir(self, kind: str, name: str) -> Path | None:
        check_request(kind, name)
        self._check_root()
        name_dir = self.root / kind / name
        vid = self._current_vid(name_dir)
        return None if vid is None else name_dir / vid

    def _read_manifest(self, vdir: Path) -> Manifest:
        try:
            with open(vdir / MANIFEST_FILE, "rb") as f:
                data = f.read(MAX_MANIFEST_BYTES + 1)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise wrap_os_error(f"cannot read {vdir / MANIFEST_FILE}", exc) from None
        return Manifest.from_cbor(data)

    def manifest(self, kind: str, name: str) -> Manifest | None:
        """The committed manifest of ``kind``/``name``, signature verified; None when there is none."""
        for _ in range(FETCH_ATTEMPTS):
            vdir = self._current_dir(kind, name)
            if vdir is None:
                return None
            try:
                return check_manifest(self._read_manifest(vdir), kind, name, None)
            except FileNotFoundError:
                continue  # replaced and removed between the two reads
        raise StoreUnavailable(f"{kind}/{name} changed {FETCH_ATTEMPTS} times while being read")

    def open_artifact(self, kind: str, name: str) -> tuple[Manifest, Path] | None:
        """The committed manifest (verified) and the folder of its files, for a holder streaming them
        (``peer.LocalArtifacts``); None when there is none. The folder stays for one more publish."""
        for _ in range(FETCH_ATTEMPTS):
            vdir = self._current_dir(kind, name)
            if vdir is None:
                return None
            try:
                return check_manifest(self._read_manifest(vdir), kind, name, None), vdir / FILES_DIR
            except FileNotFoundError:
                continue
        raise StoreUnavailable(f"{kind}/{name} changed {FETCH_ATTEMPTS} times while being read")

    def list(self, kind: str | None = None) -> list[Manifest]:
        """Every committed artifact (of ``kind``), by kind then name; unreadable ones are logged and skipped."""
        kinds = KINDS if kind is None else (validate_kind(kind),)
        self._check_root()
        found = []
        for k in kinds:
            try:
                names = sorted(e for e in os.listdir(self.root / k) if not e.startswith("."))
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise wrap_os_error(f"cannot list {self.root / k}", exc) from None
            for n in names:
                try:
                    manifest = self.manifest(k, n)
                except ArtifactError as exc:
                    log.warning(
                        "event=artifact_unreadable kind=%s name=%s code=%s error=%r", k, n, exc.code, exc.message
                    )
                    continue
                if manifest is not None:
                    found.append(manifest)
        return found

    def fetch(
        self, kind: str, name: str, dest: Path, *, progress: Progress | None = None, trust: Trust | None = None
    ) -> Manifest:
        """Materialise the committed ``kind``/``name`` into the folder ``dest``, every file verified."""
        last = None
        for _ in range(FETCH_ATTEMPTS):
            vdir = self._current_dir(kind, name)
            if vdir is None:
                raise ArtifactNotFound(f"no {kind} named {name} under {self.root}")
            try:
                manifest = check_manifest(self._read_manifest(vdir), kind, name, trust)
                self._copy_out(vdir, manifest, Path(dest), progress)
                return manifest
            except FileNotFoundError as exc:
                if self._current_dir(kind, name) == vdir:  # not a concurrent publish: the version is broken
                    raise ChecksumMismatch(f"{kind}/{name}: {exc.filename} is missing") from None
                last = exc
        raise StoreUnavailable(f"{kind}/{name} changed {FETCH_ATTEMPTS} times while being fetched ({last})")

    def _copy_out(self, vdir: Path, manifest: Manifest, dest: Path, progress: Progress | None) -> None:
        done = 0
        try:
            with StagedDirectory(dest, clock=self._clock) as staging:
                for f in manifest.files:
                    out = staging / f.path
                    out.parent.mkdir(parents=True, exist_ok=True)
                    size, digest = copy_hashed(
                        vdir / FILES_DIR / f.path, out, limit=f.size, progress=progress, base=done
                    )
                    check_copy(f, size, digest)
                    done += size
        except (FileNotFoundError, ArtifactError):
            raise
        except OSError as exc:
            raise wrap_os_error(f"cannot fetch {manifest.kind}/{manifest.name} into {dest}", exc) from None

    def remove(self, kind: str, name: str) -> bool:
        """Remove every version of ``kind``/``name`` (it disappears at once: one rename); False if absent."""
        check_request(kind, name)
        self._check_root()
        trash_fd = kind_fd = -1
        try:
            trash_fd = self._open_dir(".trash", create=True)
            kind_fd = self._open_dir(kind)
            gone = f"{kind}-{name}-{secrets.token_hex(6)}"
            os.rename(name, gone, src_dir_fd=kind_fd, dst_dir_fd=trash_fd)
            os.fsync(kind_fd)
            try:
                remove_entry(trash_fd, gone)
            except OSError:
                pass  # the next publish's sweep of .trash finishes it
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise wrap_os_error(f"cannot remove {kind}/{name} under {self.root}", exc) from None
        finally:
            for fd in (trash_fd, kind_fd):
                if fd >= 0:
                    os.close(fd)
        log.info("event=artifact_removed kind=%s name=%s", kind, name)
        return True


def _fsync_folders(root: Path) -> None:
    for folder, _, _ in sorted(os.walk(root), key=lambda t: -len(t[0])):
        fsync_dir(Path(folder))
