"""GossipService: three trio drivers wired in memory, on trio's autojump clock."""

from __future__ import annotations

import random
import time

import cbor2
import pytest
import trio

from hydra_node.mesh.gossip import GossipService
from hydra_node.mesh.membership import (
    Announcement,
    LocalMembershipError,
    Membership,
    MembershipConfig,
    PeerDied,
    PeerJoined,
    PeerLeft,
    PeerUpdated,
)

IDS = ("n0", "n1", "n2")
BOUND = MembershipConfig().detection_bound(dissemination=1.0)


class MemoryMesh:
    """Services sending CBOR-encoded wire dicts to each other with 1 ms latency."""

    def __init__(self, *, refuse: bool = False) -> None:
        self.services: dict[str, GossipService] = {}
        self.scopes: dict[str, trio.CancelScope] = {}
        self.killed: set[str] = set()
        self.refuse = refuse  # killed peers refuse connections (RST) instead of going silent
        self.events: dict[str, list[tuple[float, object]]] = {i: [] for i in IDS}

    def sender(self, me: str):
        async def send(to: str, wire: dict) -> None:
            data = cbor2.dumps(wire, canonical=True)
            await trio.sleep(0.001)
            if to in self.killed and self.refuse:
                raise ConnectionRefusedError(f"{to} is down")
            if me in self.killed or to in self.killed:
                return
            await self.services[to].deliver(me, cbor2.loads(data))

        return send

    async def start(self, nursery: trio.Nursery, node: str) -> GossipService:
        core = Membership(
            Announcement(node_id=node, addresses=(f"{node}.lan:7946",)),
            rng=random.Random(node),
            now=trio.current_time(),
        )
        service = GossipService(core, self.sender(node))
        self.services[node] = service
        scope = self.scopes[node] = trio.CancelScope()

        async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
            with scope:
                await service.run(task_status=task_status)

        await nursery.start(run)
        nursery.start_soon(self.collect, node, service)
        return service

    async def collect(self, node: str, service: GossipService) -> None:
        async for event in service.events:
            self.events[node].append((trio.current_time(), event))

    def seen(self, node: str, kind: type, peer: str) -> float | None:
        return next((t for t, e in self.events[node] if isinstance(e, kind) and e.peer_id == peer), None)


async def wait_for(predicate, step: float = 0.05) -> float:
    while not predicate():
        await trio.sleep(step)
    return trio.current_time()


@pytest.mark.parametrize("refuse", [False, True], ids=["silent", "refused"])
async def test_three_services_join_detect_a_kill_and_see_a_leave(instant_clock, refuse: bool) -> None:
    mesh = MemoryMesh(refuse=refuse)
    with trio.fail_after(300):
        async with trio.open_nursery() as nursery:
            for node in IDS:
                await mesh.start(nursery, node)
            mesh.services["n1"].join(["n0"])
            mesh.services["n2"].join(["n0"])
            await wait_for(lambda: all(mesh.seen(a, PeerJoined, b) for a in IDS for b in IDS if a != b))

            n0 = mesh.services["n0"]
            await n0.deliver("n1", {"type": "ping", "probe": "x"})  # junk is counted, not raised
            assert n0.statistics().membership.rejected == {"invalid": 1}
            n0.local_update(Announcement(node_id="n0", queue_depth=3))
            await wait_for(lambda: mesh.seen("n1", PeerUpdated, "n0") and mesh.seen("n2", PeerUpdated, "n0"))
            await trio.sleep(5)

            killed_at = trio.current_time()
            mesh.killed.add("n2")
            mesh.scopes["n2"].cancel()
            await wait_for(lambda: mesh.seen("n0", PeerDied, "n2") and mesh.seen("n1", PeerDied, "n2"))
            for node in ("n0", "n1"):
                assert mesh.seen(node, PeerDied, "n2") - killed_at <= BOUND
            assert not mesh.seen("n0", PeerDied, "n1") and not mesh.seen("n1", PeerDied, "n0")

            left_at = trio.current_time()
            with trio.fail_after(1):
                await mesh.services["n1"].leave()
            await wait_for(lambda: mesh.seen("n0", PeerLeft, "n1"), step=0.001)
            assert mesh.seen("n0", PeerLeft, "n1") - left_at < 0.1

            stats = n0.statistics()
            assert stats.membership.count("dead") == 1 and stats.membership.count("left") == 1
            assert stats.dropped_sends == 0 and stats.dropped_events == 0
            if refuse:
                assert mesh.services["n1"].statistics().failed_sends > 0
            nursery.cancel_scope.cancel()


async def test_service_refuses_input_when_not_running() -> None:
    core = Membership(Announcement(node_id="x"), now=trio.current_time())

    async def send(to: str, wire: dict) -> None:
        raise AssertionError("nothing should be sent")

    service = GossipService(core, send)
    with pytest.raises(LocalMembershipError):
        service.join(["y"])


async def test_a_late_timer_wake_is_reported_to_the_core_as_local_lag() -> None:
    """Real clock: the whole event loop is stuck (as on an overloaded host) past a deadline."""
    core = Membership(Announcement(node_id="x"), now=trio.current_time())

    async def send(to: str, wire: dict) -> None:
        pass

    service = GossipService(core, send)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            assert service.statistics().late_wakes == 0
            # the event loop blocked on purpose: the service must notice the late wake
            time.sleep(max(0.0, core.next_deadline() - trio.current_time()) + 0.4)  # noqa: ASYNC251
            await trio.sleep(0.05)
            stats = service.statistics()
            assert stats.max_lag_s >= 0.35 and stats.late_wakes >= 1
            assert stats.membership.local_health >= 1  # the core widens its timeouts
            assert service.lag_counters()["loop_lag_max_ms"] >= 350
            nursery.cancel_scope.cancel()


async def test_a_slow_send_is_dropped_without_reporting_the_link_down(instant_clock) -> None:
    """A send that outlasts send_timeout (a handshake on a loaded host) is counted as timed out;
    only a send that fails with an error reports the link down (tested above with refuse=True)."""
    mesh = MemoryMesh()
    hanging = {"n1"}
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for node in IDS[:2]:
                await mesh.start(nursery, node)
            real = mesh.services["n0"]._send

            async def send(to: str, wire: dict) -> None:
                if to in hanging:
                    await trio.sleep_forever()
                await real(to, wire)

            mesh.services["n0"]._send = send
            mesh.services["n1"].join(["n0"])
            await wait_for(lambda: mesh.seen("n0", PeerJoined, "n1"))
            await trio.sleep(3)
            stats = mesh.services["n0"].statistics()
            assert stats.timed_out_sends > 0 and stats.failed_sends == 0
            nursery.cancel_scope.cancel()
