"""HTTP(S) downloads into the model cache (blocking: the CLI calls it directly, the node in a worker
thread). The decisions come from the pure core in ``transfer.py``; this module only moves bytes.

Resumable: a partial file is kept after a failure only when the server takes ranges (it said
``Accept-Ranges: bytes`` or answered ``206``), and the next attempt asks ``Range: bytes=N-`` where N
is the *durable* length recorded in ``.partial/KEY.json`` after an fsync (never the file's length: a
crash can leave a damaged tail), and only when a digest is known to check the whole file against
(else it starts over: a resumed file nobody can verify would be pinned as it is).
Verified: the sha256 of the whole file is compared (the catalogue's, ``pull --sha256``, the pinned
one, the Hub's LFS sha256 stated in ``X-Linked-Etag``) before the file is moved into place; a
mismatch deletes the bytes. Atomic: bytes go to ``.partial/KEY.part``, which is fsynced and renamed
into place (``ModelCache.commit``). Bounded: redirects only to http(s) (the token only to the same
scheme, host and port), the cache capacity (``[placement] cache_capacity_gb``) enforced while a response of unknown length
streams, and a floor on the rate (``[models].min_rate_bytes_s``) besides the per-read timeout.
"""

from __future__ import annotations

import hashlib
import http.client
import socket
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from urllib.parse import urlsplit

from hydra_node import __version__
from hydra_node.runtime.fetch.cache import CachedModel, ModelCache, PartialMeta
from hydra_node.runtime.fetch.catalogue import RemoteModel
from hydra_node.runtime.fetch.errors import (
    BadRedirect,
    ChecksumMismatch,
    DiskError,
    DownloadError,
    NoNetwork,
    NotFound,
    SizeMismatch,
    TransferTimeout,
)
from hydra_node.runtime.fetch.transfer import (
    ProgressMeter,
    RateFloor,
    check_loose_size,
    check_total,
    hub_lfs_sha256,
    plan_response,
    range_header,
    same_origin,
)

__all__ = ["CHUNK_BYTES", "Progress", "download_http", "hash_file"]

#: Bytes read from the socket (and written) at a time.
CHUNK_BYTES = 1 << 20
#: Largest file we download (a 405B model at Q8 is ~430 GB); a server claiming more is refused.
MAX_MODEL_BYTES = 1 << 40
#: The partial file is fsynced and its durable length recorded every this many bytes (and when a
#: transfer fails): what a resume may start from after a crash.
DURABLE_EVERY_BYTES = 64 << 20
#: A response of unknown length reserves room in the cache in steps of this many bytes.
RESERVE_STEP_BYTES = 16 << 20

#: ``progress(meter)``: called after every chunk (the caller throttles what it prints).
Progress = Callable[[ProgressMeter], None]


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follow http(s) redirects (the Hub sends files from a CDN), never to another scheme
    (:class:`BadRedirect`); never carry the token to another origin (scheme, host and port); keep the
    Hub's LFS sha256 stated by a redirect on the way (``linked_sha256``). One per download."""

    def __init__(self) -> None:
        super().__init__()
        self.linked_sha256: str | None = None

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if urlsplit(newurl).scheme.lower() not in ("http", "https"):
            if fp is not None:
                fp.close()
            raise BadRedirect(
                f"{req.full_url}: the server redirected to {newurl[:200]!r}; only http:// and https:// are followed"
            )
        self.linked_sha256 = hub_lfs_sha256(dict(headers or {})) or self.linked_sha256
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and not same_origin(newurl, req.full_url):
            new.remove_header("Authorization")
        return new


def hash_file(path, limit: int | None = None) -> hashlib._Hash:
    """sha256 state over the first ``limit`` bytes (all when None) of ``path``."""
    h = hashlib.sha256()
    left = limit
    with open(path, "rb") as f:
        while left is None or left > 0:
            block = f.read(CHUNK_BYTES if left is None else min(CHUNK_BYTES, left))
            if not block:
                break
            h.update(block)
            if left is not None:
                left -= len(block)
    return h


def download_http(
    remote: RemoteModel,
    cache: ModelCache,
    *,
    token: str | None,
    read_timeout_s: float,
    min_rate_bytes_s: float = 0.0,
    in_use: frozenset[str] = frozenset(),
    progress: Progress | None = None,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
) -> CachedModel:
    """Fetch ``remote`` into ``cache`` from its URLs in order (the next URL only when one is missing or
    unreachable) and return the verified record; a typed :class:`DownloadError` otherwise. Room is made
    under the cache's one capacity by evicting what is neither kept, pinned nor ``in_use``
    (``ModelCache.make_room``).
    ``min_rate_bytes_s``: the slowest average accepted over each ``read_timeout_s`` window (0: none)."""
    last: DownloadError | None = None
    for url in remote.urls:
        try:
            with cache.partial_lock(remote.model_id):
                return _download_one(
                    remote,
                    url,
                    cache,
                    token=token if remote.hub else None,
                    read_timeout_s=read_timeout_s,
                    min_rate_bytes_s=min_rate_bytes_s,
                    room=in_use,
                    progress=progress,
                    clock=clock,
                    wall=wall,
                )
        except (NotFound, NoNetwork) as exc:
            last = exc
    assert last is not None
    raise last


def _download_one(
    remote: RemoteModel,
    url: str,
    cache: ModelCache,
    *,
    token: str | None,
    read_timeout_s: float,
    min_rate_bytes_s: float,
    room: frozenset[str],
    progress: Progress | None,
    clock,
    wall,
) -> CachedModel:
    mid = remote.model_id
    meta = cache.partial_meta(mid)
    have = cache.partial_bytes(mid)
    stated = meta.sha256 if meta is not None and remote.hub else None  # the Hub's digest, said last time
    known = remote.sha256 or cache.pinned_sha256(mid) or stated
    if have and (meta is None or not meta.resumable or meta.url != url or meta.durable <= 0 or known is None):
        # bytes from another source or a server that cannot resume, none recorded durable, or no
        # digest to check a resumed file against: start over
        cache.drop_partial(mid)
        have, stated = 0, None
    elif have and meta is not None and have > meta.durable:
        have = meta.durable  # past it: not known to be on disk intact
        os.truncate(cache.partial_path(mid), have)
    headers = {"User-Agent": f"hydra-node/{__version__}", **range_header(have)}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, headers=headers)
    redirects = _Redirects()
    opener = urllib.request.build_opener(redirects)
    resumable = False
    try:
        try:
            resp = opener.open(req, timeout=read_timeout_s)
        except urllib.error.HTTPError as exc:
            with exc:
                plan = plan_response(have, exc.code, dict(exc.headers or {}), url)  # raises, or 416: complete
            resp = None
            if remote.hub:
                stated = hub_lfs_sha256(dict(exc.headers or {})) or redirects.linked_sha256 or stated
        else:
            plan = plan_response(have, resp.status, dict(resp.headers), url)
            if remote.hub:
                stated = hub_lfs_sha256(dict(resp.headers)) or redirects.linked_sha256 or stated
        resumable = plan.resumable
        total = plan.total
        check_total(remote.size_bytes, total, url)
        if total is not None and total > MAX_MODEL_BYTES:
            raise SizeMismatch(f"{url}: the server offers {total} bytes, more than the {MAX_MODEL_BYTES} accepted")
        if not plan.complete:
            cache.make_room((total or remote.size_bytes or 0) - plan.offset, room)
            started = PartialMeta(url=url, resumable=resumable, total=total, durable=plan.offset, sha256=stated)
            cache.write_partial_meta(mid, started)
            with resp:
                _receive(
                    resp,
                    cache,
                    mid,
                    plan.offset,
                    total,
                    progress,
                    clock,
                    meta=started,
                    floor=RateFloor(min_rate_bytes_s, read_timeout_s, plan.offset, clock()),
                    room=room,
                    url=url,
                )
    except DownloadError as exc:
        exc.partial_kept = _keep_or_drop(cache, mid, resumable)
        raise
    except TimeoutError as exc:
        raise TransferTimeout(
            f"{url}: no data for {read_timeout_s:g} s ({exc or 'read timed out'})",
            partial_kept=_keep_or_drop(cache, mid, resumable),
        ) from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, (TimeoutError, socket.timeout)):
            raise TransferTimeout(
                f"{url}: the server did not answer within {read_timeout_s:g} s",
                partial_kept=_keep_or_drop(cache, mid, resumable),
            ) from None
        raise NoNetwork(
            f"{url}: cannot reach the server ({getattr(reason, 'strerror', None) or reason})",
            partial_kept=_keep_or_drop(cache, mid, resumable),
        ) from None
    except http.client.HTTPException as exc:  # IncompleteRead, a malformed status line ...
        raise NoNetwork(
            f"{url}: the connection broke ({type(exc).__name__})", partial_kept=_keep_or_drop(cache, mid, resumable)
        ) from None
    except (ConnectionError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno in (28, 122):  # ENOSPC, EDQUOT
            cache.drop_partial(mid)
            raise DiskError(f"disk full while writing {cache.partial_path(mid)}") from None
        raise NoNetwork(
            f"{url}: the connection failed ({exc.strerror or exc})", partial_kept=_keep_or_drop(cache, mid, resumable)
        ) from None
    return verify_and_commit(remote, cache, source=url, now=wall(), stated=stated)


def _receive(
    resp,
    cache: ModelCache,
    mid: str,
    offset: int,
    total: int | None,
    progress,
    clock,
    *,
    meta: PartialMeta,
    floor: RateFloor,
    room: frozenset[str],
    url: str,
) -> None:
    part = cache.partial_path(mid)
    meter = ProgressMeter(total, offset, clock())
    done = durable = offset
    reserved = total if total is not None else offset  # room made for this many bytes of the file
    with open(part, "r+b" if offset else "wb") as f:
        f.truncate(offset)
        f.seek(offset)
        try:
            while True:
                block = resp.read1(CHUNK_BYTES)  # what has arrived: the rate floor sees every read
                if not block:
                    break
                f.write(block)
                done += len(block)
                if done > MAX_MODEL_BYTES or (total is not None and done > total):
                    raise SizeMismatch(f"the server sent more than the {total} bytes it announced")
                if done > reserved:  # unknown length: keep to [placement] cache_capacity_gb as it streams
                    reserved = _reserve(cache, done, room)
                now = clock()
                if floor.slow(done, now):
                    raise TransferTimeout(
                        f"{url}: {floor.rate:.0f} bytes/s over the last {floor.window_s:g} s, below "
                        f"[models].min_rate_bytes_s = {floor.min_rate:g} (lower it for a slow link)"
                    )
                if done - durable >= DURABLE_EVERY_BYTES:
                    durable = _checkpoint(f, cache, mid, meta, done)
                meter.update(done, now)
                if progress is not None:
                    progress(meter)
            if total is not None and done != total:
                raise NoNetwork(f"the server closed the connection after {done} of {total} bytes")
        except BaseException as exc:
            if (
                meta.resumable and done > durable and not isinstance(exc, SizeMismatch)
            ):  # what did arrive is worth a resume
                try:
                    _checkpoint(f, cache, mid, meta, done)
                except OSError:
                    pass
            raise


def _reserve(cache: ModelCache, done: int, in_use: frozenset[str]) -> int:
    """Room for a step more than ``done`` bytes (exactly ``done`` near the limit); :class:`DiskError`."""
    try:
        cache.make_room(done + RESERVE_STEP_BYTES, in_use)
        return done + RESERVE_STEP_BYTES
    except DiskError:
        cache.make_room(done, in_use)  # raises when even the bytes already received do not fit
        return done


def _checkpoint(f, cache: ModelCache, mid: str, meta: PartialMeta, done: int) -> int:
    """fsync the partial file, then record ``done`` as its durable length."""
    f.flush()
    os.fsync(f.fileno())
    cache.write_partial_meta(mid, replace(meta, durable=done))
    return done


def _keep_or_drop(cache: ModelCache, mid: str, resumable: bool) -> bool:
    if resumable and cache.partial_bytes(mid) > 0:
        return True
    cache.drop_partial(mid)
    return False


def _vouched(origin: str) -> str:
    if origin.startswith("peer:"):
        return f"the digest announced by peer {origin[5:17]}"
    return {
        "catalogue": "the catalogue's",
        "given": "the --sha256 given",
        "hub-lfs": "the Hub's LFS sha256",
        "pinned": "the pinned",
    }.get(origin, f"the {origin}")


def verify_and_commit(
    remote: RemoteModel, cache: ModelCache, *, source: str, now: float, stated: str | None = None
) -> CachedModel:
    """Check the complete partial file (size, loosely the catalogue's approximate size, sha256
    against every digest known: ``remote.sha256``, the pinned one, ``stated`` by the Hub) and move it
    into place; :class:`SizeMismatch` / :class:`ChecksumMismatch` (the bytes are deleted) otherwise.
    The record's ``sha256_origin`` says who vouched for the digest (docs/models.md)."""
    mid = remote.model_id
    part = cache.partial_path(mid)
    size = part.stat().st_size
    if remote.size_bytes is not None and size != remote.size_bytes:
        cache.drop_partial(mid)
        raise SizeMismatch(f"{mid}: received {size} bytes, the catalogue says {remote.size_bytes}")
    try:
        check_loose_size(mid, remote.approx_bytes, size)
    except SizeMismatch:
        cache.drop_partial(mid)
        raise
    digest = hash_file(part).hexdigest()
    old = cache.lookup(mid)
    checks = [(remote.sha256, remote.sha256_origin), (old.sha256 if old else None, "pinned"), (stated, "hub-lfs")]
    for expected, who in checks:
        if expected is not None and digest != expected:
            cache.drop_partial(mid)
            raise ChecksumMismatch(
                f"{mid}: sha256 {digest} does not match {_vouched(who)} {expected}; the download was deleted"
            )
    if remote.sha256:
        origin = remote.sha256_origin
    elif old is not None:
        origin = old.sha256_origin  # the same digest as before: whoever vouched for it then
    else:
        origin = "hub-lfs" if stated else "pinned"
    return cache.commit(mid, remote.file, digest, size, source, origin, now)
