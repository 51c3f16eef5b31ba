"""The cell table inside a llama.cpp sequence state, checked before any byte reaches llama.cpp (pure).

``llama_state_seq_get_data`` (one sequence; llama.cpp's own layout, little-endian) writes::

    u32 0xAF143CD8, u32 seq_id        llama.cpp's io magic and the sequence the state was read from
                                      (the slot; ignored on load, which names its own sequence)
    then one section per KV cache (one; two for a sliding-window model, base then SWA):
      u32 n_stream                    1 for one sequence
      u32 cell_count
      cell_count x (i32 pos, u32 n_seq_id, n_seq_id x i32 seq_id)
      if cell_count:
        u32 v_trans, u32 n_layer
        n_layer x (i32 k_type, u64 k_row_bytes, cell_count x k_row_bytes)
        n_layer x (i32 v_type, u64 v_row_bytes, cell_count x v_row_bytes)                  # v_trans 0
               or (i32 v_type, u32 v_el_bytes, u32 n_embd_v, n_embd_v x cell_count x v_el_bytes)  # v_trans 1

llama.cpp loads the cells at whatever positions the table names: a state whose cells carry
negative positions loads "successfully", and ``llama_memory_seq_rm`` never removes a negative
position (``p0 < 0`` means 0 there), so such cells would outlive every later use of the slot and
leak into other sequences' attention.  :func:`check_cells` therefore refuses, with
:class:`~hydra_node.runtime.artifacts.kv_state.KvStateInvalid`, anything but: the magic and
version above; every section one stream; the first section exactly ``n_tokens`` cells at positions
``0, 1, ..., n_tokens - 1`` in order, each in exactly one sequence; a later (sliding-window)
section a run of consecutive positions ending at ``n_tokens - 1``; the K/V data of each section
exactly as long as its header says, and nothing after the last section.  A layout it does not
know (a recurrent or hybrid model's memory) is refused too: it cannot be checked.

Only the headers are read; the K/V rows are skipped, so ``state`` may be a memory-mapped file:
:func:`check_state_file` checks a ``state.hykv`` file's header and cell table that way (blocking:
trio code runs it in a thread), for the node before it keeps or uses a fetched ``kv_state`` artifact.
"""

from __future__ import annotations

import hashlib
import mmap
import struct
import sys
from array import array
from dataclasses import dataclass
from pathlib import Path

from hydra_node.runtime.artifacts.kv_state import KvStateCorrupt, KvStateHeader, KvStateInvalid, open_kv_state

__all__ = ["SEQ_STATE_MAGIC", "CellTable", "check_cells", "check_state_file"]

#: The first word of a sequence state (llama.cpp's "io magic"), then the source sequence id, below
#: llama.cpp's LLAMA_MAX_SEQ (a state saved from slot 1 says 1: measured, docs/prompt-cache.md).
SEQ_STATE_MAGIC = 0xAF143CD8
MAX_SEQ_ID = 255
#: Most KV cache sections a state may hold (base and sliding-window), and layers per section.
MAX_SECTIONS = 2
MAX_LAYERS = 4096


@dataclass(frozen=True)
class CellTable:
    """What a checked state holds: per section, its first and last position and its cell count."""

    sections: tuple[tuple[int, int, int], ...]  # (pos_min, pos_max, cells)
    state_bytes: int


def _invalid(why: str) -> KvStateInvalid:
    return KvStateInvalid(f"kv_state: the llama.cpp cell table is not one sequence of 0..n-1: {why}")


class _Cursor:
    def __init__(self, buf: memoryview) -> None:
        self.buf, self.at = buf, 0

    def take(self, fmt: str) -> int:
        n = struct.calcsize(fmt)
        if self.at + n > len(self.buf):
            raise _invalid(f"the state ends inside its header at byte {self.at}")
        (v,) = struct.unpack_from(fmt, self.buf, self.at)
        self.at += n
        return int(v)

    def skip(self, n: int, what: str) -> None:
        if n < 0 or self.at + n > len(self.buf):
            raise _invalid(f"{what} of {n} bytes runs past the end of the state ({len(self.buf)} bytes)")
        self.at += n


def check_cells(state, n_tokens: int) -> CellTable:
    """Check ``state`` (bytes or any buffer) holds exactly one sequence of ``n_tokens`` cells at
    positions ``0..n_tokens-1``; :class:`KvStateInvalid` naming the defect otherwise."""
    view = memoryview(state).cast("B")
    c = _Cursor(view)
    magic, seq_id = c.take("<I"), c.take("<I")
    if magic != SEQ_STATE_MAGIC or seq_id > MAX_SEQ_ID:
        raise _invalid(
            f"magic/sequence {magic:#010x}/{seq_id} is not llama.cpp's sequence state 0xaf143cd8/0..{MAX_SEQ_ID}"
        )
    sections: list[tuple[int, int, int]] = []
    while c.at < len(view):
        if len(sections) == MAX_SECTIONS:
            raise _invalid(f"more than {MAX_SECTIONS} KV cache sections (a layout this runner cannot check)")
        sections.append(_section(c, n_tokens, first=not sections))
    if not sections:
        raise _invalid("no KV cache section")
    return CellTable(tuple(sections), len(view))


def _section(c: _Cursor, n_tokens: int, *, first: bool) -> tuple[int, int, int]:
    n_stream = c.take("<I")
    if n_stream != 1:
        raise _invalid(f"{n_stream} streams, not 1 (one sequence's state has one)")
    count = c.take("<I")
    if first and count != n_tokens:
        raise _invalid(f"{count} cells for a prefix of {n_tokens} tokens")
    if not 0 < count <= n_tokens:
        raise _invalid(f"{count} cells in a sliding-window section, not 1..{n_tokens}")
    start = n_tokens - count  # 0 for the first section
    if _table_is_plain(c, start, count):
        return _data(c, start, n_tokens, count)
    for i in range(count):
        pos, n_seq = c.take("<i"), c.take("<I")
        if pos != start + i:
            raise _invalid(f"cell {i} is at position {pos}, not {start + i}")
        if n_seq != 1:
            raise _invalid(f"cell {i} (position {pos}) belongs to {n_seq} sequences, not 1")
        seq = c.take("<i")
        if seq < 0:
            raise _invalid(f"cell {i} names sequence {seq}")
    return _data(c, start, n_tokens, count)


def _table_is_plain(c: _Cursor, start: int, count: int) -> bool:
    """The common case checked at once (a cell a record of 12 bytes: ``start + i``, 1, a sequence id
    >= 0); True moves the cursor past the table, False leaves it for the cell-by-cell walk."""
    end = c.at + 12 * count
    if end > len(c.buf):
        return False
    table = array("i")
    table.frombytes(c.buf[c.at : end])
    if sys.byteorder != "little":
        table.byteswap()
    if table[0::3] != array("i", range(start, start + count)) or table[1::3] != array("i", [1]) * count:
        return False
    if min(table[2::3]) < 0:
        return False
    c.at = end
    return True


def _data(c: _Cursor, start: int, n_tokens: int, count: int) -> tuple[int, int, int]:
    """Skip a section's K/V data, checking its lengths; the section's (pos_min, pos_max, cells)."""
    v_trans, n_layer = c.take("<I"), c.take("<I")
    if v_trans not in (0, 1) or not 0 < n_layer <= MAX_LAYERS:
        raise _invalid(f"v_trans {v_trans} / {n_layer} layers is not a KV cache layout")
    for il in range(n_layer):
        c.take("<i")
        c.skip(c.take("<Q") * count, f"layer {il}'s K rows")
    for il in range(n_layer):
        c.take("<i")
        if v_trans:
            el, n_embd = c.take("<I"), c.take("<I")
            c.skip(el * n_embd * count, f"layer {il}'s V columns")
        else:
            c.skip(c.take("<Q") * count, f"layer {il}'s V rows")
    return (start, n_tokens - 1, count)


def check_state_file(path: Path | str, *, verify_sha256: bool = False) -> KvStateHeader:
    """The header of the kv_state file at ``path`` once it and the state's cell table are checked
    (and, with ``verify_sha256``, the state's sha256: :class:`KvStateCorrupt`); :class:`KvStateInvalid`
    otherwise.  The state is memory-mapped: only its headers are read unless the sha256 is asked for."""
    with open_kv_state(path) as reader:
        h = reader.header
        offset = h.file_bytes - h.state_bytes
        # not closed here: a KvStateInvalid's traceback holds views of it; it closes when freed
        mm = mmap.mmap(reader.fileno(), 0, access=mmap.ACCESS_READ)
        check_cells(memoryview(mm)[offset:], h.identity.n_tokens)
        if verify_sha256 and hashlib.sha256(memoryview(mm)[offset:]).digest() != h.state_sha256:
            raise KvStateCorrupt("kv_state: the state's sha256 differs from its header (corrupt file)")
    return h
