"""A stopping node's hand-over (docs/scheduler.md "Hand-over on stop"), in process, virtual time:
the :class:`Handover` phases, its refusal, generations that finish in the grace, generations ended
with ``draining`` and closed where they run, and the node's router continuing its own client's
stream on another target of the same identity after the hand-over."""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
from waiting import wait_until

from inproc_mesh import mesh_member
from hydra_node.inference import Finished, GenerationError, GenerationRequest, TextDelta
from hydra_node.mesh.joining import JoinPlan
from hydra_node.routing.handover import Draining, Handover, HandoverPhase, HandoverRouter
from hydra_node.routing.remote import RemoteGeneration
from hydra_node.routing.router import RouteTarget
from hydra_node.routing.target import TargetState
from hydra_node.models import resolve_model

MODEL = "m"
ME, PEER = "a" * 64, "c" * 64
N = 10
REQ = GenerationRequest(model=MODEL, kind="completion", prompt="hi", max_tokens=N, temperature=0.0)
REFERENCE = "".join(chr(ord("a") + i) for i in range(N))


@dataclass
class Host:
    """Generates tokens ``len(resume_tokens)`` … ``N-1`` (letter i for token i), one per second."""

    opened: int = 0
    closed_with: list = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        self.closed_with = []

    @asynccontextmanager
    async def open(self, req: GenerationRequest):
        self.opened += 1

        async def events():
            start = len(req.resume_tokens)
            for i in range(start, N):
                await trio.sleep(1)
                yield TextDelta(chr(ord("a") + i), tokens=(i,))
            yield Finished("length", prompt_tokens=1, completion_tokens=N - start)

        try:
            yield events()
        except BaseException as exc:
            self.closed_with.append(type(exc).__name__)
            raise
        else:
            self.closed_with.append(None)


async def drain(events) -> str:
    text = ""
    async for ev in events:
        if isinstance(ev, TextDelta):
            text += ev.text
    return text


def test_refusal_only_while_stopping():
    h = Handover(ME)
    assert h.admitting and h.refusal() is None
    h.stop_admitting()
    assert h.phase is HandoverPhase.STOPPING and not h.admitting
    err = h.refusal()
    assert isinstance(err, Draining) and err.code == "draining" and err.status == 503
    assert err.retry_elsewhere  # the requester's router tries another target


async def test_a_generation_that_ends_in_the_grace_completes(autojump_clock):
    h, host = Handover(ME), Host()
    async with trio.open_nursery() as n:
        result: list[str] = []

        async def client() -> None:
            async with h.open(host.open)(REQ) as events:
                result.append(await drain(events))

        n.start_soon(client)
        await trio.sleep(2.5)
        h.stop_admitting()
        with trio.move_on_after(30):
            await h.wait_local_idle()
        assert h.open_generations == 0
    assert result == [REFERENCE] and host.closed_with == [None] and h.handed_over == 0


async def test_hand_over_ends_a_running_generation_with_draining_and_closes_it(autojump_clock):
    h, host = Handover(ME), Host()
    got: list = []
    async with trio.open_nursery() as n:

        async def client() -> None:
            text = ""
            try:
                async with h.open(host.open)(REQ) as events:
                    async for ev in events:
                        text += getattr(ev, "text", "")
            except GenerationError as exc:
                got.append((text, exc.code, exc.status, exc.retryable))

        n.start_soon(client)
        await trio.sleep(3.5)  # three tokens out, the fourth being generated
        h.stop_admitting()
        h.hand_over()
    assert got == [("abc", "draining", 503, True)]
    assert host.closed_with == ["Draining"]  # the runner's generation was left (cancelled there)
    assert h.handed_over == 1 and h.open_generations == 0
    with pytest.raises(Draining):  # nothing new opens once handing over
        async with h.open(host.open)(REQ):
            pass
    assert host.opened == 1


async def test_the_nodes_router_continues_its_own_clients_stream_on_a_peer(autojump_clock):
    h, local, peer = Handover(ME), Host(), Host()

    class Source:
        def targets(self) -> list[RouteTarget]:
            return [
                RouteTarget(MODEL, ME, local=True, open=h.open(local.open), identity="i" * 16),
                RouteTarget(MODEL, PEER, local=False, open=peer.open, identity="i" * 16),
            ]

    router = HandoverRouter(ME, handover=h)
    router.add_source(Source())
    out: list = []
    async with trio.open_nursery() as n:

        async def client() -> None:
            async with router.generate(REQ) as events:
                out.append(await drain(events))
                out.append(events.served_by_all)

        n.start_soon(client)
        await trio.sleep(4.5)
        h.hand_over()
        with trio.move_on_after(60):
            await h.wait_routed_idle()  # the stop sequence waits for it before the API drain
        assert out, "the continued stream was still running"
    assert out == [REFERENCE, (ME, PEER)]
    assert local.closed_with == ["Draining"] and peer.opened == 1
    assert router.statistics().continuations == 1


# ---- across a real mesh link (in process): the refusal and the draining error on the wire --------


def mesh_node(home: Path, name: str, models: tuple[str, ...], local_open, handover: Handover | None = None):
    mesh = mesh_member(home, name, models)
    remote = RemoteGeneration(mesh, node_id=mesh.node_id, local_open=local_open)
    if handover is None:
        mesh.handle_stream("generate", remote.serve)
    else:  # as the root wires it (node.py)
        remote.admission = handover.refusal
        mesh.handle_stream("generate", handover.serving(remote.serve))
    return mesh, remote


async def test_a_stopping_host_refuses_new_streams_and_hands_running_ones_over_on_the_wire(
    nursery, tmp_path, autojump_clock
):
    h, model = Handover("h" * 64), Host()
    host, _ = mesh_node(tmp_path / "h", "host", (MODEL,), lambda m: h.open(model.open) if m == MODEL else None, h)
    user, user_remote = mesh_node(tmp_path / "u", "user", (), lambda m: None)
    await nursery.start(host.run, JoinPlan())
    await nursery.start(user.run, JoinPlan.from_tokens([host.invite(600)], time.time()))
    with trio.fail_after(20):
        await wait_until(lambda: user_remote.targets())
        await wait_until(lambda: user.node_id in host.members())
    got: list = []

    async def client() -> None:
        text = ""
        try:
            async with user_remote.open_remote(host.node_id, REQ) as events:
                async for ev in events:
                    text += getattr(ev, "text", "")
        except GenerationError as exc:
            got.append((text, exc.code, exc.status))

    async with trio.open_nursery() as n:
        n.start_soon(client)
        await trio.sleep(3.5)
        h.stop_admitting()
        with pytest.raises(GenerationError) as refused:  # a new stream: refused before its first event
            async with user_remote.open_remote(host.node_id, REQ) as events:
                await events.__anext__()
        h.hand_over()
        with trio.fail_after(10):
            await h.wait_local_idle()
            await h.wait_peers_answered()  # the draining error event was sent before this returns
    assert refused.value.code == "draining" and refused.value.status == 503 and refused.value.retry_elsewhere
    assert got == [("abc", "draining", 503)]  # the running one ended with draining, across the link
    assert model.opened == 1 and model.closed_with == ["Draining"]


def test_a_stopping_node_lists_its_runner_as_not_ready_only_while_a_peer_hosts_the_model(tmp_path):
    from hydra_node.routing.local import LocalRunners
    from hydra_node.runtime.runner.records import RunnerSettings, RunnerState
    from hydra_node.runtime.runner.supervisor import RunnerSupervisor  # here: at module level it marks all live

    runner = RunnerSupervisor(resolve_model(None), tmp_path, RunnerSettings())  # nothing is spawned
    runner.state = RunnerState.LOADING
    runner.state = RunnerState.READY
    h, elsewhere = Handover(ME), {"yes": True}
    local = LocalRunners(ME, {runner.model.id: runner}, handover=h, hosted_elsewhere=lambda m: elsewhere["yes"])
    assert [t.state for t in local.targets()] == [TargetState.READY]
    h.stop_admitting()
    assert [t.state for t in local.targets()] == [TargetState.STOPPING]  # listed, the router goes elsewhere
    elsewhere["yes"] = False
    assert [t.state for t in local.targets()] == [TargetState.READY]  # hosted nowhere else: served here
