"""`LinkUpgrader`: moves relayed links to a direct path (trio driver of ``punch.py`` and ``upgrade_plan.py``).

The end that accepted a relayed link drives its upgrade (like DCUtR, where the relayed node starts it):
if the peer announced that it can be dialled (``reach: true``) we dial its addresses directly;
otherwise we hole-punch (``punch.py``: a ``hole_punch`` stream on the relayed link, then a TCP
simultaneous open, ``simopen.py``). A punch connects only to the peer's IP as the relay sees it
(``peer_observed``), never to an IP the peer names: an ``addr`` whose IP differs is refused
(``bad_punch``, counted ``hole_punch_target_refused``), and without ``peer_observed`` (a relay that
does not send it) there is no punch (``no_address``); a direct dial takes only plain ``host:port``
announced addresses. The new link is adopted like any other; the link table keeps a direct link over a relayed one, so the relayed link is closed and its circuit at the relay ends.
Failed attempts follow an :class:`UpgradePlan` (3 attempts a round, rounds backed off, bounded);
meanwhile, and after it gives up, the relayed link keeps working. The other end answers
``hole_punch`` streams (:meth:`LinkUpgrader.on_punch`).
"""

from __future__ import annotations

import ipaddress
import logging
import random
from collections import Counter
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Mapping

import trio

from hydra_node.mesh.link.dialback_policy import DialbackAddressError, parse_host_port
from hydra_node.mesh.link.endpoints import connect_link
from hydra_node.mesh.link.peer_link import LinkSettings, PeerLink
from hydra_node.mesh.link.stream import LinkStream
from hydra_node.mesh.relay.punch import (
    MAX_PUNCH_FRAME_BYTES,
    PunchAddress,
    PunchDecoder,
    PunchProtocolError,
    encode_punch,
    format_addr,
    parse_addr,
    parse_punch_header,
    punch_header,
    sync_delay_s,
)
from hydra_node.mesh.relay.simopen import PunchFailed, bind_punch_socket, run_punched_link, simultaneous_open
from hydra_node.mesh.relay.upgrade_plan import GAVE_UP, UpgradePlan
from hydra_node.mesh.wire.errors import LinkClosed, MeshError

__all__ = ["MAX_CONCURRENT_PUNCHES", "LinkUpgrader", "UpgradeInputs"]

log = logging.getLogger("hydra.mesh.relay")

PUNCH_EXCHANGE_TIMEOUT_S = 5.0
"""Bound on the ``hole_punch`` exchange over the relayed link (header, ``punch``, ``sync``)."""
SYNC_WAIT_S = 5.0
"""How long the answering end waits for ``sync`` after its ``punch``."""
DIRECT_DIAL_TIMEOUT_S = 5.0
"""Bound on dialling a peer that announced it can be dialled (all its addresses)."""
MAX_CONCURRENT_PUNCHES = 4
"""Punches this node answers at once (each holds a bound socket); more are refused (busy)."""
MAX_DIRECT_URLS = 4


class _Refused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


@dataclass(frozen=True)
class UpgradeInputs:
    link_settings: Callable[[], LinkSettings]
    members: Callable[[], Mapping[str, Any]]  # peer id -> Announcement
    current: Callable[[str], PeerLink | None]  # the link table's link to a peer
    adopt: Callable[[PeerLink], None]


class LinkUpgrader:
    def __init__(
        self, enabled: bool, inputs: UpgradeInputs, counters: Counter, *, rng: random.Random | None = None
    ) -> None:
        self.enabled = enabled
        self._in = inputs
        self.counters = counters
        self._rng = rng or random.Random()
        self._observed: dict[str, str] = {}  # peer id -> our public IP as the relay of our link to it sees it
        self._peer_observed: dict[str, str] = {}  # peer id -> its public IP as that relay sees it
        self._nursery: trio.Nursery | None = None
        self._punching = 0

    async def run(self, *, task_status: trio.TaskStatus[LinkUpgrader] = trio.TASK_STATUS_IGNORED) -> None:
        """Holds the upgraded links' tasks (and the upgrades in progress) until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started(self)
            await trio.sleep_forever()

    # ---- relayed links, as the agent sees them come and go -----------------------------------------
    def relayed_link_up(
        self, link: PeerLink, observed: str | None, *, drive: bool, peer_observed: str | None = None
    ) -> None:
        """A relayed link is adopted; ``observed``: our public IP per its relay; ``peer_observed``: the
        peer's (the only host we punch to); ``drive``: we accepted it, so we start the upgrade."""
        if observed is not None:
            self._observed[link.peer_id] = observed
        if peer_observed is not None:
            self._peer_observed[link.peer_id] = peer_observed
        else:  # this relay did not say where the peer is: no punch (never an older relay's word)
            self._peer_observed.pop(link.peer_id, None)
        if drive and self.enabled and self._nursery is not None:
            self._nursery.start_soon(self._drive, link)

    def relayed_link_down(self, link: PeerLink) -> None:
        """A relayed link ended: forget what its relay told us, unless another relayed link replaced it."""
        current = self._in.current(link.peer_id)
        if current is None or current.relay is None:
            self._observed.pop(link.peer_id, None)
            self._peer_observed.pop(link.peer_id, None)

    # ---- the driving end -----------------------------------------------------------------------------
    async def _drive(self, link: PeerLink) -> None:
        peer, plan = link.peer_id, UpgradePlan(trio.current_time())
        while not plan.finished:
            await trio.sleep_until(plan.next_at)
            if link.closed or self._in.current(peer) is not link:
                return  # the relayed link is gone, or another (direct) one replaced it
            now = trio.current_time()
            plan.begin(now)
            method = "dial" if self._direct_urls(peer) else "punch"
            self.counters[f"{'direct_dial' if method == 'dial' else 'hole_punch'}_attempts"] += 1
            try:
                direct = await (self._dial_direct(peer) if method == "dial" else self._punch(link))
            except (_Refused, MeshError, OSError, trio.TooSlowError) as exc:
                if link.closed or self._in.current(peer) is not link:
                    return  # replaced meanwhile (both ends dialled through relays at once): nothing failed
                self._attempt_failed(peer, method, plan, exc)
            else:
                plan.succeeded()
                self._up(direct, method, "initiator", plan.attempts_made)
        if plan.state == GAVE_UP:
            self.counters["upgrades_given_up"] += 1
            log.info(
                "event=hole_punch_gave_up peer=%s attempts=%d reason=%s (the link stays relayed)",
                peer[:16],
                plan.attempts_made,
                plan.last_reason,
            )

    def _attempt_failed(self, peer: str, method: str, plan: UpgradePlan, exc: BaseException) -> None:
        if isinstance(exc, _Refused):
            plan.refused(trio.current_time(), exc.code, self._rng.random())
            self._failed(peer, method, plan, f"refused:{exc.code}", str(exc))
            return
        reason = exc.reason if isinstance(exc, PunchFailed) else getattr(exc, "code", None) or type(exc).__name__
        plan.failed(trio.current_time(), str(reason), self._rng.random())
        self._failed(peer, method, plan, str(reason), str(exc))

    def _failed(self, peer: str, method: str, plan: UpgradePlan, reason: str, detail: str) -> None:
        self.counters["hole_punch_failed" if method == "punch" else "direct_dial_failed"] += 1
        log.info(
            "event=%s peer=%s reason=%s attempt=%d detail=%r next_in_s=%s",
            "hole_punch_failed" if method == "punch" else "direct_dial_failed",
            peer[:16],
            reason,
            plan.attempts_made,
            detail[:200],
            "never" if plan.finished else f"{max(0.0, plan.next_at - trio.current_time()):.1f}",
        )

    def _up(self, direct: PeerLink, method: str, role: str, attempts: int) -> None:
        self.counters["hole_punch_ok" if method == "punch" else "direct_dial_ok"] += 1
        log.info(
            "event=%s peer=%s role=%s attempts=%d",
            "hole_punch_ok" if method == "punch" else "direct_dial_ok",
            direct.peer_id[:16],
            role,
            attempts,
        )
        self._in.adopt(direct)

    def _direct_urls(self, peer: str) -> list[str]:
        ann = self._in.members().get(peer)
        if ann is None or ann.extra.get("reach") is not True:
            return []
        urls = []
        for addr in ann.addresses[:MAX_DIRECT_URLS]:
            scheme, plain = ("wss", addr[len("wss://") :]) if addr.startswith("wss://") else ("ws", addr)
            try:  # a plain host:port only: never a path or query the peer put in its announcement
                host, port = parse_host_port(plain)
            except DialbackAddressError:
                continue
            urls.append(f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}")
        return urls

    async def _dial_direct(self, peer: str) -> PeerLink:
        errors = []
        with trio.move_on_after(DIRECT_DIAL_TIMEOUT_S):
            for url in self._direct_urls(peer):
                try:
                    return await self._start_link(
                        partial(connect_link, url, self._in.link_settings(), expected_peer_id=peer)
                    )
                except (MeshError, OSError) as exc:
                    errors.append(f"{url}: {exc}")
        raise LinkClosed(f"no direct link to {peer[:12]}: {'; '.join(errors) or 'timeout'}", code="unreachable")

    async def _punch(self, link: PeerLink) -> PeerLink:
        observed = self._observed.get(link.peer_id)
        if observed is None or link.peer_id not in self._peer_observed:
            raise _Refused("no_address", "our relay did not tell us our public address or the peer's")
        sock, port = await bind_punch_socket(":" in observed)
        try:
            with trio.fail_after(PUNCH_EXCHANGE_TIMEOUT_S):
                async with link.open_stream(punch_header(format_addr(observed, port))) as stream:
                    sent = trio.current_time()
                    reply = await _read_frame(stream, "punch")
                    if reply["op"] == "refused":
                        raise _Refused(reply["code"], reply["message"])
                    target = self._punch_target(link.peer_id, reply["addr"])  # before sync: no punch at all
                    rtt = trio.current_time() - sent
                    await stream.send(encode_punch("sync"))
                    await stream.send_eof()
                    go_at = trio.current_time() + sync_delay_s(rtt)  # when sync reaches the other end
            await trio.sleep_until(go_at)
        except BaseException:
            sock.close()
            raise
        tcp = await simultaneous_open(sock, target)
        return await self._start_link(partial(run_punched_link, tcp, link.peer_id, self._in.link_settings()))

    # ---- the answering end ---------------------------------------------------------------------------
    async def on_punch(self, link: PeerLink, header: dict, stream: LinkStream) -> None:
        """A ``hole_punch`` stream from the driving end: answer ``punch``, wait for ``sync``, connect."""
        refusal = self._refusal(link, header)
        if refusal is not None:
            self.counters["hole_punch_refused"] += 1
            await stream.send(encode_punch("refused", code=refusal[0], message=refusal[1]))
            return
        try:
            theirs = self._punch_target(link.peer_id, header["addr"])
        except _Refused as exc:
            self.counters["hole_punch_refused"] += 1
            await stream.send(encode_punch("refused", code=exc.code, message=str(exc)[:200]))
            return
        observed = self._observed[link.peer_id]
        sock, port = await bind_punch_socket(":" in observed)
        self._punching += 1
        handed_over = False
        try:
            await stream.send(encode_punch("punch", addr=format_addr(observed, port)))
            with trio.fail_after(SYNC_WAIT_S):
                await _read_frame(stream, "sync")
            self.counters["hole_punch_attempts_answered"] += 1
            # Not in this handler: the relayed link (and this stream) closes when the punched one is adopted.
            self._nursery.start_soon(self._answer, sock, theirs, link.peer_id)  # type: ignore[union-attr]
            handed_over = True
        except (trio.TooSlowError, PunchProtocolError) as exc:
            self.counters["hole_punch_failed"] += 1
            log.info(
                "event=hole_punch_failed peer=%s role=responder reason=no_sync detail=%r", link.peer_id[:16], str(exc)
            )
        finally:
            if not handed_over:
                sock.close()
                self._punching -= 1

    def _refusal(self, link: PeerLink, header: dict) -> tuple[str, str] | None:
        if not self.enabled or self._nursery is None:
            return "disabled", "this node does not hole-punch ([relay] hole_punch = false)"
        if link.relay is None:
            return "not_relayed", "this link is already direct"
        try:
            parse_punch_header(header)
        except PunchProtocolError as exc:
            return "bad_punch", str(exc)[:200]
        if link.peer_id not in self._observed or link.peer_id not in self._peer_observed:
            return "no_address", "our relay did not tell us our public address or yours"
        if self._punching >= MAX_CONCURRENT_PUNCHES:
            return "busy", f"{MAX_CONCURRENT_PUNCHES} punches in progress"
        return None

    def _punch_target(self, peer: str, addr: str) -> PunchAddress:
        """Where to connect for ``peer``'s punch ``addr``: its port, at the IP the relay sees the peer
        at. An ``addr`` naming another IP is someone else's host: _Refused(bad_punch), counted."""
        theirs, seen = parse_addr(addr), self._peer_observed[peer]
        if ipaddress.ip_address(theirs.host) != ipaddress.ip_address(seen):
            self.counters["hole_punch_target_refused"] += 1
            log.info("event=hole_punch_target_refused peer=%s addr=%s relay_observed=%s", peer[:16], addr, seen)
            raise _Refused("bad_punch", f"punch address {addr} is not where the relay sees you ({seen})")
        return PunchAddress(seen, theirs.port)

    async def _answer(self, sock: trio.socket.SocketType, theirs, peer: str) -> None:
        try:
            tcp = await simultaneous_open(sock, theirs)
            direct = await self._start_link(partial(run_punched_link, tcp, peer, self._in.link_settings()))
        except (MeshError, OSError) as exc:
            self.counters["hole_punch_failed"] += 1
            log.info(
                "event=hole_punch_failed peer=%s role=responder reason=%s detail=%r",
                peer[:16],
                getattr(exc, "reason", None) or getattr(exc, "code", type(exc).__name__),
                str(exc)[:200],
            )
        else:
            self._up(direct, "punch", "responder", 1)
        finally:
            self._punching -= 1

    # ---- running the new links -------------------------------------------------------------------------
    async def _start_link(self, factory: Callable[..., Any]) -> PeerLink:
        return await self._nursery.start(self._run_link, factory)  # type: ignore[union-attr]

    @staticmethod
    async def _run_link(
        factory: Callable[..., Any], *, task_status: trio.TaskStatus[PeerLink] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run one upgraded link: a failure before it is up goes to the caller, one after it ends
        that link only (never the upgrader)."""
        status = _StartedFlag(task_status)
        try:
            await factory(task_status=status)
        except (MeshError, OSError) as exc:
            if not status.done:
                raise
            log.warning("event=upgraded_link_failed error=%r", exc)


class _StartedFlag:
    """A task status that remembers whether ``started`` was called."""

    def __init__(self, inner: Any) -> None:
        self._inner, self.done = inner, False

    def started(self, value: Any = None) -> None:
        self.done = True
        self._inner.started(value)


async def _read_frame(stream: LinkStream, expected: str) -> dict[str, Any]:
    decoder, seen = PunchDecoder(), 0
    while True:
        frame = decoder.next_frame(expected)
        if frame is not None:
            return frame
        chunk = await stream.receive()
        seen += len(chunk)
        if not chunk or seen > 2 * MAX_PUNCH_FRAME_BYTES:
            raise PunchProtocolError(f"no {expected!r} frame on the hole_punch stream", code="bad_punch")
        decoder.receive_data(chunk)
