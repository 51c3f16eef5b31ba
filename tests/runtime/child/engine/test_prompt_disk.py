"""The prompt cache's disk tier, its files only (no llama.cpp): at start the directory is read back
into the index, and every file that is not this runner's (another model, KV type or context), is
truncated, corrupt in its header, misnamed or an unfinished write is removed, never indexed; a file
whose state bytes are corrupt is refused when read (docs/prompt-cache.md)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time

import pytest

from hydra_node.runtime.artifacts.kv_identity import KvIdentity, prefix_sha256
from hydra_node.runtime.artifacts.kv_state import KvStateInvalid, write_kv_state
from hydra_node.runtime.artifacts.errors import ChecksumMismatch
from hydra_node.runtime.child.engine.prompt_store import PromptStore, prompt_key
from hydra_node.runtime.child.engine.prompt_tiers import SUFFIX, DiskTier


def _identity(model_sha256: str) -> KvIdentity:
    return KvIdentity(
        model_sha256=model_sha256,
        build="test build",
        architecture="llama",
        tokenizer_sha256="1" * 64,
        n_ctx_seq=2048,
        rope_type=0,
        rope_freq_base=10000.0,
        rope_freq_scale=1.0,
        type_k="f16",
        type_v="f16",
        flash_attention=True,
        n_embd=8,
        n_layer=2,
        n_head=2,
        n_head_kv=1,
        n_tokens=0,
        prefix_sha256=prefix_sha256(()),
    )


def _ready(tier: DiskTier, store: PromptStore) -> None:
    for _ in range(1000):  # the digest thread hashes a small file
        if tier.poll_ready(store):
            return
        time.sleep(0.01)
    raise AssertionError("the disk tier never became ready")


def test_the_index_keeps_this_runners_files_and_removes_foreign_corrupt_and_misnamed_ones(tmp_path):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"weights")
    sha = hashlib.sha256(b"weights").hexdigest()
    own = _identity(sha)
    d = tmp_path / "cache"
    d.mkdir()

    def put(tokens, identity=own, name=None, state=b"s" * 100):
        p = d / (name or prompt_key(tokens) + SUFFIX)
        write_kv_state(p, identity.with_prefix(tokens), tuple(tokens), state)
        return p

    good, older = put((1, 2, 3, 4)), put((5, 6, 7))
    os.utime(older, ns=(1, 1))  # the least recently used
    other_model = put((8, 9), dataclasses.replace(own, model_sha256="0" * 64))
    q8 = put((10, 11), dataclasses.replace(own, type_k="q8_0"))
    other_ctx = put((12, 13), dataclasses.replace(own, n_ctx_seq=4096))
    misnamed = put((14, 15), name="0" * 64 + SUFFIX)
    truncated = put((16, 17))
    truncated.write_bytes(truncated.read_bytes()[:-10])
    garbage = d / ("f" * 64 + SUFFIX)
    garbage.write_bytes(b"not a state")
    unfinished = d / (".x.hykv.123.tmp")
    unfinished.write_bytes(b"half")

    store: PromptStore = PromptStore(0, 10_000, min_tokens=1)
    tier = DiskTier(d, model, None, _identity)
    _ready(tier, store)
    assert sorted(p.name for p in d.iterdir()) == sorted([good.name, older.name])
    for gone in (other_model, q8, other_ctx, misnamed, truncated, garbage, unfinished):
        assert not gone.exists()
    assert tier.removed == 7
    assert store.disk.keys() == [prompt_key((5, 6, 7)), prompt_key((1, 2, 3, 4))]  # oldest first

    # a state whose bytes were changed after it was written is refused when read (its sha256)
    data = bytearray(good.read_bytes())
    data[-1] ^= 0xFF
    good.write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatch):
        tier.read(prompt_key((1, 2, 3, 4)), 4)
    with pytest.raises(KvStateInvalid, match="index says"):
        tier.read(prompt_key((5, 6, 7)), 4)


def test_the_index_keeps_the_most_recent_files_within_the_size(tmp_path):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"w")
    own = _identity(hashlib.sha256(b"w").hexdigest())
    d = tmp_path / "cache"
    d.mkdir()
    paths = []
    for i in range(3):
        tokens = (100 + i, 1, 2)
        p = d / (prompt_key(tokens) + SUFFIX)
        write_kv_state(p, own.with_prefix(tokens), tokens, b"s" * 1000)
        os.utime(p, ns=(i + 1, i + 1))
        paths.append(p)
    size = paths[0].stat().st_size
    store: PromptStore = PromptStore(0, 2 * size, min_tokens=1)
    tier = DiskTier(d, model, None, _identity)
    _ready(tier, store)
    assert tier.flush()
    assert not paths[0].exists() and paths[1].exists() and paths[2].exists()
    assert len(store.disk) == 2 and store.disk.bytes == 2 * size
