"""The llama.cpp cell table inside a kv_state is checked before llama.cpp sees it: one sequence of
n cells at positions 0..n-1, the K/V data exactly as long as its header says.  States here are
built in llama.cpp's layout with tiny layers (the live runner test checks states the real model
exported); each defect an attacker could write (negative positions, gaps, duplicates, a count that
is not the prefix's, cells in several sequences, a truncated or extended state) is refused."""

from __future__ import annotations

import struct

import pytest

from hydra_node.runtime.artifacts.kv_cells import SEQ_STATE_MAGIC, CellTable, check_cells, check_state_file
from hydra_node.runtime.artifacts.kv_state import KV_STATE_FILE, KvStateInvalid, write_kv_state
from tests.runtime.artifacts.test_kv_identity import BASE

N_LAYER, K_ROW, V_EL, N_EMBD_V = 2, 8, 2, 4


def section(cells, *, v_trans: int = 1, n_stream: int = 1) -> bytes:
    """One KV cache section as ``llama_kv_cache::state_write`` writes it (``cells``: (pos, seq ids))."""
    out = struct.pack("<II", n_stream, len(cells))
    for pos, seqs in cells:
        out += struct.pack("<iI", pos, len(seqs)) + b"".join(struct.pack("<i", s) for s in seqs)
    n = len(cells)
    out += struct.pack("<II", v_trans, N_LAYER)
    for _ in range(N_LAYER):
        out += struct.pack("<iQ", 1, K_ROW) + b"\x11" * (K_ROW * n)
    for _ in range(N_LAYER):
        if v_trans:
            out += struct.pack("<iII", 1, V_EL, N_EMBD_V) + b"\x22" * (V_EL * N_EMBD_V * n)
        else:
            out += struct.pack("<iQ", 1, V_EL * N_EMBD_V) + b"\x22" * (V_EL * N_EMBD_V * n)
    return out


def state(*sections: bytes, magic: int = SEQ_STATE_MAGIC, version: int = 0) -> bytes:
    return struct.pack("<II", magic, version) + b"".join(sections)


def seq(positions, seqs=(0,)):
    return [(p, list(seqs)) for p in positions]


def test_one_sequence_at_0_to_n_minus_1_is_accepted_in_either_v_layout_and_with_a_sliding_window_section():
    for v_trans in (0, 1):
        s = state(section(seq(range(5)), v_trans=v_trans))
        assert check_cells(s, 5) == CellTable(((0, 4, 5),), len(s))
    swa = state(section(seq(range(6))), section(seq(range(3, 6))))  # the SWA cache keeps the window's tail
    assert check_cells(swa, 6).sections == ((0, 5, 6), (3, 5, 3))
    assert check_cells(memoryview(bytearray(swa)), 6).state_bytes == len(swa)  # any buffer
    assert check_cells(state(section(seq(range(3), seqs=(7,)))), 3).sections == ((0, 2, 3),)  # the exporter's slot
    # a state read from slot 1 says so after the magic (the prompt cache saves every slot's)
    assert check_cells(state(section(seq(range(3), seqs=(1,))), version=1), 3).sections == ((0, 2, 3),)


@pytest.mark.parametrize(
    ("cells", "n_tokens", "why"),
    [
        ([(-1000, [0])] + seq(range(1, 4)), 4, "cell 0 is at position -1000, not 0"),
        (seq([-3, -2, -1, 0]), 4, "position -3"),
        (seq([0, 1, 3, 4]), 4, "cell 2 is at position 3, not 2"),  # a gap
        (seq([0, 1, 1, 2]), 4, "cell 2 is at position 1"),  # a duplicate
        (seq([1, 0, 2, 3]), 4, "cell 0 is at position 1"),  # out of order
        (seq(range(5)), 4, "5 cells for a prefix of 4 tokens"),
        (seq(range(3)), 4, "3 cells for a prefix of 4 tokens"),
        (seq(range(4), seqs=(0, 1)), 4, "belongs to 2 sequences"),
        (seq(range(4), seqs=()), 4, "belongs to 0 sequences"),
        (seq(range(4), seqs=(-5,)), 4, "names sequence -5"),
    ],
)
def test_a_cell_table_that_is_not_one_sequence_of_0_to_n_minus_1_is_refused(cells, n_tokens, why):
    with pytest.raises(KvStateInvalid, match=why) as err:
        check_cells(state(section(cells)), n_tokens)
    assert err.value.code == "kv_state_invalid" and err.value.status == 422


def test_a_malformed_layout_is_refused():
    good = section(seq(range(4)))
    cases = {
        "magic/sequence": state(good, magic=0x12345678),
        "magic/sequence 0xaf143cd8/256": state(good, version=256),  # the source sequence: 0..255
        "no KV cache section": state(),
        "2 streams": state(section(seq(range(4)), n_stream=2)),
        "ends inside its header": state(good)[:20],
        "runs past the end": state(good)[:-1],  # truncated K/V data
        "a layout this runner cannot check": state(good, good, good),  # three sections
        "not a KV cache layout": state(section(seq(range(4)), v_trans=2)),
        "5 cells in a sliding-window section": state(good, section(seq(range(5)))),
    }
    for why, s in cases.items():
        with pytest.raises(KvStateInvalid, match=why):
            check_cells(s, 4)
    with pytest.raises(KvStateInvalid, match="cell 0 is at position 1, not 2"):
        check_cells(state(good, section(seq([1, 3]))), 4)  # a window with a gap
    with pytest.raises(KvStateInvalid):
        check_cells(state(good) + b"\0" * 8, 4)  # bytes after the last section read as a bad one


def test_a_kv_state_file_is_checked_through_a_mapping_of_its_state(tmp_path):
    tokens = tuple(range(1, 5))
    ident = BASE.with_prefix(tokens)
    good, bad = tmp_path / "good" / KV_STATE_FILE, tmp_path / "bad" / KV_STATE_FILE
    for p in (good, bad):
        p.parent.mkdir()
    write_kv_state(good, ident, tokens, state(section(seq(range(4)))))
    write_kv_state(bad, ident, tokens, state(section([(-1000, [0])] + seq(range(1, 4)))))
    assert check_state_file(good).identity == ident
    with pytest.raises(KvStateInvalid, match="position -1000"):
        check_state_file(bad)
