"""Where live events come from, without processes: membership (mesh/event_feed.py), hosted models
(runtime/runner/state_events.py) and the router (routing/route_events.py). Virtual time."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
import trio

from hydra_node.eventlog import EventLog
from hydra_node.inference import Finished, GenerationError, GenerationRequest, TextDelta
from hydra_node.mesh.event_feed import MembershipFeed
from hydra_node.mesh.membership import (
    Announcement,
    ModelEntry,
    PeerDied,
    PeerJoined,
    PeerLeft,
    PeerRecovered,
    PeerSuspected,
    PeerUpdated,
)
from hydra_node.routing import SchedulerConfig
from hydra_node.routing.live import LiveScheduling
from hydra_node.routing.route_events import DECISION_INTERVAL_S
from hydra_node.routing.router import Router, RouteTarget
from hydra_node.runtime.runner.records import RunnerState as S
from hydra_node.runtime.runner.state_events import RunnerEvents, runner_state_events

PEER = "c" * 64


def ann(*models: str, seq: int = 1) -> Announcement:
    return Announcement(
        node_id=PEER,
        incarnation=1,
        seq=seq,
        addresses=("ws://127.0.0.1:9",),
        models=tuple(ModelEntry(m, "ready") for m in models),
        extra={"name": "bee"},
    )


# ---- membership ---------------------------------------------------------------------------------


def test_membership_events_become_peer_events_with_models_announced_and_withdrawn():
    feed = MembershipFeed()
    joined = feed.translate(PeerJoined(PEER, 1, ann("a", "b")))
    assert joined == [
        ("peer.joined", {"node_id": PEER, "name": "bee", "addrs": ["ws://127.0.0.1:9"]}),
        ("model.announced", {"model": "a", "node_id": PEER}),
        ("model.announced", {"model": "b", "node_id": PEER}),
    ]
    assert feed.translate(PeerUpdated(PEER, 1, ann("b", "c", seq=2))) == [
        ("model.announced", {"model": "c", "node_id": PEER}),
        ("model.withdrawn", {"model": "a", "node_id": PEER}),
    ]
    assert feed.translate(PeerUpdated(PEER, 1, ann("b", "c", seq=3))) == []  # nothing changed
    assert feed.translate(PeerSuspected(PEER, 1))[0][0] == "peer.suspect"
    assert feed.translate(PeerRecovered(PEER, 2)) == [
        ("peer.alive", {"node_id": PEER, "name": "bee", "addrs": ["ws://127.0.0.1:9"]})
    ]
    dead = feed.translate(PeerDied(PEER, 2))
    assert [k for k, _ in dead] == ["peer.dead", "model.withdrawn", "model.withdrawn"]
    assert dead[0][1]["name"] == "bee"
    assert feed.translate(PeerLeft(PEER, 2)) == [("peer.left", {"node_id": PEER})]  # forgotten once dead


# ---- hosted models ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "old,new,expected",
    [
        (S.LOADING, S.READY, "model.loaded"),
        (S.LOADING, S.FAILED, "model.failed"),
        (S.STOPPED, S.FAILED, "model.failed"),
        (S.RESTARTING, S.LOADING, "runner.restarted"),
        (S.FAILED, S.LOADING, "runner.restarted"),
        (S.RESTARTING, S.PLACING, "runner.restarted"),
        (S.STARTING, S.LOADING, None),
        (S.READY, S.RESTARTING, None),
        (S.PLACING, S.LOADING, None),
        (S.READY, S.STOPPED, None),
    ],
)
def test_runner_state_changes(old, new, expected):
    got = runner_state_events("m", "n", old, new, restarts=3, last_error="exit code -9")
    assert [k for k, _ in got] == ([expected] if expected else [])
    if expected == "runner.restarted":
        assert got[0][1] == {"model": "m", "restarts": 3, "reason": "exit code -9"}
    if expected == "model.failed":
        assert got[0][1] == {"model": "m", "node_id": "n", "error": "exit code -9"}


@dataclass
class Runner:
    model: object
    state: S
    restarts: int = 0
    last_error: str | None = None


@dataclass
class Ref:
    id: str


def test_runner_events_emit_through_the_callable_and_say_when_a_model_leaves():
    log = EventLog(clock=lambda: 1.0)
    events = RunnerEvents("node-1", log.emit)
    events.on_state(Runner(Ref("m"), S.READY), S.LOADING)
    events.unloaded("m")
    assert [(e.type, json.loads(e.data)["model"]) for e in log.recent()] == [
        ("model.loaded", "m"),
        ("model.unloaded", "m"),
    ]
    RunnerEvents("node-1", None).on_state(Runner(Ref("m"), S.READY), S.LOADING)  # no emitter: nothing, no error


# ---- the router ---------------------------------------------------------------------------------


@dataclass
class Host:
    token_s: float
    fail: GenerationError | None = None

    @asynccontextmanager
    async def open(self, req):
        if self.fail is not None:
            raise self.fail

        async def events():
            await trio.sleep(0.2)  # time to first token
            for _ in range(4):
                await trio.sleep(self.token_s)
                yield TextDelta("x")
            yield Finished("length", prompt_tokens=5, completion_tokens=4)

        yield events()


class Source:
    def __init__(self, targets):
        self._targets = targets

    def targets(self):
        return self._targets


def router_with(log: EventLog, *hosts: tuple[str, Host]) -> Router:
    router = Router("me", LiveScheduling(SchedulerConfig.from_mapping({"mode": "active"}), "me"), on_event=log.emit)
    router.add_source(Source([RouteTarget("m", node, False, h.open, 0, 1.0) for node, h in hosts]))
    return router


def req() -> GenerationRequest:
    return GenerationRequest(model="m", kind="chat", messages=(("user", "hi"),), max_tokens=4)


def finished(log: EventLog) -> list[dict]:
    return [json.loads(e.data) for e in log.recent(prefixes=("request.",))]


async def test_request_finished_reports_target_ttft_and_tokens_per_second(autojump_clock):
    log = EventLog(clock=lambda: 1.0)
    router = router_with(log, ("a" * 64, Host(0.1)))
    async with router.generate(req()) as events:
        async for _ in events:
            pass
    [ev] = finished(log)
    # virtual time: 0.2 s + 0.1 s to the first token, then 3 more tokens 0.1 s apart
    assert ev["status"] == "ok" and ev["target"] == "a" * 64 and ev["model"] == "m"
    assert ev["ttft_ms"] == pytest.approx(300, abs=1) and ev["duration_ms"] == pytest.approx(600, abs=1)
    assert ev["completion_tokens"] == 4 and ev["tok_s"] == pytest.approx(10, rel=0.01)


async def test_request_finished_says_error_and_cancelled(autojump_clock):
    log = EventLog(clock=lambda: 1.0)
    broken = router_with(log, ("a" * 64, Host(0.1, fail=GenerationError("boom", code="x", status=400))))
    with pytest.raises(GenerationError):
        async with broken.generate(req()) as events:
            async for _ in events:
                pass
    router = router_with(log, ("b" * 64, Host(0.1)))
    with trio.move_on_after(0.35):  # the caller goes away after the first token
        async with router.generate(req()) as events:
            async for _ in events:
                pass
    errored, cancelled = finished(log)
    assert (errored["status"], errored["target"], errored["ttft_ms"]) == ("error", None, None)
    assert (cancelled["status"], cancelled["target"], cancelled["completion_tokens"]) == ("cancelled", "b" * 64, 0)


async def test_route_decisions_are_sampled_and_carry_the_score_breakdown(autojump_clock):
    log = EventLog(clock=lambda: 1.0)
    router = router_with(log, ("a" * 64, Host(0.01)), ("b" * 64, Host(0.01)))
    for _ in range(3):  # back to back, well inside one sampling interval
        async with router.generate(req()) as events:
            async for _ in events:
                pass
    await trio.sleep(DECISION_INTERVAL_S)
    async with router.generate(req()) as events:
        async for _ in events:
            pass
    decisions = [json.loads(e.data) for e in log.recent(prefixes=("route.",))]
    assert len(decisions) == 2
    d = decisions[0]
    assert d["model"] == "m" and d["mode"] == "active" and d["target"] in ("a" * 64, "b" * 64)
    assert {c["target"] for c in d["candidates"]} == {"a" * 64, "b" * 64}
    assert all(isinstance(c["score"], float) and "queue_ms" in c["terms"] for c in d["candidates"])
    assert d["candidates"][0]["score"] <= d["candidates"][1]["score"]


def test_reporting_never_raises_into_the_service_that_reports():
    from hydra_node.routing.route_events import decision_fields

    class Odd:  # an event whose announcement cannot be read
        peer_id = PEER
        announcement = object()

    assert MembershipFeed().translate(Odd()) == []
    assert decision_fields("m", "me", [], object())["mode"] == "unknown"

    def boom(kind, fields):
        raise RuntimeError("emit failed")

    RunnerEvents("n", boom).on_state(Runner(Ref("m"), S.READY), S.LOADING)  # logged, not raised
