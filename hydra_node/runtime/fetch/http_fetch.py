"""HTTP(S) downloads into the model cache (blocking: the CLI calls it directly, the node in a worker
thread). The decisions come from the pure core in ``transfer.py``; this module only moves bytes.

Resumable: a partial file is kept after a failure only when the server takes ranges (it said
``Accept-Ranges: bytes`` or answered ``206``), and the next attempt asks ``Range: bytes=N-``.
Verified: the sha256 of the whole file is compared (catalogue or pinned digest) before the file is
moved into place; a mismatch deletes the bytes. Atomic: bytes go to ``.partial/KEY.part``, which is
fsynced and renamed into place (``ModelCache.commit``).
"""

from __future__ import annotations

import hashlib
import http.client
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from urllib.parse import urlsplit

from hydra_node import __version__
from hydra_node.runtime.fetch.cache import CachedModel, ModelCache, PartialMeta
from hydra_node.runtime.fetch.catalogue import RemoteModel
from hydra_node.runtime.fetch.errors import (
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
    check_total,
    plan_response,
    range_header,
)

__all__ = ["CHUNK_BYTES", "Progress", "download_http", "hash_file"]

#: Bytes read from the socket (and written) at a time.
CHUNK_BYTES = 1 << 20
#: Largest file we download (a 405B model at Q8 is ~430 GB); a server claiming more is refused.
MAX_MODEL_BYTES = 1 << 40

#: ``progress(meter)``: called after every chunk (the caller throttles what it prints).
Progress = Callable[[ProgressMeter], None]


class _SameHostRedirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects (the Hub sends files from a CDN) but never carry the token to another host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urlsplit(newurl).hostname != urlsplit(req.full_url).hostname:
            new.remove_header("Authorization")
        return new


_OPENER = urllib.request.build_opener(_SameHostRedirects())


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
    limit_bytes: int | None = None,
    in_use: frozenset[str] = frozenset(),
    progress: Progress | None = None,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
) -> CachedModel:
    """Fetch ``remote`` into ``cache`` from its URLs in order (the next URL only when one is missing or
    unreachable) and return the verified record; a typed :class:`DownloadError` otherwise. Room is made
    under ``limit_bytes`` by evicting unkept models not ``in_use`` (``ModelCache.make_room``)."""
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
                    room=(limit_bytes, in_use),
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
    room: tuple[int | None, frozenset[str]],
    progress: Progress | None,
    clock,
    wall,
) -> CachedModel:
    mid = remote.model_id
    meta = cache.partial_meta(mid)
    have = cache.partial_bytes(mid)
    if have and (meta is None or not meta.resumable or meta.url != url):
        cache.drop_partial(mid)  # bytes from another source, or from a server that cannot resume
        have = 0
    headers = {"User-Agent": f"hydra-node/{__version__}", **range_header(have)}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, headers=headers)
    resumable = False
    try:
        try:
            resp = _OPENER.open(req, timeout=read_timeout_s)
        except urllib.error.HTTPError as exc:
            with exc:
                plan = plan_response(have, exc.code, dict(exc.headers or {}), url)  # raises, or 416: complete
            resp = None
        else:
            plan = plan_response(have, resp.status, dict(resp.headers), url)
        resumable = plan.resumable
        total = plan.total
        check_total(remote.size_bytes, total, url)
        if total is not None and total > MAX_MODEL_BYTES:
            raise SizeMismatch(f"{url}: the server offers {total} bytes, more than the {MAX_MODEL_BYTES} accepted")
        if not plan.complete:
            cache.make_room((total or remote.size_bytes or 0) - plan.offset, *room)
            cache.write_partial_meta(mid, PartialMeta(url=url, resumable=resumable, total=total))
            with resp:
                _receive(resp, cache, mid, plan.offset, total, progress, clock)
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
    return verify_and_commit(remote, cache, source=url, now=wall())


def _receive(resp, cache: ModelCache, mid: str, offset: int, total: int | None, progress, clock) -> None:
    part = cache.partial_path(mid)
    meter = ProgressMeter(total, offset, clock())
    done = offset
    with open(part, "r+b" if offset else "wb") as f:
        f.truncate(offset)
        f.seek(offset)
        while True:
            block = resp.read(CHUNK_BYTES)
            if not block:
                break
            f.write(block)
            done += len(block)
            if done > MAX_MODEL_BYTES or (total is not None and done > total):
                raise SizeMismatch(f"the server sent more than the {total} bytes it announced")
            meter.update(done, clock())
            if progress is not None:
                progress(meter)
    if total is not None and done != total:
        raise NoNetwork(f"the server closed the connection after {done} of {total} bytes")


def _keep_or_drop(cache: ModelCache, mid: str, resumable: bool) -> bool:
    if resumable and cache.partial_bytes(mid) > 0:
        return True
    cache.drop_partial(mid)
    return False


def verify_and_commit(remote: RemoteModel, cache: ModelCache, *, source: str, now: float) -> CachedModel:
    """Check the complete partial file (size, sha256 against the catalogue's or the pinned digest)
    and move it into place; :class:`ChecksumMismatch` (the bytes are deleted) otherwise."""
    part = cache.partial_path(remote.model_id)
    size = part.stat().st_size
    if remote.size_bytes is not None and size != remote.size_bytes:
        cache.drop_partial(remote.model_id)
        raise SizeMismatch(f"{remote.model_id}: received {size} bytes, the catalogue says {remote.size_bytes}")
    digest = hash_file(part).hexdigest()
    expected = remote.sha256 or cache.pinned_sha256(remote.model_id)
    if expected is not None and digest != expected:
        cache.drop_partial(remote.model_id)
        raise ChecksumMismatch(
            f"{remote.model_id}: sha256 {digest} does not match the expected {expected}; the download was deleted"
        )
    origin = "catalogue" if remote.sha256 else "pinned"
    return cache.commit(remote.model_id, remote.file, digest, size, source, origin, now)
