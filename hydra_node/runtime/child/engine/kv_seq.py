"""One sequence's KV cells out of and into the batch engine's llama.cpp context (runner child only).

:func:`save_cells` reads the cells of a free slot that holds exactly a prefix
(:meth:`~hydra_node.runtime.child.engine.slots.SlotScheduler.holding` chose it and cut its cache to the
prefix; the cells past it are dropped here) with ``llama_state_seq_get_data``;
:func:`load_cells` puts a state into the free slot :meth:`~hydra_node.runtime.child.engine.slots.SlotScheduler.adopt`
chose (after dropping the cells it evicted) with ``llama_state_seq_set_data``, and checks the
sequence then spans exactly positions ``[0, n_tokens)``, so the scheduler's record of the slot's
resident prefix and the cache agree.  Both run between engine steps, on the engine's thread.
The state format is llama.cpp's own (per-layer K and V rows of the sequence's cells, with the cell
positions); which contexts may load it is the compatibility identity's business
(:mod:`hydra_node.runtime.artifacts.kv_identity`).
"""

from __future__ import annotations

import ctypes

__all__ = ["KvCellsError", "load_cells", "save_cells"]


class KvCellsError(RuntimeError):
    """llama.cpp would not save or load a sequence's state (the slot then holds nothing)."""


def _span(engine, slot: int) -> tuple[int, int]:
    ll = engine._ll
    return int(ll.llama_memory_seq_pos_min(engine.mem, slot)), int(ll.llama_memory_seq_pos_max(engine.mem, slot))


def save_cells(engine, slot: int, n_tokens: int) -> tuple[ctypes.Array, int]:
    """(buffer, bytes written) of ``slot``'s state after cutting its cells to ``[0, n_tokens)``."""
    ll = engine._ll
    if not ll.llama_memory_seq_rm(engine.mem, slot, n_tokens, -1):
        raise KvCellsError(f"llama.cpp could not cut slot {slot} to {n_tokens} cells")
    if _span(engine, slot) != (0, n_tokens - 1):
        raise KvCellsError(f"slot {slot} does not hold positions 0..{n_tokens - 1} (it holds {_span(engine, slot)})")
    size = int(ll.llama_state_seq_get_size(engine.ctx, slot))
    buf = (ctypes.c_uint8 * size)()
    got = int(ll.llama_state_seq_get_data(engine.ctx, buf, size, slot))
    if not 0 < got <= size:
        raise KvCellsError(f"llama_state_seq_get_data wrote {got} of {size} bytes")
    return buf, got


def load_cells(engine, slot: int, evicted: list[int], buf, size: int, n_tokens: int) -> None:
    """Load ``size`` bytes of ``buf`` into ``slot`` (its old cells and the ``evicted`` slots' dropped first);
    on failure the slot is left empty, in the cache and in the scheduler, and :class:`KvCellsError` raised."""
    ll = engine._ll
    for s in {*evicted, slot}:
        ll.llama_memory_seq_rm(engine.mem, s, 0, -1)
    got = int(ll.llama_state_seq_set_data(engine.ctx, buf, size, slot))
    why = None
    if got != size:
        why = f"llama_state_seq_set_data read {got} of {size} bytes (see the runner log)"
    elif _span(engine, slot) != (0, n_tokens - 1):
        why = f"the loaded state spans positions {_span(engine, slot)}, not 0..{n_tokens - 1}"
    if why is not None:
        ll.llama_memory_seq_rm(engine.mem, slot, 0, -1)
        engine.sched.forget(slot)
        raise KvCellsError(why)
