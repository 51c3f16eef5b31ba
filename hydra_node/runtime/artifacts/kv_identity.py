"""The exact compatibility identity of a KV state (a ``kv_state`` artifact), and a cache of model-file digests.

KV cells are only meaningful to a context that would have computed the very same cells: the same
weights (the model file's sha256), the same llama.cpp build (its data layout and kernels), the same
architecture and vocabulary, the same context and RoPE parameters, the same cache types and layout
(flash attention stores V untransposed), the same shape (embedding width, layers, heads) and the
same prefix tokens.  :class:`KvIdentity` holds all of them; :meth:`KvIdentity.mismatches` names
every field that differs, and an import happens only when that list is empty (anything else is
refused and recomputed: docs/kv-reuse.md).  Nothing is "close enough": floats compare exactly.

:func:`model_ident` is a hosted model's identity (what a continuation and a re-host check:
hydra_node/routing/identity.py). Pure except :class:`FileDigests`, whose :meth:`~FileDigests.sha256` reads a file (call it through
``trio.to_thread.run_sync``); it remembers a digest per (path, mtime, size) so a large GGUF is hashed
once, not at every export or import, and keeps the table in a small JSON file when given one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from hydra_node.mesh.membership.announcement import IDENT_HEX

__all__ = [
    "MAX_DIGEST_ENTRIES",
    "MAX_IDENTITY_TEXT",
    "FileDigests",
    "KvIdentity",
    "model_ident",
    "pack_tokens",
    "prefix_sha256",
    "unpack_tokens",
]

#: Longest text field of an identity (a build string, an architecture name): far above real values.
MAX_IDENTITY_TEXT = 256
#: Model files whose digest :class:`FileDigests` remembers (a node hosts a handful; the oldest go first).
MAX_DIGEST_ENTRIES = 256
#: Largest token id an identity's prefix may hold (llama.cpp token ids are int32).
MAX_TOKEN_ID = 2**31 - 1

_HEX64 = re.compile(r"[0-9a-f]{64}")


def pack_tokens(tokens: Sequence[int]) -> bytes:
    """Token ids as little-endian uint32 (the form the prefix hash and the state file use)."""
    for t in tokens:
        if type(t) is not int or not 0 <= t <= MAX_TOKEN_ID:
            raise ValueError(f"a token id must be an integer in [0, 2**31), not {t!r:.40}")
    return struct.pack(f"<{len(tokens)}I", *tokens)


def unpack_tokens(data: bytes) -> tuple[int, ...]:
    if len(data) % 4:
        raise ValueError(f"packed token ids must be a multiple of 4 bytes, not {len(data)}")
    tokens = struct.unpack(f"<{len(data) // 4}I", data)
    if any(t > MAX_TOKEN_ID for t in tokens):
        raise ValueError("a packed token id is outside [0, 2**31)")
    return tokens


def prefix_sha256(tokens: Sequence[int]) -> str:
    """The hex sha256 of the packed prefix token ids."""
    return hashlib.sha256(pack_tokens(tokens)).hexdigest()


@dataclass(frozen=True)
class KvIdentity:
    """Everything two contexts must share for one's KV cells to be valid in the other (module doc)."""

    model_sha256: str  # sha256 of the GGUF file the weights came from
    build: str  # llama-cpp-python version, llama and ggml versions, ggml commit
    architecture: str  # general.architecture
    tokenizer_sha256: str  # vocabulary type and every token's text and attributes
    n_ctx_seq: int  # context one sequence may use (the runner's ctx_per_slot)
    rope_type: int  # llama_model_rope_type
    rope_freq_base: float  # the context's effective RoPE base
    rope_freq_scale: float  # the context's effective RoPE scale
    type_k: str  # K cache ggml type (f16, q8_0, ...)
    type_v: str  # V cache ggml type
    flash_attention: bool  # changes the V layout (transposed without it)
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_tokens: int  # prefix length
    prefix_sha256: str  # prefix_sha256() of the prefix token ids

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            # f.type is the annotation's text (postponed annotations)
            want = {"str": str, "int": int, "float": float, "bool": bool}[cast(str, f.type)]
            if want is float and type(v) is int:
                object.__setattr__(self, f.name, float(v))
                continue
            if type(v) is not want:
                raise ValueError(f"kv identity: {f.name!r} must be {f.type}, not {type(v).__name__}")
            if type(v) is str and not 0 < len(v) <= MAX_IDENTITY_TEXT:  # (type(v) is want here)
                raise ValueError(f"kv identity: {f.name!r} must be 1..{MAX_IDENTITY_TEXT} characters")
            if type(v) is int and not 0 <= v < 2**31 and f.name != "rope_type":
                raise ValueError(f"kv identity: {f.name!r} must be a count, not {v}")
        for name in ("model_sha256", "tokenizer_sha256", "prefix_sha256"):
            if not _HEX64.fullmatch(getattr(self, name)):
                raise ValueError(f"kv identity: {name!r} must be 64 lower-case hex digits")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def to_mapping(self) -> dict[str, Any]:
        """A plain map (CBOR- and JSON-able): the manifest's ``identity`` and the state file's header."""
        return dataclasses.asdict(self)

    @classmethod
    def from_mapping(cls, m: object) -> KvIdentity:
        """Strict: exactly the known fields, each of its type; ``ValueError`` names what is wrong."""
        if not isinstance(m, Mapping):
            raise ValueError("kv identity must be a map")
        names = set(cls.field_names())
        missing, unknown = sorted(names - set(m)), sorted(set(m) - names)
        if missing or unknown:
            raise ValueError(f"kv identity: missing {missing[:4]}, unknown {[str(k)[:40] for k in unknown[:4]]}")
        return cls(**{k: m[k] for k in names})

    def with_prefix(self, tokens: Sequence[int]) -> KvIdentity:
        """This identity for another prefix."""
        return dataclasses.replace(self, n_tokens=len(tokens), prefix_sha256=prefix_sha256(tokens))

    def mismatches(self, other: KvIdentity) -> list[str]:
        """The fields that differ (empty: the state may be imported); in field order."""
        return [
            n
            for n in self.field_names()
            if getattr(self, n) != getattr(other, n) or type(getattr(self, n)) is not type(getattr(other, n))
        ]


def model_ident(file_sha256: str, chat_template: str | None = None) -> str:
    """The identity of a model file with sha256 ``file_sha256`` (hex) served with ``chat_template``
    (an override of the file's template; None: the file's own)."""
    h = hashlib.sha256(b"hydra-model-ident/1\0" + file_sha256.lower().encode("ascii"))
    if chat_template:
        h.update(b"\0chat-template\0" + chat_template.encode("utf-8"))
    return h.hexdigest()[:IDENT_HEX]


class FileDigests:
    """sha256 of files, remembered per (path, mtime, size): a changed file is hashed again.

    ``store``: a JSON file keeping the table across restarts (None: memory only).  Blocking; one
    instance may be shared by worker threads (the model identities and the re-host service)."""

    def __init__(self, store: Path | None = None, *, limit: int = MAX_DIGEST_ENTRIES) -> None:
        self.store = store
        self.limit = limit
        self.hashed = 0  # files actually read (the rest came from the table)
        self._table: dict[str, list] = {}  # resolved path -> [mtime_ns, size, hex]
        self._lock = threading.Lock()  # one hash and one save at a time
        if store is not None:
            self._table = _load_table(store)

    def sha256(self, path: Path) -> str:
        from hydra_node.runtime.fetch.http_fetch import (
            hash_file,  # the one streaming file hasher
        )

        with self._lock:
            return self._sha256(Path(path).resolve(), hash_file)

    def _sha256(self, path: Path, hash_file: Callable[[Path], Any]) -> str:
        st = path.stat()
        key = str(path)
        held = self._table.get(key)
        if held is not None and held[0] == st.st_mtime_ns and held[1] == st.st_size:
            return held[2]
        digest = hash_file(path).hexdigest()
        self.hashed += 1
        after = path.stat()
        if (after.st_mtime_ns, after.st_size) != (st.st_mtime_ns, st.st_size):
            return digest  # it changed while we read it: correct for what was read, not remembered
        self._table.pop(key, None)
        self._table[key] = [st.st_mtime_ns, st.st_size, digest]
        while len(self._table) > self.limit:
            self._table.pop(next(iter(self._table)))
        if self.store is not None:
            _save_table(self.store, self._table)
        return digest


def _load_table(store: Path) -> dict[str, list]:
    """The saved table; an unreadable or malformed file counts as empty (it is only a cache)."""
    try:
        raw = json.loads(store.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(raw, dict):
        return {}
    return {
        k: v
        for k, v in raw.items()
        if isinstance(k, str)
        and isinstance(v, list)
        and len(v) == 3
        and type(v[0]) is int
        and type(v[1]) is int
        and isinstance(v[2], str)
        and _HEX64.fullmatch(v[2])
    }


def _save_table(store: Path, table: dict[str, list]) -> None:
    store.parent.mkdir(parents=True, exist_ok=True)
    tmp = store.with_name(store.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(table), encoding="utf-8")
    os.replace(tmp, store)
