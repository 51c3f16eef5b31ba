"""The KV compatibility identity: every field is part of the verdict, the map form is strict, and
model-file digests are remembered per (path, mtime, size)."""

from __future__ import annotations

import dataclasses
import hashlib
import os

import pytest

from hydra_node.runtime.artifacts.kv_identity import (
    FileDigests,
    KvIdentity,
    pack_tokens,
    prefix_sha256,
    unpack_tokens,
)

TOKENS = (1, 504, 2000, 17)
BASE = KvIdentity(
    model_sha256="a" * 64,
    build="llama-cpp-python=0.3.36 llama_version=0.5.0",
    architecture="llama",
    tokenizer_sha256="b" * 64,
    n_ctx_seq=4096,
    rope_type=0,
    rope_freq_base=100000.0,
    rope_freq_scale=1.0,
    type_k="f16",
    type_v="f16",
    flash_attention=True,
    n_embd=576,
    n_layer=30,
    n_head=9,
    n_head_kv=3,
    n_tokens=0,
    prefix_sha256=prefix_sha256(()),
).with_prefix(TOKENS)

#: one different value per field: each alone must be refused, naming exactly that field
CHANGED = {
    "model_sha256": "c" * 64,
    "build": "llama-cpp-python=0.3.37 llama_version=0.5.0",
    "architecture": "qwen3",
    "tokenizer_sha256": "d" * 64,
    "n_ctx_seq": 2048,
    "rope_type": 2,
    "rope_freq_base": 10000.0,
    "rope_freq_scale": 0.5,
    "type_k": "q8_0",
    "type_v": "q8_0",
    "flash_attention": False,
    "n_embd": 960,
    "n_layer": 32,
    "n_head": 15,
    "n_head_kv": 5,
    "n_tokens": 5,
    "prefix_sha256": prefix_sha256((1, 504, 2000, 18)),
}


def test_every_field_has_a_changed_value_in_this_test():
    assert set(CHANGED) == set(KvIdentity.field_names())


@pytest.mark.parametrize("name", sorted(CHANGED))
def test_a_change_in_any_one_field_is_a_mismatch_naming_that_field(name):
    other = dataclasses.replace(BASE, **{name: CHANGED[name]})
    assert BASE.mismatches(other) == [name] and other.mismatches(BASE) == [name]


def test_identical_identities_match_and_several_changes_are_all_named_in_field_order():
    assert BASE.mismatches(KvIdentity.from_mapping(BASE.to_mapping())) == []
    other = dataclasses.replace(BASE, type_v="q4_0", model_sha256="e" * 64, n_layer=1)
    assert BASE.mismatches(other) == ["model_sha256", "type_v", "n_layer"]


def test_the_prefix_is_the_exact_token_ids():
    assert BASE.with_prefix(TOKENS) == BASE
    assert BASE.mismatches(BASE.with_prefix(TOKENS[:-1])) == ["n_tokens", "prefix_sha256"]
    assert BASE.mismatches(BASE.with_prefix((1, 504, 17, 2000))) == ["prefix_sha256"]  # same ids, other order
    assert unpack_tokens(pack_tokens(TOKENS)) == TOKENS
    with pytest.raises(ValueError):
        pack_tokens((1, -1))
    with pytest.raises(ValueError):
        unpack_tokens(b"\x00\x00\x00")


def test_the_map_form_is_strict():
    m = BASE.to_mapping()
    for broken in (
        {k: v for k, v in m.items() if k != "type_k"},
        {**m, "extra": 1},
        {**m, "n_layer": "30"},
        {**m, "flash_attention": 1},
        {**m, "n_embd": True},
        {**m, "model_sha256": "A" * 64},
        {**m, "build": ""},
        {**m, "n_tokens": -1},
        "not a map",
    ):
        with pytest.raises(ValueError):
            KvIdentity.from_mapping(broken)
    # an integral float written as an int (JSON) reads back equal
    assert KvIdentity.from_mapping({**m, "rope_freq_scale": 1}) == BASE


def test_file_digests_hash_a_file_once_per_version_and_persist(tmp_path):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"weights v1")
    store = tmp_path / "kv" / "digests.json"
    d = FileDigests(store)
    assert d.sha256(f) == hashlib.sha256(b"weights v1").hexdigest()
    assert d.sha256(f) == hashlib.sha256(b"weights v1").hexdigest() and d.hashed == 1
    again = FileDigests(store)  # a restarted node reads the table
    assert again.sha256(f) == hashlib.sha256(b"weights v1").hexdigest() and again.hashed == 0
    f.write_bytes(b"weights v2, longer")
    os.utime(f, ns=(1, 1))
    assert again.sha256(f) == hashlib.sha256(b"weights v2, longer").hexdigest() and again.hashed == 1
    store.write_text("{not json")  # a damaged table is only a cache: it is rebuilt
    assert FileDigests(store).sha256(f) == hashlib.sha256(b"weights v2, longer").hexdigest()


def test_file_digests_keep_a_bounded_table(tmp_path):
    d = FileDigests(None, limit=2)
    for i in range(3):
        (tmp_path / f"m{i}").write_bytes(b"%d" % i)
        d.sha256(tmp_path / f"m{i}")
    d.sha256(tmp_path / "m0")  # the oldest was dropped: hashed again
    assert d.hashed == 4
