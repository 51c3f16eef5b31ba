"""Copy a file and hash the copy in one pass over the bytes (blocking; for worker threads).

The copy runs in the kernel (``copy_file_range``: no user-space copy, server-side on NFS 4.2),
and the sha256 is computed over the *copy's* bytes, read back by a second thread while the next
chunk is copied, so hashing overlaps copying (hashlib and the copy release the GIL). The read-back
maps the chunk just written (``mmap`` of the copy's page cache) instead of reading it into a buffer:
the hash then costs one pass over the bytes, not a copy plus a pass, and on two cores the copy and
the hash of the previous chunk run side by side at about the speed of the hash alone. With
``fsync`` each chunk's writeback starts as soon as it is copied. Where
``copy_file_range`` is refused (another file system on an old kernel, a FUSE mount) the copy falls
back to ``readinto``/``write`` and hashes the buffer it wrote.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import mmap
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from hydra_node.runtime.artifacts.errors import ChecksumMismatch
from hydra_node.runtime.artifacts.manifest import ArtifactFile, hash_file

__all__ = ["COPY_CHUNK_BYTES", "check_copy", "copy_hashed", "verify_file"]

#: Bytes copied per system call (and hashed per step): large enough that the per-call cost vanishes,
#: small enough that two chunks in flight stay in the page cache.
COPY_CHUNK_BYTES = 8 * 1024 * 1024
#: Files of at most this many chunks are copied and hashed in the calling thread (no helper thread).
INLINE_CHUNKS = 2
_FALLBACK_ERRNOS = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF, errno.EPERM}


def _libc_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):  # not Linux (or no such symbol): the final fsync does it all
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _libc_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """Start writing the chunk just copied to the disk now (``sync_file_range(..., WRITE)``: it
    returns once the writes are queued), so the final fsync waits for the last chunk, not for the
    whole file: the disk works while the next chunks are copied and hashed. Best effort."""
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


class _ReadBackHasher:
    """sha256 of ranges of ``fd``, hashed in order in one helper thread (or inline)."""

    def __init__(self, fd: int, threaded: bool) -> None:
        self.fd = fd
        self.digest = hashlib.sha256()
        self.buf: bytearray | None = None  # only for the read-back fallback
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="artifact-hash") if threaded else None
        self.pending: Future | None = None

    def _hash_range(self, offset: int, length: int) -> None:
        if length <= 0:
            return
        start = offset - offset % mmap.ALLOCATIONGRANULARITY  # a short copy_file_range leaves odd offsets
        try:
            mapped = mmap.mmap(self.fd, offset + length - start, offset=start, access=mmap.ACCESS_READ)
        except (OSError, ValueError):  # a file system that cannot map (some FUSE mounts): read it back
            self._read_range(offset, length)
            return
        try:
            mapped.madvise(mmap.MADV_SEQUENTIAL)
            with memoryview(mapped) as view, view[offset - start :] as chunk:  # released before close
                self.digest.update(chunk)
        finally:
            mapped.close()

    def _read_range(self, offset: int, length: int) -> None:
        if self.buf is None:
            self.buf = bytearray(COPY_CHUNK_BYTES)
        view = memoryview(self.buf)
        while length > 0:
            n = os.preadv(self.fd, [view[: min(length, len(view))]], offset)
            if n <= 0:
                raise OSError(errno.EIO, "the copy is shorter than the bytes written to it")
            self.digest.update(view[:n])
            offset += n
            length -= n

    def add(self, offset: int, length: int) -> None:
        if self.pool is None:
            self._hash_range(offset, length)
            return
        self.wait()
        self.pending = self.pool.submit(self._hash_range, offset, length)

    def add_bytes(self, data: memoryview) -> None:
        self.wait()
        self.digest.update(data)

    def wait(self) -> None:
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)


def copy_hashed(
    src: Path | str,
    dst: Path | str,
    *,
    limit: int | None = None,
    progress: Callable[[int], None] | None = None,
    base: int = 0,
    fsync: bool = True,
) -> tuple[int, str]:
    """Copy ``src`` into the new file ``dst`` (it must not exist) and return (size, sha256 hex of the
    copy). With ``limit`` at most ``limit + 1`` bytes are copied, so a longer source shows as longer
    without copying all of it. ``progress(base + copied)`` after each chunk; ``fsync`` the copy."""
    with open(src, "rb", buffering=0) as fin, open(dst, "x+b", buffering=0) as fout:  # read back to hash
        in_fd, out_fd = fin.fileno(), fout.fileno()
        try:
            expected = os.fstat(in_fd).st_size
        except OSError:
            expected = 0
        hasher = _ReadBackHasher(out_fd, threaded=expected > INLINE_CHUNKS * COPY_CHUNK_BYTES)
        copied = 0
        kernel = True
        try:
            while limit is None or copied <= limit:
                want = COPY_CHUNK_BYTES if limit is None else min(COPY_CHUNK_BYTES, limit + 1 - copied)
                n = 0
                if kernel:
                    try:
                        n = os.copy_file_range(in_fd, out_fd, want)
                    except OSError as exc:
                        if exc.errno not in _FALLBACK_ERRNOS:
                            raise
                        kernel = False
                    if n > 0:
                        if fsync:
                            _start_writeback(out_fd, copied, n)
                        hasher.add(copied, n)
                if not kernel:
                    n = _copy_buffered(fin, fout, want, hasher)
                if n == 0:
                    break
                copied += n
                if progress is not None:
                    progress(base + copied)
            hasher.wait()
        finally:
            hasher.close()
        if fsync:
            os.fsync(out_fd)
    return copied, hasher.digest.hexdigest()


def _copy_buffered(fin, fout, want: int, hasher: _ReadBackHasher) -> int:
    buf = bytearray(min(want, COPY_CHUNK_BYTES))
    view = memoryview(buf)
    n = fin.readinto(buf)
    if not n:
        return 0
    written = 0
    while written < n:
        written += fout.write(view[written:n])
    hasher.add_bytes(view[:n])
    return n


def verify_file(path: Path | str, expected: ArtifactFile) -> None:
    """:class:`ChecksumMismatch` unless ``path`` holds exactly ``expected``'s bytes."""
    try:
        size, digest = hash_file(path)
    except FileNotFoundError:
        raise ChecksumMismatch(f"{expected.path} is missing") from None
    check_copy(expected, size, digest)


def check_copy(expected: ArtifactFile, size: int, digest: str) -> None:
    if size != expected.size:
        raise ChecksumMismatch(
            f"{expected.path}: {size if size <= expected.size else 'more than ' + str(expected.size)} "
            f"bytes where the manifest says {expected.size}"
        )
    if digest != expected.sha256:
        raise ChecksumMismatch(
            f"{expected.path}: sha256 {digest[:16]}… where the manifest says {expected.sha256[:16]}…"
        )
