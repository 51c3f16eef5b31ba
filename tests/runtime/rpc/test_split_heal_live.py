"""A split heals under a live request (issue 26 item 2; docs/splits.md "When a worker dies or stalls").

Two real nodes on loopback: a worker node (``--no-model``, lending its RPC worker) and a
coordinator that hosts the bundled model with ``--split``, so it is split over that worker although
it fits the coordinator. A streaming greedy chat (40 ms per token, so it is still generating) is
cut after 10 chunks by ``kill -9`` of the worker node's process group. The coordinator's runner
loses its worker and its request gets ``split_worker_lost`` (continuable); the split replans
(no worker is left: it runs unsplit on the coordinator, ``local``), and the router's continuation
waits for that runner and goes on there. The client sees one uninterrupted answer equal to an
uninterrupted run of the split; the heal is in ``/api/status`` ``splits.<id>.last_heal`` and on
``/api/events`` (``split.worker_lost``, ``split.healed``).

One host served both parts, so the answer carries no ``hydra_served_by`` (it names hosts only when
more than one served); the router's ``continuations`` counts the continuation.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "routing"))
from continuation_mesh import CUT_AFTER_CHUNKS, MODEL, reference_finish, stream_chat, text_of  # noqa: E402
from events_sse import SseStream  # noqa: E402
from harness import NodeProcess  # noqa: E402

READY_TIMEOUT_S = 90.0


@pytest.fixture
def split_pair(tmp_path):
    cfg = tmp_path / "slow.toml"
    cfg.write_text("[runner]\ninject_token_delay_ms = 40\n")
    worker = NodeProcess(tmp_path / "w", "--no-model", "--max-memory", "0.2", "--name", "w")
    coord = NodeProcess(
        tmp_path / "coord", "--split", "--no-rpc-worker", "--stall-timeout", "30", "--config", str(cfg), "--name", "c"
    )
    try:
        worker.start()
        coord.args += ["--join", worker.invite()]
        coord.start()
        yield worker, coord
    finally:
        for n in (coord, worker):
            n.kill_all()


def _split(st: dict) -> dict:
    return st.get("splits", {}).get(MODEL) or {}


def _workers(st: dict) -> list[str]:
    return [d["peer"] for d in (_split(st).get("plan") or {}).get("devices", []) if d["kind"] == "rpc"]


def test_a_split_whose_worker_is_killed_heals_and_the_stream_goes_on(split_pair):
    worker, coord = split_pair
    worker_id = worker.status()["node_id"]
    st = coord.wait_status(
        lambda s: _split(s).get("state") == "ready" and _workers(s) == [worker_id],
        timeout=READY_TIMEOUT_S,
        what="the model split over the worker",
    )
    assert "last_heal" not in _split(st)
    _, reference = stream_chat(coord.api_port)  # uninterrupted, on the split
    assert reference[-1]["usage"]["completion_tokens"] >= CUT_AFTER_CHUNKS + 10, reference[-1]
    killed: list[float] = []

    def cut(n: int, _headers: dict) -> None:
        if n == CUT_AFTER_CHUNKS and not killed:
            killed.append(time.monotonic())
            worker.kill_all()  # kill -9 of the worker node's process group: the node and its RPC worker

    _, events = stream_chat(coord.api_port, cut)
    assert killed, "the stream ended before the worker could be cut"
    # Greedy: the continued text is the uninterrupted run's, although the second part ran unsplit.
    assert not [e for e in events if "error" in e], events
    assert text_of(events) == text_of(reference)
    (fin,) = [e for e in events if e.get("choices") and e["choices"][0].get("finish_reason")]
    assert fin["choices"][0]["finish_reason"] == reference_finish(reference)
    assert events[-1]["usage"] == reference[-1]["usage"]
    assert "hydra_served_by" not in fin  # one host (this coordinator) served both parts
    st = coord.status()
    assert st["routing"]["continuations"] == 1 and st["routing"]["continuation_failures"] == 0, st["routing"]
    heal = _split(st)["last_heal"]
    assert heal["worker_lost"] == worker_id and heal["replan"] == "local" and heal["workers"] == []
    assert heal["requests_interrupted"] == 1 and heal["requests_continued"] == 1, heal
    assert 0 < heal["reload_s"] < READY_TIMEOUT_S
    assert "lease ended" in heal["reason"] or "membership" in heal["reason"], heal
    assert not _split(st)["split"] and _split(st)["fallback_local"]
    print(f"\nsplit heal: reload_s={heal['reload_s']} replan={heal['replan']} reason={heal['reason']!r}")

    with SseStream(coord.console_port, "/api/events?last_event_id=0&types=split.") as stream:
        seen = stream.events_until(lambda e: e["event"] == "split.healed", "split.healed")
    assert [e["event"] for e in seen] == ["split.worker_lost", "split.healed"], seen
    lost, healed = (e["data"] for e in seen)
    assert lost["peer"] == worker_id and lost["model"] == MODEL and lost["requests_in_flight"] == 1
    assert healed["replan"] == "local" and healed["reload_s"] == heal["reload_s"]
