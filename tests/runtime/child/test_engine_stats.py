"""The engine's figures: step counters, the report cadence, the node's strict reading of a
``stats`` frame, the scheduler's prefix counters, the loop sending frames, and /metrics."""

from __future__ import annotations

import dataclasses
import math
import queue

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydra_node.admin.metrics import MetricsSources, NodeMetrics, RunnerSample
from hydra_node.routing.router import RouterStatistics
from hydra_node.runtime.child.engine.slots import SlotConfig, SlotScheduler
from hydra_node.runtime.child.stats import EngineStatistics, StatsCadence, StepCounters
from hydra_node.runtime.child.channel import (
    FrameDecoder,
    RunnerProtocolError,
    encode_frame,
    engine_stats_from_wire,
)
from hydra_node.runtime.child.engine_loop import run_engine_loop

GOOD = EngineStatistics(
    n_slots=4,
    ctx_per_slot=512,
    steps=40,
    batch_last=3,
    batch_mean=2.5,
    active=3,
    waiting=1,
    free_slots=1,
    kv_used=700,
    kv_budget=2048,
    prefill_tokens_per_s=1234.5,
    decode_tokens_per_s=88.0,
    prefix_hits=2,
    prefix_misses=5,
    prefix_reused_tokens=31,
)


# ---- counters and cadence (pure) ------------------------------------------------------
def test_step_counters_give_last_and_windowed_mean_batch_and_busy_time_rates():
    c = StepCounters(window=2)
    assert (c.batch_last, c.batch_mean, c.rates()) == (0, 0.0, (0.0, 0.0))
    c.record(seqs=1, prefill_tokens=100, decode_tokens=0, seconds=0.5)
    c.record(seqs=3, prefill_tokens=10, decode_tokens=2, seconds=0.5)
    assert (c.steps, c.batch_last, c.batch_mean) == (2, 3, 2.0)
    assert c.rates() == (110.0, 4.0)  # decode: 2 tokens over the one step that decoded
    c.record(seqs=4, prefill_tokens=0, decode_tokens=4, seconds=1.0)  # the first step leaves the window
    assert (c.steps, c.batch_mean) == (3, 3.5)
    assert c.rates() == (20.0, 6 / 1.5)
    with pytest.raises(ValueError):
        c.record(seqs=-1, prefill_tokens=0, decode_tokens=0, seconds=0.0)
    with pytest.raises(ValueError):
        StepCounters(window=0)


def test_cadence_waits_for_both_steps_and_seconds_and_reports_going_idle_once():
    cad = StatsCadence(every_steps=4, every_s=0.5)
    assert not cad.due(0, 0.0, idle=True)  # nothing happened yet
    assert not cad.due(3, 10.0, idle=False)  # too few steps
    assert cad.due(4, 0.0, idle=False)  # the first report needs only the steps
    cad.sent(4, 0.0)
    assert not cad.due(20, 0.4, idle=False)  # enough steps, too soon
    assert cad.due(20, 0.5, idle=False)
    cad.sent(20, 0.5)
    assert cad.due(21, 0.6, idle=True)  # went idle: report now, whatever the cadence
    cad.sent(21, 0.6)
    assert not cad.due(21, 9.0, idle=True)  # and only once
    with pytest.raises(ValueError):
        StatsCadence(every_steps=0)


def test_scheduler_counts_prefix_hits_misses_and_reused_tokens():
    s = SlotScheduler(SlotConfig(n_slots=1, n_batch=64, n_ctx=64))
    s.submit(1, [1, 2, 3, 4], 1)
    s.commit(s.plan(), {1: 9})  # prefill + first sample: length 1 reached, released
    s.submit(2, [1, 2, 3, 7], 1)  # shares 3 tokens with the slot's resident prefix
    s.plan()
    st_ = s.statistics()
    assert (st_.prefix_hits, st_.prefix_misses, st_.prefix_reused_tokens) == (1, 1, 3)


# ---- the node's reading of a stats frame ------------------------------------------------
def _roundtrip(msg: dict) -> dict:
    dec = FrameDecoder()
    dec.receive_data(encode_frame(msg))
    return dec.next_message()


def test_a_good_stats_frame_reads_back_through_the_channel_codec():
    assert engine_stats_from_wire(_roundtrip(GOOD.to_wire())) == GOOD
    whole = dataclasses.replace(GOOD, batch_mean=2, decode_tokens_per_s=0)  # ints where floats are fine
    assert engine_stats_from_wire(whole.to_wire()) == whole


@pytest.mark.parametrize(
    "change, words",
    [
        ({"op": "done"}, "where stats were expected"),
        ({"steps": -1}, "'steps'"),
        ({"active": True}, "'active'"),
        ({"kv_used": 2**31}, "'kv_used'"),
        ({"n_slots": 0}, "'n_slots'"),
        ({"n_slots": 65, "free_slots": 62}, "'n_slots'"),
        ({"batch_mean": 4.5}, "'batch_mean'"),
        ({"decode_tokens_per_s": math.inf}, "'decode_tokens_per_s'"),
        ({"prefill_tokens_per_s": "fast"}, "'prefill_tokens_per_s'"),
        ({"prefix_reused_tokens": 2**53 + 1}, "'prefix_reused_tokens'"),
        ({"free_slots": 2}, "contradict"),
        ({"batch_last": 5}, "contradict"),
        ({"kv_used": 4096}, "contradict"),
        ({"extra": 1}, "unknown ['extra']"),
    ],
)
def test_malformed_stats_raise_the_typed_error(change, words):
    with pytest.raises(RunnerProtocolError) as info:
        engine_stats_from_wire({**GOOD.to_wire(), **change})
    assert words in str(info.value) and info.value.status == 502 and info.value.code == "bad_runner_message"


def test_a_missing_field_is_named():
    msg = GOOD.to_wire()
    del msg["free_slots"]
    with pytest.raises(RunnerProtocolError, match="missing \\['free_slots'\\]"):
        engine_stats_from_wire(msg)


_leaves = (
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats() | st.text(max_size=6) | st.binary(max_size=4)
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.sampled_from([*GOOD.to_wire(), "x"]), _leaves)
    | st.fixed_dictionaries({k: st.integers(-2, 70) | st.floats(-1, 70) for k in GOOD.to_wire() if k != "op"}).map(
        lambda d: {"op": "stats", **d}
    )
)
def test_any_map_gives_statistics_or_the_typed_error(msg):
    try:
        got = engine_stats_from_wire(msg)
    except RunnerProtocolError as exc:
        assert exc.status == 502
    else:
        assert isinstance(got, EngineStatistics)
        assert got.active + got.free_slots == got.n_slots and got.kv_used <= got.kv_budget
        assert engine_stats_from_wire(got.to_wire()) == got


# ---- the child's loop sends frames the node accepts ---------------------------------------
class CountingEngine:
    """The loop's view of the engine, busy ``steps`` steps per request, with figures."""

    def __init__(self, steps: int, on_idle):
        self.busy, self.per, self.done, self.on_idle = 0, steps, 0, on_idle

    @property
    def idle(self) -> bool:
        return self.busy == 0

    def submit(self, rid, req, tokens, clock):
        self.busy += self.per

    def cancel(self, rid):
        pass

    def step(self):
        self.busy -= 1
        self.done += 1
        if self.busy == 0:
            self.on_idle()

    def statistics(self) -> EngineStatistics:
        return dataclasses.replace(
            GOOD, steps=self.done, active=0 if self.idle else 1, free_slots=4 if self.idle else 3
        )


def test_the_loop_sends_stats_on_its_cadence_and_when_it_goes_idle():
    work: queue.Queue = queue.Queue(8)
    work.put({"op": "generate", "id": 1, "req": {}})
    sent: list[dict] = []
    ticks = iter(range(1000))
    run_engine_loop(
        CountingEngine(10, on_idle=lambda: work.put(None)),
        work,
        lambda req: [1],
        sent.append,
        cadence=StatsCadence(every_steps=4, every_s=0.0),
        now=lambda: float(next(ticks)),
    )
    figures = [engine_stats_from_wire(_roundtrip(m)) for m in sent]
    assert [f.steps for f in figures] == [4, 8, 10]  # every 4 steps, then the last one on going idle
    assert figures[-1].free_slots == 4 and figures[0].free_slots == 3


# ---- /metrics -------------------------------------------------------------------------------
def test_metrics_export_engine_gauges_per_model_only_where_reported():
    samples = [RunnerSample("m1", 0, 1, 10.0, 0, True, engine=GOOD), RunnerSample("m2", 0, 0, 0.0, 0, True)]
    text = (
        NodeMetrics(MetricsSources(http_requests=dict, runners=lambda: samples, routing=lambda: RouterStatistics(0, 0)))
        .render()
        .decode()
    )
    assert 'hydra_engine_batch_size{model="m1"} 2.5' in text
    assert 'hydra_engine_free_slots{model="m1"} 1.0' in text
    assert 'hydra_engine_kv_cells_used{model="m1"} 700.0' in text
    assert 'hydra_engine_kv_cells_budget{model="m1"} 2048.0' in text
    assert 'hydra_engine_free_slots{model="m2"}' not in text


# ---- free slots in our mesh announcement (protocol/README.md section 11.2) ----------------------
def test_model_entries_carry_optional_bounded_free_slots_and_old_entries_stay_valid():
    from hydra_node.mesh.membership import InvalidMessage, ModelEntry
    from hydra_node.mesh.membership.announcement import MAX_FREE_SLOTS

    assert ModelEntry.from_wire({"id": "m", "state": "ready"}) == ModelEntry("m", "ready", None)  # an older node
    assert ModelEntry("m", "ready").to_wire() == {"id": "m", "state": "ready"}  # unknown: wire unchanged
    entry = ModelEntry("m", "ready", free_slots=3)
    assert entry.to_wire() == {"id": "m", "state": "ready", "free_slots": 3}
    assert ModelEntry.from_wire(entry.to_wire()) == entry
    for bad in (-1, MAX_FREE_SLOTS + 1, True, 1.0, "3"):
        with pytest.raises(InvalidMessage, match="free_slots"):
            ModelEntry.from_wire({"id": "m", "state": "ready", "free_slots": bad})
    with pytest.raises(InvalidMessage, match="unknown keys"):
        ModelEntry.from_wire({"id": "m", "state": "ready", "slots": 3})


def test_the_supervisor_keeps_good_stats_and_drops_malformed_ones(tmp_path):
    from hydra_node.models import resolve_model
    from hydra_node.runtime.runner.records import RunnerSettings, RunnerState
    from hydra_node.runtime.runner.supervisor import RunnerSupervisor

    sup = RunnerSupervisor(resolve_model(None), tmp_path, RunnerSettings(parallel=4), node_id="n")
    assert sup.status().engine_stats is None and sup.free_slots is None  # not ready: nothing to announce
    sup._take_stats(GOOD.to_wire())
    sup._take_stats({**GOOD.to_wire(), "free_slots": 3})  # contradicts active: dropped, counted
    assert sup.status().engine_stats == GOOD and sup.stats_rejected == 1
    sup.state = RunnerState.LOADING
    sup.state = RunnerState.READY
    assert sup.free_slots == 4  # parallel minus admitted generations
