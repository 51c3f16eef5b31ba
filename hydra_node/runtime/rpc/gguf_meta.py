"""The layer count of a GGUF model, read from its header (no llama.cpp, bounded reads).

Placement needs ``n_layers`` before any runner loads the model.  GGUF v2/v3 header:
magic ``GGUF``, u32 version, u64 tensor count, u64 key/value count, then key/value
pairs (u64-length string key, u32 type, value).  We read pairs until
``<architecture>.block_count`` is found; arrays (the tokenizer's vocabulary) are skipped
element by element without being kept.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

#: Key/value pairs read before giving up (real models have a few dozen).
MAX_KV_PAIRS = 4096
#: Longest key or string value accepted.
MAX_STRING_BYTES = 1 << 20
#: Longest array accepted (a vocabulary has ~10^5 entries).
MAX_ARRAY_ITEMS = 1 << 24

_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class GgufError(Exception):
    """Not a GGUF file, or one whose header we cannot read (the file's fault)."""


def _read(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise GgufError("truncated GGUF header")
    return data


def _u64(f: BinaryIO) -> int:
    return struct.unpack("<Q", _read(f, 8))[0]


def _string(f: BinaryIO) -> bytes:
    n = _u64(f)
    if n > MAX_STRING_BYTES:
        raise GgufError(f"GGUF string of {n} bytes is longer than {MAX_STRING_BYTES}")
    return _read(f, n)


def _value(f: BinaryIO, vtype: int):
    if vtype in _SCALARS:
        fmt = "<" + _SCALARS[vtype]
        return struct.unpack(fmt, _read(f, struct.calcsize(fmt)))[0]
    if vtype == _STRING:
        return _string(f)
    if vtype == _ARRAY:
        itype, count = struct.unpack("<I", _read(f, 4))[0], _u64(f)
        if count > MAX_ARRAY_ITEMS:
            raise GgufError(f"GGUF array of {count} items is longer than {MAX_ARRAY_ITEMS}")
        if itype in _SCALARS:
            f.seek(count * struct.calcsize("<" + _SCALARS[itype]), 1)
        else:
            for _ in range(count):
                _value(f, itype)
        return None
    raise GgufError(f"unknown GGUF value type {vtype}")


def read_metadata(path: Path, *, until_block_count: bool = False) -> dict[str, object]:
    """Scalar and string metadata of ``path`` (arrays are skipped); with ``until_block_count``
    reading stops once the architecture's block count is known."""
    out: dict[str, object] = {}
    with open(path, "rb") as f:
        if _read(f, 4) != b"GGUF":
            raise GgufError(f"{path} is not a GGUF file (bad magic)")
        version = struct.unpack("<I", _read(f, 4))[0]
        if version not in (2, 3):
            raise GgufError(f"{path}: GGUF version {version} is not supported (2 or 3)")
        _u64(f)  # tensor count
        n_kv = _u64(f)
        if n_kv > MAX_KV_PAIRS:
            raise GgufError(f"{path}: {n_kv} metadata pairs, more than {MAX_KV_PAIRS}")
        for _ in range(n_kv):
            key = _string(f).decode("utf-8", "replace")
            vtype = struct.unpack("<I", _read(f, 4))[0]
            value = _value(f, vtype)
            if value is not None:
                out[key] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
            if until_block_count and f"{out.get('general.architecture')}.block_count" in out:
                break
    return out


def layer_count(path: Path) -> int:
    """``<architecture>.block_count``: the repeating layers llama.cpp splits (not the output layer)."""
    try:
        meta = read_metadata(path, until_block_count=True)
    except (OSError, struct.error, UnicodeDecodeError) as exc:
        raise GgufError(f"{path}: cannot read the GGUF header: {exc}") from None
    arch = meta.get("general.architecture")
    n = meta.get(f"{arch}.block_count") if isinstance(arch, str) else None
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise GgufError(f"{path}: no {arch}.block_count in the GGUF metadata")
    return n
