"""The ``kv_state`` file: one sequence's llama.cpp KV state with its identity and prefix tokens.

Layout (protocol/kv_state.md; all lengths big-endian)::

    "HYKV" 0x01                      magic and format version (5 bytes)
    u32 header length H              1 .. MAX_HEADER_BYTES
    H bytes: canonical CBOR map      {"identity": KvIdentity map, "tokens": bytes (uint32 LE ids),
                                      "state_bytes": uint, "state_sha256": bytes (32)}
    state_bytes bytes                llama_state_seq_get_data of the sequence, as llama.cpp wrote them

The header goes through the one strict decoder (:mod:`hydra_node.codec`); the file must end exactly
after the state (no trailing bytes), the tokens must be the identity's prefix (count and hash), and
the state's sha256 must match before a single byte reaches llama.cpp.  Anything else raises
:class:`KvStateInvalid` or :class:`KvStateCorrupt` (a ``checksum_mismatch``).

:func:`write_kv_state` writes through a temporary sibling, fsyncs and renames (a reader sees the
old file or the whole new one); :func:`open_kv_state` reads and checks the header only;
:meth:`KvStateReader.read_state_into` streams the state into a caller's buffer, hashing as it goes.
Blocking calls: trio code runs them in a thread; the runner child on its engine thread.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass
from io import BufferedReader
from pathlib import Path

from hydra_node.codec import DecodeError, cbor
from hydra_node.runtime.artifacts.errors import ArtifactError, ChecksumMismatch
from hydra_node.runtime.artifacts.kv_identity import (
    KvIdentity,
    pack_tokens,
    prefix_sha256,
    unpack_tokens,
)

__all__ = [
    "KV_STATE_FILE",
    "MAGIC",
    "MAX_HEADER_BYTES",
    "MAX_PREFIX_TOKENS",
    "MAX_STATE_BYTES",
    "KvStateHeader",
    "KvStateCorrupt",
    "KvStateInvalid",
    "KvStateReader",
    "decode_header",
    "encode_header",
    "header_length",
    "open_kv_state",
    "write_kv_state",
]

MAGIC = b"HYKV\x01"
#: The file name of a kv_state artifact's one file.
KV_STATE_FILE = "state.hykv"
#: Longest prefix a state file may carry: far beyond any context llama.cpp runs today (4 bytes each).
MAX_PREFIX_TOKENS = 1 << 20
#: Largest header: the packed tokens plus an identity of a few hundred bytes.
MAX_HEADER_BYTES = MAX_PREFIX_TOKENS * 4 + 64 * 1024
#: Largest state accepted: one sequence of a large model at a long context is a few GiB; 64 GiB is a
#: bound that still stops a corrupt length from asking for absurd memory.
MAX_STATE_BYTES = 64 << 30
_PREFIX = len(MAGIC) + 4
_CHUNK = 1 << 20


class KvStateInvalid(ArtifactError):
    """Not a kv_state file: wrong magic or version, a malformed or inconsistent header, wrong length."""

    code = "kv_state_invalid"
    status = 422


class KvStateCorrupt(ChecksumMismatch):
    """The state's bytes differ from the sha256 in the file's header: the file the caller named is
    corrupt (422, where a store's corrupt artifact is the holder's fault, 502)."""

    status = 422


@dataclass(frozen=True)
class KvStateHeader:
    identity: KvIdentity
    tokens: tuple[int, ...]
    state_bytes: int
    state_sha256: bytes

    @property
    def file_bytes(self) -> int:
        return _PREFIX + self.header_bytes + self.state_bytes

    @property
    def header_bytes(self) -> int:
        return len(_header_cbor(self))


def _header_cbor(h: KvStateHeader) -> bytes:
    return cbor.encode(
        {
            "identity": h.identity.to_mapping(),
            "tokens": pack_tokens(h.tokens),
            "state_bytes": h.state_bytes,
            "state_sha256": h.state_sha256,
        }
    )


def encode_header(header: KvStateHeader) -> bytes:
    """Magic, length and CBOR header: the bytes that precede the state."""
    _check(header)
    body = _header_cbor(header)
    return MAGIC + struct.pack(">I", len(body)) + body


def _check(h: KvStateHeader) -> None:
    if not 0 < len(h.tokens) <= MAX_PREFIX_TOKENS:
        raise KvStateInvalid(f"a kv state holds 1..{MAX_PREFIX_TOKENS} prefix tokens, not {len(h.tokens)}")
    if not 0 < h.state_bytes <= MAX_STATE_BYTES:
        raise KvStateInvalid(f"state length {h.state_bytes} is outside 1..{MAX_STATE_BYTES}")
    if len(h.state_sha256) != 32:
        raise KvStateInvalid("state_sha256 must be 32 bytes")
    if h.identity.n_tokens != len(h.tokens) or h.identity.prefix_sha256 != prefix_sha256(h.tokens):
        raise KvStateInvalid("the header's tokens are not the prefix its identity names (count or hash)")


def header_length(prefix: bytes) -> int:
    """The CBOR header's length from the first 9 bytes; :class:`KvStateInvalid` if they are not ours."""
    if len(prefix) < _PREFIX or prefix[: len(MAGIC) - 1] != MAGIC[:-1]:
        raise KvStateInvalid("not a kv_state file (no HYKV magic)")
    if prefix[len(MAGIC) - 1] != MAGIC[-1]:
        raise KvStateInvalid(f"kv_state format version {prefix[len(MAGIC) - 1]} is not supported (1 is)")
    (n,) = struct.unpack(">I", prefix[len(MAGIC) : _PREFIX])
    if not 0 < n <= MAX_HEADER_BYTES:
        raise KvStateInvalid(f"kv_state header length {n} is outside 1..{MAX_HEADER_BYTES}")
    return n


def decode_header(body: bytes) -> KvStateHeader:
    """The CBOR header (without magic and length), strictly; :class:`KvStateInvalid` on any defect."""
    try:
        m = cbor.decode(body, max_size=MAX_HEADER_BYTES)
    except DecodeError as exc:
        raise KvStateInvalid(f"kv_state header: {exc}") from None
    if not isinstance(m, dict) or set(m) != {"identity", "tokens", "state_bytes", "state_sha256"}:
        raise KvStateInvalid("kv_state header must be a map of identity, tokens, state_bytes, state_sha256")
    if (
        not isinstance(m["tokens"], bytes)
        or type(m["state_bytes"]) is not int
        or not isinstance(m["state_sha256"], bytes)
    ):
        raise KvStateInvalid("kv_state header: tokens and state_sha256 must be bytes, state_bytes an integer")
    try:
        identity = KvIdentity.from_mapping(m["identity"])
        tokens = unpack_tokens(m["tokens"])
    except ValueError as exc:
        raise KvStateInvalid(f"kv_state header: {exc}") from None
    header = KvStateHeader(identity, tokens, m["state_bytes"], m["state_sha256"])
    _check(header)
    return header


def write_kv_state(path: Path | str, identity: KvIdentity, tokens: tuple[int, ...], state) -> KvStateHeader:
    """Write a state file atomically (``state``: bytes or any buffer, e.g. a ctypes array)."""
    view = memoryview(state).cast("B")
    header = KvStateHeader(identity, tuple(tokens), len(view), hashlib.sha256(view).digest())
    head = encode_header(header)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(head)
            f.write(view)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return header


class KvStateReader:
    """An open state file whose header was checked; :meth:`read_state_into` reads the rest."""

    def __init__(self, f: BufferedReader, header: KvStateHeader) -> None:
        self._f = f
        self.header = header

    def read_state_into(self, buf) -> None:
        """Fill ``buf`` (at least ``state_bytes`` long) with the state, checking its sha256 and that
        the file ends right after it; :class:`KvStateCorrupt` otherwise (``buf`` is then garbage)."""
        view = memoryview(buf).cast("B")
        n = self.header.state_bytes
        if len(view) < n:
            raise ValueError(f"buffer of {len(view)} bytes for a state of {n}")
        h, done = hashlib.sha256(), 0
        while done < n:
            got = self._f.readinto(view[done : min(n, done + _CHUNK)])
            if not got:
                raise KvStateInvalid(f"kv_state file ends after {done} of {n} state bytes")
            h.update(view[done : done + got])
            done += got
        if self._f.read(1):
            raise KvStateInvalid("kv_state file has bytes after its state")
        if h.digest() != self.header.state_sha256:
            raise KvStateCorrupt("kv_state: the state's sha256 differs from its header (corrupt file)")

    def fileno(self) -> int:
        return self._f.fileno()

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> KvStateReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_kv_state(path: Path | str) -> KvStateReader:
    """Open ``path`` and check its header and length; ``FileNotFoundError`` if it is not there."""
    f = open(path, "rb")
    try:
        size = os.fstat(f.fileno()).st_size
        n = header_length(f.read(_PREFIX))
        body = f.read(n)
        if len(body) != n:
            raise KvStateInvalid("kv_state file ends inside its header")
        header = decode_header(body)
        if size != _PREFIX + n + header.state_bytes:
            raise KvStateInvalid(f"kv_state file is {size} bytes; its header says {_PREFIX + n + header.state_bytes}")
        return KvStateReader(f, header)
    except BaseException:
        f.close()
        raise
