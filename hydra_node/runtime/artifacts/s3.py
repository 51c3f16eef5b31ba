"""S3-compatible artifact store (blocking; trio code calls it through ``trio.to_thread.run_sync``).

Layout in the bucket, under the store's prefix ``P`` (docs/placement.md, "S3")::

    P{kind}/{name}/manifest.cbor        the pointer: the signed manifest of the committed version
    P{kind}/{name}/v/{version}/{path}   the files of one version (``version`` sorts by time)

Publish uploads every file under a fresh version prefix (boto3's transfer manager: multipart
above ``multipart_threshold``, sha256 computed while it reads), signs the manifest, and writes
the pointer LAST: one conditional PUT (``If-Match`` the pointer it read, so a racing older
publish never replaces a newer one), which S3 makes visible whole or not at all. Readers follow only the
pointer, so a crash at any stage leaves the previous complete artifact or the new one; the
versions older than the committed one (and leftovers of crashed publishes) are deleted after
the switch. Fetch verifies the signature, then every object's size and sha256 while it is
written into a staging directory beside ``dest``, and renames it into place.

Credentials come from boto3's default chain (environment, profile, instance role); endpoint and
region from ``[placement]``. Request signing, retries and multipart are boto3's.
"""

from __future__ import annotations

import builtins
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hydra_node.runtime.artifacts.errors import (
    ArtifactError,
    ArtifactNotFound,
    ChecksumMismatch,
    ManifestInvalid,
    StoreUnavailable,
)
from hydra_node.runtime.artifacts.manifest import (
    MAX_MANIFEST_BYTES,
    ArtifactFile,
    Manifest,
    validate_kind,
    validate_name,
    validate_path,
)
from hydra_node.runtime.artifacts.s3_io import (
    S3_ERRORS,
    HashingReader,
    HashingWriter,
    error_code,
    store_error,
)
from hydra_node.runtime.artifacts.store import (
    Progress,
    StagedDirectory,
    Trust,
    check_manifest,
    crash_point,
)

__all__ = ["DEFAULT_MULTIPART_THRESHOLD", "DEFAULT_PART_SIZE", "POINTER", "S3_STAGES", "S3Store"]

#: Files above this go up in parts (boto3's default); S3 takes parts of 5 MiB … 5 GiB, at most 10,000.
DEFAULT_MULTIPART_THRESHOLD = 8 * 1024 * 1024
#: Size of one part (boto3 raises it when a file would need more than 10,000 parts).
DEFAULT_PART_SIZE = 8 * 1024 * 1024
#: Parts in flight at once per file (boto3's default; each holds one part in memory).
DEFAULT_CONCURRENCY = 10
#: Parts held in memory per transfer (s3transfer's ``max_in_memory_upload_chunks`` and
#: ``max_in_memory_download_chunks``): a download writes (and hashes) in order, so a range that
#: arrives early waits in memory; 10 parts of 8 MiB = 80 MiB at most each way.
MAX_IN_MEMORY_PARTS = 10
#: Attempts per request in botocore's "standard" retry mode (throttling, 5xx, broken connections).
DEFAULT_MAX_ATTEMPTS = 3
#: The pointer object's name under ``P{kind}/{name}/``.
POINTER = "manifest.cbor"
#: Conditional pointer writes tried before a publish gives up on a pointer that keeps changing.
POINTER_ATTEMPTS = 5
#: Keys per DeleteObjects request (the S3 limit).
DELETE_BATCH = 1000
#: Crash-test stages of a publish, in order (``store.crash_point``; docs/placement.md).
S3_STAGES = ("s3.object_uploaded", "s3.objects_uploaded", "s3.pointer_written", "s3.collected")

_VERSION = re.compile(r"[0-9]{20}-[0-9a-f]{8}")

log = logging.getLogger("hydra.placement")


class S3Store:
    """An :class:`~hydra_node.runtime.artifacts.store.ArtifactStore` on an S3-compatible bucket."""

    def __init__(
        self,
        bucket: str,
        *,
        endpoint: str | None = None,
        region: str | None = None,
        prefix: str = "",
        multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
        part_size: int = DEFAULT_PART_SIZE,
        max_concurrency: int = DEFAULT_CONCURRENCY,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        import boto3.session
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        if not bucket or "/" in bucket:
            raise ValueError(f"an S3 bucket name is one non-empty segment, not {bucket!r}")
        prefix = prefix.strip("/")
        if prefix.startswith(".") or ".." in prefix.split("/"):
            raise ValueError(f"S3 prefix {prefix!r} must not hold '..' segments")
        if multipart_threshold < 1 or part_size < 1 or max_concurrency < 1 or max_attempts < 1:
            raise ValueError("multipart_threshold, part_size, max_concurrency and max_attempts must be >= 1")
        self.bucket = bucket
        self.endpoint = endpoint or None
        self.region = region or None
        self.prefix = f"{prefix}/" if prefix else ""
        self.location = f"s3://{bucket}/{prefix}".rstrip("/")
        self._clock = clock
        self._unconditional = False  # set once the store answered 501 to a conditional PUT
        config = Config(
            s3={"addressing_style": "path"} if self.endpoint else {},
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            retries={"max_attempts": max_attempts, "mode": "standard"},
            max_pool_connections=max_concurrency + 2,
        )
        try:
            self._client = boto3.session.Session().client(
                "s3", endpoint_url=self.endpoint, region_name=self.region, config=config
            )
        except (*S3_ERRORS, ValueError) as exc:  # a malformed endpoint URL, an unknown profile ...
            raise store_error(exc, what="open the S3 client", bucket=bucket, endpoint=self._where()) from None
        self._transfer = TransferConfig(
            multipart_threshold=multipart_threshold,
            multipart_chunksize=part_size,
            max_concurrency=max_concurrency,
            use_threads=True,
        )
        self._transfer.max_in_memory_upload_chunks = MAX_IN_MEMORY_PARTS
        self._transfer.max_in_memory_download_chunks = MAX_IN_MEMORY_PARTS

    # ---- publish -------------------------------------------------------------------------------------
    def publish(
        self,
        kind: str,
        name: str,
        files: Mapping[str, Path],
        *,
        identity: Mapping[str, Any],
        sign: Callable[[Manifest], Manifest],
        progress: Progress | None = None,
    ) -> Manifest:
        """Upload ``files`` (relative path → local file) as the new version of ``kind/name``, commit it
        by writing its signed manifest to the pointer, delete older versions; the signed manifest."""
        validate_kind(kind)
        validate_name(name)
        if not files:
            raise ManifestInvalid(f"{kind}/{name}: an artifact has at least one file")
        sources = {validate_path(path): Path(src) for path, src in files.items()}
        for src in sources.values():
            if not src.is_file():
                raise ArtifactNotFound(f"{kind}/{name}: {src} is not a file to publish")
        base = self._base(kind, name)
        version = f"{int(self._clock() * 1e9):020d}-{secrets.token_hex(4)}"
        vprefix = f"{base}v/{version}/"
        location = f"s3://{self.bucket}/{vprefix.rstrip('/')}"
        # Every rule of the manifest (paths that nest, the identity, the location) checked before any upload.
        Manifest(kind, name, tuple(ArtifactFile(p, 0, "0" * 64) for p in sources), identity, location, 0)
        counter = _Counter(progress)
        try:
            entries = []
            for path in sorted(sources):
                entries.append(self._upload(sources[path], vprefix, path, counter))
                crash_point("s3.object_uploaded")
            crash_point("s3.objects_uploaded")
            unsigned = Manifest(kind, name, tuple(entries), identity, location, int(self._clock()))
            signed = sign(unsigned)
            signed.verify()
            current, etag = self._committed_state(kind, name)
            _check_not_newer(kind, name, current, version)
        except BaseException:
            self._delete_prefix(vprefix, quiet=True)  # nothing points at it yet
            raise
        self._commit_pointer(kind, name, version, signed, etag)
        crash_point("s3.pointer_written")
        self._collect(base, older_than=version)
        crash_point("s3.collected")
        return signed

    def _upload(self, src: Path, vprefix: str, path: str, counter: _Counter) -> ArtifactFile:
        what = f"upload {src} to s3://{self.bucket}/{vprefix}{path}"
        try:
            with open(src, "rb") as f:
                reader = HashingReader(f)
                self._client.upload_fileobj(
                    reader, self.bucket, vprefix + path, Config=self._transfer, Callback=counter.add
                )
                size_now = os.fstat(f.fileno()).st_size
        except S3_ERRORS as exc:
            raise store_error(exc, what=what, bucket=self.bucket, endpoint=self._where()) from None
        if size_now != reader.size:
            raise ChecksumMismatch(
                f"{src} changed while it was uploaded ({reader.size} bytes read, {size_now} now); publish it again"
            )
        return ArtifactFile(path, reader.size, reader.hexdigest())

    # ---- fetch ---------------------------------------------------------------------------------------
    def fetch(
        self, kind: str, name: str, dest: Path, *, progress: Progress | None = None, trust: Trust | None = None
    ) -> Manifest:
        """Materialise the committed ``kind/name`` as directory ``dest`` after checking its signature,
        its signer (``trust``) and every file's size and sha256; nothing is left at ``dest`` otherwise."""
        manifest = self._read_manifest(kind, name)
        if manifest is None:
            raise ArtifactNotFound(f"{kind}/{name}: not published in {self.location}")
        check_manifest(manifest, kind, name, trust)
        vprefix = self._version_prefix(manifest)
        counter = _Counter(progress)
        with StagedDirectory(Path(dest), clock=self._clock) as staging:
            for entry in manifest.files:
                self._download(manifest, entry, vprefix, staging, counter)
        return manifest

    def _download(
        self, manifest: Manifest, entry: ArtifactFile, vprefix: str, staging: Path, counter: _Counter
    ) -> None:
        target = staging.joinpath(*entry.path.split("/"))
        target.parent.mkdir(parents=True, exist_ok=True)
        what = f"download s3://{self.bucket}/{vprefix}{entry.path}"
        try:
            with open(target, "wb") as f:
                writer = HashingWriter(f, limit=entry.size)
                self._client.download_fileobj(
                    self.bucket, vprefix + entry.path, writer, Config=self._transfer, Callback=counter.add
                )
                f.flush()
                os.fsync(f.fileno())
        except S3_ERRORS as exc:
            err = store_error(exc, what=what, bucket=self.bucket, endpoint=self._where())
            if isinstance(err, ArtifactNotFound):
                err = ArtifactNotFound(
                    f"{manifest.kind}/{manifest.name}: the file {entry.path} of its committed "
                    f"manifest is missing from {self.location}"
                )
            raise err from None
        if writer.size != entry.size or writer.hexdigest() != entry.sha256:
            raise ChecksumMismatch(
                f"{manifest.kind}/{manifest.name}: {entry.path} holds {writer.size} bytes with "
                f"sha256 {writer.hexdigest()}; its manifest says {entry.size} bytes, "
                f"{entry.sha256}; refused"
            )

    # ---- reading the pointers -----------------------------------------------------------------------
    def manifest(self, kind: str, name: str) -> Manifest | None:
        """The committed manifest of ``kind/name`` (signature verified), or None."""
        manifest = self._read_manifest(kind, name)
        return None if manifest is None else check_manifest(manifest, kind, name, None)

    def _read_manifest(self, kind: str, name: str) -> Manifest | None:
        validate_kind(kind)
        validate_name(name)
        data = self._get_pointer(self._base(kind, name) + POINTER, f"read the manifest of {kind}/{name}")
        return None if data is None else Manifest.from_cbor(data)

    def list(self, kind: str | None = None) -> list[Manifest]:
        """Every committed artifact (of ``kind``), by kind and name; a pointer that does not hold a valid,
        signed manifest is left out (a fetch of it reports why)."""
        if kind is not None:
            validate_kind(kind)
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix + (f"{kind}/" if kind else "")
        )
        out = []
        for key in self._keys(pages, "list the artifacts"):
            parts = key[len(self.prefix) :].split("/")
            if len(parts) != 3 or parts[2] != POINTER:
                continue
            try:
                manifest = self.manifest(parts[0], parts[1])
            except ArtifactError as exc:
                if isinstance(exc, StoreUnavailable):
                    raise
                continue
            if manifest is not None:
                out.append(manifest)
        return sorted(out, key=lambda m: (m.kind, m.name))

    def remove(self, kind: str, name: str) -> bool:
        """Delete ``kind/name`` (its pointer first, then every version); False if it was not committed."""
        validate_kind(kind)
        validate_name(name)
        base = self._base(kind, name)
        existed = self._get_pointer(base + POINTER, f"remove {kind}/{name}") is not None
        self._call(f"remove {kind}/{name}", self._client.delete_object, Bucket=self.bucket, Key=base + POINTER)
        self._delete_prefix(base + "v/")
        return existed

    # ---- helpers ------------------------------------------------------------------------------------
    def _base(self, kind: str, name: str) -> str:
        return f"{self.prefix}{kind}/{name}/"

    def _where(self) -> str:
        return self.endpoint or f"AWS S3{f' ({self.region})' if self.region else ''}"

    def _version_prefix(self, manifest: Manifest) -> str:
        """The object prefix of a committed manifest's files, checked to lie in this store."""
        head = f"s3://{self.bucket}/{self._base(manifest.kind, manifest.name)}v/"
        version = manifest.location[len(head) :]
        if not manifest.location.startswith(head) or not _VERSION.fullmatch(version):
            raise ManifestInvalid(
                f"{manifest.kind}/{manifest.name}: its location {manifest.location!r:.120} is "
                f"not a version of it in {self.location}"
            )
        return manifest.location[len(f"s3://{self.bucket}/") :] + "/"

    def _commit_pointer(self, kind: str, name: str, version: str, signed: Manifest, etag: str | None) -> None:
        """Write the pointer only if it is still the one read before (``If-Match`` its ETag, or
        ``If-None-Match: *`` when there was none), so two publishers racing never let an older
        version replace a newer one. Refused (412): re-read; a newer version committed meanwhile
        drops this publish, an older one is replaced. A store without conditional writes (501)
        gets a plain PUT (logged once per store)."""
        key, what = self._base(kind, name) + POINTER, f"commit {kind}/{name}"
        for _ in range(POINTER_ATTEMPTS):
            condition = {} if self._unconditional else {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
            try:
                # Once sent, the version may be committed even if the answer is lost: from here it is
                # never deleted on failure (the next publish collects it if it is not the committed one).
                self._client.put_object(
                    Bucket=self.bucket, Key=key, Body=signed.to_cbor(), ContentType="application/cbor", **condition
                )
                return
            except S3_ERRORS as exc:
                code = error_code(exc)
                if condition and code in ("NotImplemented", "501"):
                    log.warning(
                        "event=s3_no_conditional_writes bucket=%s endpoint=%s action=plain_put",
                        self.bucket,
                        self._where(),
                    )
                    self._unconditional = True
                    continue
                if code not in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
                    raise store_error(exc, what=what, bucket=self.bucket, endpoint=self._where()) from None
            current, etag = self._committed_state(kind, name)
            if current == version:  # our own write landed (its answer was lost and the retry refused)
                return
            try:
                _check_not_newer(kind, name, current, version)
            except StoreUnavailable:
                self._delete_prefix(f"{self._base(kind, name)}v/{version}/", quiet=True)  # never committed
                raise
        raise StoreUnavailable(f"{what}: the pointer changed under {POINTER_ATTEMPTS} attempts in a row")

    def _committed_state(self, kind: str, name: str) -> tuple[str | None, str | None]:
        """(the committed version or None, the pointer's ETag or None when there is no pointer)."""
        data, etag = self._get_pointer(
            self._base(kind, name) + POINTER, f"read the manifest of {kind}/{name}", with_etag=True
        )
        if data is None:
            return None, None
        try:
            return self._version_prefix(Manifest.from_cbor(data)).rstrip("/").rsplit("/", 1)[1], etag
        except ManifestInvalid:
            return None, etag  # a broken pointer is replaced

    def _get_pointer(self, key: str, what: str, *, with_etag: bool = False):
        """The pointer's bytes (None when absent); with ``with_etag``, (bytes, ETag)."""
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=key)
            with response["Body"] as body:
                if response.get("ContentLength", 0) > MAX_MANIFEST_BYTES:
                    raise ManifestInvalid(
                        f"{key}: a manifest of {response['ContentLength']} bytes; at most {MAX_MANIFEST_BYTES}"
                    )
                data = body.read(MAX_MANIFEST_BYTES + 1)
                return (data, response.get("ETag")) if with_etag else data
        except ArtifactError:
            raise
        except S3_ERRORS as exc:
            if error_code(exc) in ("NoSuchKey", "404"):
                return (None, None) if with_etag else None
            raise store_error(exc, what=what, bucket=self.bucket, endpoint=self._where()) from None

    def _collect(self, base: str, *, older_than: str) -> None:
        """Delete the versions of ``base`` that sort before ``older_than`` (the committed one)."""
        pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base + "v/")
        stale = [
            key
            for key in self._keys(pages, f"collect old versions of {base}")
            if key[len(base) + 2 :].split("/", 1)[0] < older_than
        ]
        self._delete_keys(stale, f"collect old versions of {base}")

    def _delete_prefix(self, prefix: str, *, quiet: bool = False) -> None:
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
            self._delete_keys(list(self._keys(pages, f"delete {prefix}")), f"delete {prefix}")
        except ArtifactError:
            if not quiet:
                raise

    def _delete_keys(self, keys: builtins.list[str], what: str) -> None:  # (``list`` here: the method above)
        for i in range(0, len(keys), DELETE_BATCH):
            batch = [{"Key": k} for k in keys[i : i + DELETE_BATCH]]
            response = self._call(
                what, self._client.delete_objects, Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True}
            )
            if response.get("Errors"):
                first = response["Errors"][0]
                raise StoreUnavailable(
                    f"{what}: {len(response['Errors'])} objects not deleted ({first.get('Key')}: {first.get('Code')})"
                )

    def _keys(self, pages, what: str):
        try:
            for page in pages:
                for item in page.get("Contents", ()):
                    yield item["Key"]
        except S3_ERRORS as exc:
            raise store_error(exc, what=what, bucket=self.bucket, endpoint=self._where()) from None

    def _call(self, what: str, fn, **kwargs):
        try:
            return fn(**kwargs)
        except S3_ERRORS as exc:
            raise store_error(exc, what=what, bucket=self.bucket, endpoint=self._where()) from None


def _check_not_newer(kind: str, name: str, current: str | None, version: str) -> None:
    if current is not None and current > version:
        raise StoreUnavailable(
            f"{kind}/{name}: a newer version ({current}) was committed while this one "
            "uploaded; it is kept and this publish is dropped"
        )


class _Counter:
    """Turns boto3's per-chunk byte callbacks into ``progress(total so far)``."""

    def __init__(self, progress: Progress | None) -> None:
        self._progress = progress
        self._lock = threading.Lock()  # the transfer manager calls back from its worker threads
        self.total = 0

    def add(self, n: int) -> None:
        with self._lock:
            self.total += n
            total = self.total
        if self._progress is not None:
            self._progress(total)
