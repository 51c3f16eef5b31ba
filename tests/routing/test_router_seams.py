"""The router's typed seams: a failure after the first event is marked ``streamed`` (never retried,
its type and fields kept), target states as an enum (a peer's unknown state is listed, never routed
to), local and remote targets. No processes, virtual time."""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import trio

from hydra_node.api.errors import ApiError
from hydra_node.api.router_api import RouterApi
from hydra_node.inference import Finished, GenerationError, GenerationRequest, ModelUnavailable, QueueFull, TextDelta
from hydra_node.routing.local import LocalRunners
from hydra_node.routing.remote import RemoteGeneration
from hydra_node.inference.errors import POISONOUS_CODES, RemoteError
from hydra_node.routing.router import RouteTarget, Router, TargetState
from hydra_node.runtime.runner.records import RunnerCrashed, RunnerStalled, RunnerState

MODEL = "m"
A, B = "a" * 64, "b" * 64
REQ = GenerationRequest(model=MODEL, kind="completion", prompt="hi", max_tokens=4)


@dataclass
class Host:
    """Fails with ``fail`` before its first event, or after ``fail_after`` events."""

    fail: GenerationError | None = None
    fail_after: int | None = None
    opened: int = 0

    @asynccontextmanager
    async def open(self, req: GenerationRequest):
        self.opened += 1
        if self.fail is not None and self.fail_after is None:
            raise self.fail

        async def events():
            for i in range(3):
                if self.fail is not None and i == self.fail_after:
                    raise self.fail
                await trio.sleep(0.01)
                yield TextDelta("x")
            yield Finished("length", prompt_tokens=1, completion_tokens=3)

        yield events()


@dataclass
class Source:
    targets_: list[RouteTarget] = field(default_factory=list)

    def targets(self) -> list[RouteTarget]:
        return self.targets_


def router_of(*targets: RouteTarget) -> Router:
    router = Router("me")
    router.add_source(Source(list(targets)))
    return router


async def run(router: Router, req: GenerationRequest = REQ) -> list:
    async with router.generate(req) as events:
        return [ev async for ev in events]


async def test_a_failure_after_the_first_event_is_streamed_not_retried(autojump_clock):
    err = QueueFull(MODEL)  # retryable, a subclass: both must survive the router
    a, b = Host(fail=err, fail_after=1), Host()
    router = router_of(
        RouteTarget(MODEL, A, False, a.open, rtt_ms=1.0), RouteTarget(MODEL, B, False, b.open, rtt_ms=2.0)
    )
    with pytest.raises(QueueFull) as info:
        await run(router)
    assert info.value is err and info.value.streamed and info.value.retryable
    assert (a.opened, b.opened, router.retries) == (1, 0, 0)
    # the API answers it exactly as it would have before the stream (code, status, message, retry-after)
    api = ApiError.from_generation(info.value)
    fresh = ApiError.from_generation(QueueFull(MODEL))
    assert (api.status, api.code, api.message, api.retry_after) == (
        fresh.status,
        fresh.code,
        fresh.message,
        fresh.retry_after,
    )
    assert api.response().body == fresh.response().body


async def test_a_failure_before_the_first_event_is_retried_unmarked(autojump_clock):
    err = GenerationError("lost", code="peer_lost", status=502, retryable=True)
    a, b = Host(fail=err), Host()
    router = router_of(
        RouteTarget(MODEL, A, False, a.open, rtt_ms=1.0), RouteTarget(MODEL, B, False, b.open, rtt_ms=2.0)
    )
    events = await run(router)
    assert isinstance(events[-1], Finished) and (a.opened, b.opened, router.retries) == (1, 1, 1)
    assert not err.streamed and not GenerationError("fresh").streamed


@pytest.mark.parametrize(
    "err",
    [
        RunnerCrashed("the runner died"),
        RunnerStalled("the runner stopped answering"),
        RemoteError("peer's runner died", code="runner_crashed", status=502, retryable=True),
        RemoteError("peer's runner stalled", code="runner_stalled", status=502, retryable=True),
    ],
)
async def test_a_request_that_crashed_or_stalled_a_runner_is_never_retried_elsewhere(autojump_clock, err):
    a, b = Host(fail=err), Host()
    router = router_of(
        RouteTarget(MODEL, A, False, a.open, rtt_ms=1.0), RouteTarget(MODEL, B, False, b.open, rtt_ms=2.0)
    )
    with pytest.raises(GenerationError) as info:
        await run(router)
    assert info.value is err and err.poisonous and not err.retry_elsewhere
    assert (a.opened, b.opened, router.retries) == (1, 0, 0)  # it would have killed b's runner too


def test_which_failures_may_be_retried_elsewhere():
    assert {RunnerCrashed("x").code, RunnerStalled("x").code} == POISONOUS_CODES
    assert QueueFull(MODEL).retry_elsewhere and ModelUnavailable("x").retry_elsewhere
    assert GenerationError("lost", code="peer_lost", retryable=True).retry_elsewhere
    assert not GenerationError("bad", code="peer_lost").retry_elsewhere  # not retryable
    streamed = QueueFull(MODEL)
    streamed.streamed = True
    assert not streamed.retry_elsewhere and not streamed.poisonous


def test_target_states_cover_the_runner_states_and_unknown_ones_are_safe():
    for s in RunnerState:
        assert TargetState.of(s) == s.value and TargetState.of(s.value) is TargetState(s.value)
    assert TargetState.of("draining") is TargetState.UNKNOWN  # a newer peer's state
    assert TargetState.of("stopping") is TargetState.STOPPING  # a host handing over (routing/handover.py)
    assert TargetState.READY == "ready" and str(TargetState.SUSPECT) == "suspect"


def _member(state: str, role: str = "host"):
    return SimpleNamespace(
        role=role,
        queue_depth=0,
        models=(SimpleNamespace(id=MODEL, state=state, free_slots=1, ident=None),),
        extra={},
        version_key=lambda: (1, 0),
    )


@dataclass
class Mesh:
    members_: dict
    states: dict

    def members(self):
        return self.members_

    def member_states(self, now: float):
        return self.states

    def link(self, peer_id: str):
        return None

    async def link_to(self, peer_id: str):  # pragma: no cover - never dialled here
        raise AssertionError


async def test_remote_targets_map_announced_states(autojump_clock):
    c = "c" * 64
    mesh = Mesh(
        {A: _member("ready"), B: _member("draining"), c: _member("ready")}, {A: "alive", B: "alive", c: "suspect"}
    )
    remote = RemoteGeneration(mesh, node_id="me", local_open=lambda m: None)
    states = {t.node_id: t.state for t in remote.targets()}
    assert states == {A: TargetState.READY, B: TargetState.UNKNOWN, c: TargetState.SUSPECT}
    assert all(type(s) is TargetState for s in states.values())
    router = Router("me")
    router.add_source(remote)
    (listing,) = router.models()
    assert listing.states == {A: "ready", B: "unknown", c: "suspect"}
    assert [t.node_id for t in router.candidates(MODEL)] == [A]  # only the ready one is routed to
    mesh.states[A] = "suspect"
    with pytest.raises(ModelUnavailable) as info:
        await run(router)
    assert f"'{A}': 'suspect'" in info.value.message and f"'{B}': 'unknown'" in info.value.message


def test_local_targets_list_a_restarting_runner_as_loading():
    def runner(model: str, state):
        return SimpleNamespace(
            model=SimpleNamespace(id=model),
            generate=None,
            embeddings=SimpleNamespace(embed=None),
            caps=None,
            tokenize=None,
            queue_depth=0,
            in_flight=0,
            slots=1,
            free_slots=1,
            state=state,
        )

    local = LocalRunners(
        "me",
        {
            "r": runner("r", RunnerState.RESTARTING),
            "ok": runner("ok", RunnerState.READY),
            "p": runner("p", RunnerState.PLACING),
        },
    )
    assert {t.model: t.state for t in local.targets()} == {
        "r": TargetState.LOADING,
        "ok": TargetState.READY,
        "p": TargetState.PLACING,
    }
    assert all(type(t.state) is TargetState for t in local.targets())


def test_the_router_is_a_router_api():
    router: RouterApi = Router("me")  # structurally (mypy checks the annotation)
    assert router.models() == [] and not router.recently_seen(MODEL)
