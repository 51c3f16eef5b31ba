"""Waiting for a target of a model that is coming back (docs/scheduler.md "Waiting for a target"):
the pure "expected back" and wait decision, then the router's wait for a new request and for a
continuation (a local runner that restarts), and a continuation preferring a host with a free slot.
In-process targets (tests/routing/test_continuation_router.py's), virtual time."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
import trio

from test_continuation_router import MODEL, N, REFERENCE, Host, Source, run, text_of

from hydra_node.inference import GenerationError
from hydra_node.routing.router import RouteTarget, Router
from hydra_node.routing.target import TargetState
from hydra_node.routing.target_wait import (
    MeshView,
    Routable,
    WaitOutcome,
    expected_back,
    keep_hosted_models,
    rehosting_models,
    wait_step,
)

ME, A, B = "me" + "0" * 62, "a" * 64, "b" * 64


def target(node: str, state: TargetState, *, local: bool = False, model: str = MODEL) -> RouteTarget:
    return RouteTarget(model, node, local, Host().open, state=state, identity="i1")


NOTHING = MeshView()


def expected(targets=(), view: MeshView = NOTHING, last: Routable | None = None, now: float = 100.0):
    return expected_back(MODEL, targets, view, last_routable=last, now=now, wait_s=60.0)


# ---- pure: expected back ------------------------------------------------------------------------
@pytest.mark.parametrize("state", ["starting", "placing", "loading", "restarting"])
def test_a_runner_on_its_way_to_ready_is_expected_back(state):
    assert "here" in expected([target(ME, TargetState(state), local=True)])
    assert A[:16] in expected([target(A, TargetState(state))])


@pytest.mark.parametrize("state", ["failed", "stopped", "suspect", "unknown", "stopping"])
def test_other_states_alone_are_not(state):
    assert expected([target(ME, TargetState(state), local=True), target(A, TargetState(state))]) is None


def test_a_rehost_claim_or_a_keep_hosted_wish_makes_it_expected_back():
    assert "loading it" in expected(view=MeshView(({"rehosting": [MODEL]},)))
    assert "kept hosted" in expected(view=MeshView(({"keep_hosted": [[MODEL, 1, "", "", 123]]},)))
    assert expected(view=MeshView(({"keep_hosted": [[MODEL, 0, "", "", 123]]},))) is None  # min_hosts 0
    assert expected(view=MeshView(({"rehosting": ["other"]}, {"keep_hosted": [["other", 2]]}))) is None


@pytest.mark.parametrize(
    "extra",
    [
        {"rehosting": MODEL},  # not a list
        {"rehosting": [[MODEL]]},
        {"rehosting": [7, None, ""]},
        {"keep_hosted": MODEL},
        {"keep_hosted": [MODEL, 1]},  # not a list of entries
        {"keep_hosted": [[MODEL]]},  # too short
        {"keep_hosted": [[MODEL, True]]},  # a bool is not a count
        {"keep_hosted": [[MODEL, "1"]]},
        {"keep_hosted": [[MODEL, 1.5]]},
        {"keep_hosted": [[1, 1]]},
        {"keep_hosted": {"m": 1}},
        {"sig": b"x"},
    ],
)
def test_extras_of_another_shape_are_ignored(extra):
    assert MODEL not in rehosting_models(extra) | keep_hosted_models(extra)
    assert expected(view=MeshView((extra,))) is None


def test_a_model_routable_moments_ago_is_expected_back_unless_its_hosts_left_or_its_runner_failed():
    last = Routable(at=50.0, hosts=frozenset({A}))
    assert "50 s ago" in expected(last=last)
    assert expected(last=last, now=111.0) is None  # longer ago than the wait
    assert expected(last=last, view=MeshView(left=frozenset({A}))) is None  # said goodbye
    assert expected([target(ME, TargetState.FAILED, local=True)], last=last) is None  # a crash loop
    assert expected([target(A, TargetState.SUSPECT)], last=last) is not None  # it just died
    here = Routable(at=50.0, hosts=frozenset({ME}), local=frozenset({ME}))
    assert expected(last=here) is None  # unloaded here (its target is gone): a clean leave
    assert expected([target(ME, TargetState.LOADING, local=True)], last=here) is not None  # restarting


def test_the_wait_decision():
    assert wait_step(routable=True, expected=None, waited_s=99, wait_s=60) is WaitOutcome.ROUTED
    assert wait_step(routable=False, expected=None, waited_s=1, wait_s=60) is WaitOutcome.GAVE_UP
    assert wait_step(routable=False, expected="x", waited_s=60, wait_s=60) is WaitOutcome.TIMED_OUT
    assert wait_step(routable=False, expected="x", waited_s=59.9, wait_s=60) is None


# ---- the router: a new request ------------------------------------------------------------------
@dataclass
class Flipping:
    """A source with one target whose state is ``states[i]`` from ``at[i]`` seconds on (virtual time)."""

    t: RouteTarget
    at: tuple[float, ...]
    states: tuple[TargetState, ...]
    t0: float = 0.0

    def targets(self) -> list[RouteTarget]:
        now = trio.current_time() - self.t0
        for at, st in zip(self.at, self.states):
            if now >= at:
                self.t.state = st
        return [self.t]


def router(*sources, wait_s: float = 60.0, node_id: str = ME) -> tuple[Router, list]:
    emitted: list = []
    r = Router(node_id, on_event=lambda k, f: emitted.append((k, f)), target_wait_s=wait_s)
    for s in sources:
        r.add_source(s)
    return r, emitted


async def test_a_request_waits_for_a_loading_runner_and_is_served(autojump_clock):
    host = Host()
    src = Flipping(RouteTarget(MODEL, ME, True, host.open, identity="i1"), (0, 5), (TargetState.LOADING, "ready"))
    src.t0 = trio.current_time()
    r, emitted = router(src)
    events, _, _ = await run(r)
    assert text_of(events) == REFERENCE
    assert trio.current_time() - src.t0 >= 5
    assert [k for k, _ in emitted].count("request.waiting") == 1
    (waiting,) = [f for k, f in emitted if k == "request.waiting"]
    assert waiting["continuation"] is False and "loading" in waiting["why"]
    assert r.statistics().target_waits["routed"] == 1 and r.statistics().no_target == 0


async def test_a_request_that_waited_in_vain_is_a_503_naming_the_wait(autojump_clock):
    src = Source([RouteTarget(MODEL, ME, True, Host().open, state=TargetState.LOADING, identity="i1")])
    r, _ = router(src, wait_s=3)
    t0 = trio.current_time()
    with pytest.raises(GenerationError) as info:
        await run(r)
    assert (info.value.status, info.value.code) == (503, "model_unavailable")
    assert "waited 3 s" in info.value.message and "[scheduler].target_wait_s" in info.value.message
    assert 3 <= trio.current_time() - t0 < 4
    assert r.statistics().target_waits["timed_out"] == 1 and r.statistics().no_target == 1


@pytest.mark.parametrize("wait_s", [0, 60])
async def test_no_wait_when_waiting_is_off_or_the_model_is_not_coming_back(autojump_clock, wait_s):
    state = TargetState.LOADING if wait_s == 0 else TargetState.FAILED
    r, emitted = router(Source([RouteTarget(MODEL, ME, True, Host().open, state=state, identity="i1")]), wait_s=wait_s)
    t0 = trio.current_time()
    with pytest.raises(GenerationError) as info:
        await run(r)
    assert trio.current_time() == t0 and info.value.status == 503
    assert "did not wait" in info.value.message and "[scheduler].target_wait_s" in info.value.message
    assert not [k for k, _ in emitted if k == "request.waiting"]


async def test_the_wait_ends_when_the_client_goes_away(autojump_clock):
    r, _ = router(Source([RouteTarget(MODEL, ME, True, Host().open, state=TargetState.LOADING, identity="i1")]))
    with trio.move_on_after(2):
        await run(r)
    assert r.statistics().target_waits["client_gone"] == 1


# ---- the router: a continuation -----------------------------------------------------------------
def killed() -> GenerationError:
    return GenerationError("runner killed by signal 9", code="runner_killed", status=502, retryable=True)


@dataclass
class Restarting:
    """This node's runner: ready, killed mid-stream by its first generation (then restarting for
    ``restart_s``), then ready again — as routing/local.py lists a supervisor's states."""

    host: Host
    restart_s: float = 5.0
    died_at: float | None = None

    def __post_init__(self) -> None:
        self.t = RouteTarget(MODEL, ME, True, self.open, identity="i1")

    def open(self, req):
        self.host.fail_after = None if self.host.got else 4  # the first generation is cut after 4 deltas
        return self._open(req)

    @asynccontextmanager
    async def _open(self, req):
        try:
            async with self.host.open(req) as events:
                yield events
        except GenerationError:
            self.died_at = trio.current_time()
            raise

    def targets(self) -> list[RouteTarget]:
        now = trio.current_time()
        self.t.state = (
            TargetState.LOADING
            if self.died_at is not None and now - self.died_at < self.restart_s
            else TargetState.READY
        )
        return [self.t]


async def test_a_stream_whose_local_runner_was_killed_waits_for_its_restart_and_continues_there(autojump_clock):
    host = Host(fail=killed)
    src = Restarting(host)
    r, emitted = router(src)
    events, first, everyone = await run(r)
    assert text_of(events) == REFERENCE and events[-1].completion_tokens == N
    assert (first, everyone) == (ME, (ME,))
    assert [len(g.resume_tokens) for g in host.got] == [0, 4]
    assert r.statistics().continuations == 1 and r.statistics().target_waits["routed"] == 1
    (waiting,) = [f for k, f in emitted if k == "request.waiting"]
    assert waiting["continuation"] is True


async def test_a_request_that_waits_twice_is_one_request_waiting_event(autojump_clock):
    host = Host(fail=killed)
    src = Restarting(host, died_at=trio.current_time())  # loading when the request comes, killed mid-stream
    r, emitted = router(src)
    events, _, _ = await run(r)
    assert text_of(events) == REFERENCE and r.statistics().target_waits["routed"] == 2
    assert [k for k, _ in emitted].count("request.waiting") == 1


async def test_a_request_whose_local_runner_dies_before_its_first_event_waits_for_the_restart(autojump_clock):
    host = Host(fail=killed)
    src = Restarting(host)
    first_open = src.open

    def open_(req):
        host.fail_at_open = not host.got  # the runner dies as the first generation opens
        return first_open(req)

    src.t.open = open_
    r, _ = router(src)
    events, _, _ = await run(r)
    assert text_of(events) == REFERENCE and [len(g.resume_tokens) for g in host.got] == [0, 0]
    assert r.statistics().retries == 1 and r.statistics().target_waits["routed"] == 1


async def test_an_unreachable_peer_does_not_use_up_the_one_retry_before_the_first_event(autojump_clock):
    from hydra_node.inference import ModelUnavailable

    def unreachable() -> GenerationError:
        return ModelUnavailable(f"peer {A[:16]} is unreachable: no link to peer {A[:16]}")

    a, b, c = Host(fail_at_open=True, fail=unreachable), Host(fail_at_open=True), Host()
    targets = [
        RouteTarget(MODEL, n, False, h.open, rtt_ms=float(i)) for i, (n, h) in enumerate([(A, a), (B, b), (ME, c)])
    ]
    r, _ = router(Source(targets))
    events, served_by, _ = await run(r)
    assert text_of(events) == REFERENCE and served_by == ME and (len(a.got), len(b.got), len(c.got)) == (1, 1, 1)
    with pytest.raises(GenerationError) as info:  # still one retry for failures that reached a host
        await run(router(Source(targets[1:2] + [RouteTarget(MODEL, "c" * 64, False, b.open)] + targets[2:]))[0])
    assert info.value.code == "peer_lost"


async def test_a_request_whose_only_peer_just_died_waits_for_another_host(autojump_clock):
    from hydra_node.inference import ModelUnavailable

    def unreachable() -> GenerationError:
        return ModelUnavailable(f"peer {A[:16]} is unreachable: no link to peer {A[:16]}")

    dead, rehosted = Host(fail_at_open=True, fail=unreachable), Host(name=B)
    t0 = trio.current_time()

    @dataclass
    class Mesh:  # A died but is still listed ready; B hosts the model from 5 s on (a re-host)
        def targets(self) -> list[RouteTarget]:
            out = [RouteTarget(MODEL, A, False, dead.open, identity="i1")]
            if trio.current_time() - t0 >= 5:
                out.append(RouteTarget(MODEL, B, False, rehosted.open, rtt_ms=5.0, identity="i1"))
            return out

    r, emitted = router(Mesh())
    events, served_by, _ = await run(r)
    assert text_of(events) == REFERENCE and served_by == B and len(dead.got) == 1
    assert trio.current_time() - t0 >= 5 and r.statistics().target_waits["routed"] == 1


async def test_a_peer_unreachable_before_its_relayed_link_is_tried_again_once_linked(autojump_clock):
    """A NATted host is listed (gossip through a relay) before the relayed link to it is up: the
    first open fails unreachable; once linked it serves the request (it used to be skipped for the
    whole wait, and the request waited out target_wait_s)."""
    from hydra_node.inference import ModelUnavailable

    def unreachable() -> GenerationError:
        return ModelUnavailable(f"peer {A[:16]} is unreachable: no link to peer {A[:16]}")

    before, after = Host(fail_at_open=True, fail=unreachable), Host(name=A)
    t0 = trio.current_time()

    @dataclass
    class Mesh:  # the relayed link to A comes up 1 s in
        def targets(self) -> list[RouteTarget]:
            linked = trio.current_time() - t0 >= 1
            host = after if linked else before
            return [RouteTarget(MODEL, A, False, host.open, identity="i1", linked=linked)]

    r, _ = router(Mesh())
    events, served_by, _ = await run(r)
    assert text_of(events) == REFERENCE and served_by == A and (len(before.got), len(after.got)) == (1, 1)
    assert 1 <= trio.current_time() - t0 < 5


async def test_a_remote_host_whose_runner_was_killed_is_not_asked_again(autojump_clock):
    a, b = Host(fail_after=3, fail=killed), Host()
    r, _ = router(Source([RouteTarget(MODEL, A, False, a.open, identity="i1")]), wait_s=2)
    with pytest.raises(GenerationError) as info:
        await run(r)
    assert info.value.code == "runner_killed" and len(a.got) == 1 and not b.got


# ---- a continuation prefers a host with a free slot ---------------------------------------------
async def test_concurrent_continuations_spread_over_hosts_that_announced_one_free_slot(autojump_clock):
    a = Host(fail_after=3)
    b, c = Host(), Host()
    targets = [
        RouteTarget(MODEL, A, False, a.open, rtt_ms=0.0, slots=2, free_slots=2, identity="i1"),
        RouteTarget(MODEL, B, False, b.open, rtt_ms=1.0, slots=1, free_slots=1, identity="i1"),
        RouteTarget(MODEL, "c" * 64, False, c.open, rtt_ms=2.0, slots=1, free_slots=1, identity="i1"),
    ]
    r, _ = router(Source(targets))
    results: list = []

    async def one() -> None:
        results.append(await run(r))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one)
        nursery.start_soon(one)
    assert [text_of(ev) for ev, _, _ in results] == [REFERENCE, REFERENCE]
    assert (len(b.got), len(c.got)) == (1, 1)  # not both behind B's one slot (its announcement lags)


async def test_a_continuation_goes_to_the_busy_host_with_fewer_streams(autojump_clock):
    a, b, c = Host(fail_after=3), Host(), Host()
    targets = [  # B and C announce no free slot; B serves 2 (its slots estimated as 2), C serves 1
        RouteTarget(MODEL, A, False, a.open, rtt_ms=0.0, identity="i1"),
        RouteTarget(MODEL, B, False, b.open, rtt_ms=1.0, queue_depth=2, slots=2, free_slots=0, identity="i1"),
        RouteTarget(MODEL, "c" * 64, False, c.open, rtt_ms=2.0, queue_depth=1, slots=1, free_slots=0, identity="i1"),
    ]
    r, _ = router(Source(targets))
    events, _, _ = await run(r)
    assert text_of(events) == REFERENCE and (len(b.got), len(c.got)) == (0, 1)


async def test_requests_sent_at_once_spread_over_hosts_whose_announcements_lag(autojump_clock):
    a, b = Host(), Host()
    targets = [
        RouteTarget(MODEL, A, False, a.open, rtt_ms=0.0, slots=1, free_slots=1, identity="i1"),
        RouteTarget(MODEL, B, False, b.open, rtt_ms=1.0, slots=1, free_slots=1, identity="i1"),
    ]
    r, _ = router(Source(targets))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, r)
        nursery.start_soon(run, r)
    assert (len(a.got), len(b.got)) == (1, 1)  # not both queued behind A's one slot


# ---- model "mesh" on the chat dialect names its answer's hosts ----------------------------------
@pytest.mark.parametrize("stream", [False, True])
async def test_the_mesh_models_chat_answer_names_every_host_of_a_continued_answer(stream):
    from api_serving import serving
    from test_continuation_router import post, unchunk

    from hydra_node.moa.answers import MoaApi
    from hydra_node.moa.config import MESH_MODEL, MoaSettings
    from hydra_node.moa.mixture import MixtureOfAgents
    from hydra_node.openai.routes import OpenAIApi

    c, d = "c" * 64, "d" * 64
    hosts = {A: Host(name=A, fail_after=5), B: Host(name=B), c: Host(name=c, fail_after=3), d: Host(name=d)}
    r = Router("me", max_continuations=2)
    r.add_source(
        Source(
            [
                RouteTarget(model, node, False, hosts[node].open, rtt_ms=float(i), identity=ident)
                for i, (model, node, ident) in enumerate(
                    [(MODEL, A, "i1"), (MODEL, B, "i1"), ("m2", c, "i2"), ("m2", d, "i2")]
                )
            ]
        )
    )
    moa = MoaApi(MixtureOfAgents(r, MoaSettings(members=(MODEL, "m2")), own_node="me"))
    body = {"model": MESH_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": N, "temperature": 0}
    async with serving(OpenAIApi(r, moa=moa)) as server:
        extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
        head, rest = await post(server.port, dict(body, **extra))
    assert head.startswith("http/1.1 200") and r.statistics().continuations == 2  # each member continued
    if not stream:
        answer = json.loads(rest)
        assert answer["choices"][0]["message"]["content"] == REFERENCE
        assert answer["hydra_served_by"] in ([A, B], [c, d])
        return
    events = [json.loads(line[6:]) for line in unchunk(rest).decode().splitlines() if line.startswith("data: {")]
    (finish,) = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert finish["hydra_served_by"] in ([A, B], [c, d])


def test_waits_are_exported_by_outcome():
    from hydra_node.admin.metrics import MetricsSources, NodeMetrics
    from hydra_node.routing.router import RouterStatistics

    stats = RouterStatistics(retries=0, no_target=0, target_waits={"routed": 3, "timed_out": 1})
    text = NodeMetrics(MetricsSources(http_requests=dict, runners=list, routing=lambda: stats)).render().decode()
    assert 'hydra_route_target_waits_total{outcome="routed"} 3.0' in text
    assert 'hydra_route_target_waits_total{outcome="timed_out"} 1.0' in text
    assert "# TYPE hydra_route_target_waits_total counter" in text


def test_the_config_key():
    from hydra_node.routing.scheduler_config import SchedulerConfig, SchedulerConfigError

    assert (
        SchedulerConfig().target_wait_s == 60 and SchedulerConfig.from_mapping({"target_wait_s": 0}).target_wait_s == 0
    )
    for bad in (-1, 3601, "60", True):
        with pytest.raises(SchedulerConfigError, match=r"\[scheduler\]\.target_wait_s"):
            SchedulerConfig.from_mapping({"target_wait_s": bad})
