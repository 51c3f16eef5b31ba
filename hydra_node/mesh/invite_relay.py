"""The invite bookkeeping of a running node: issuing, revoking, admission checks, and spreading
revocation lists over the links (the thin trio layer around :mod:`.invites`).

Lists travel on the priority lane as ``{"t": "revocations", "l": <signed list bytes>}``
(protocol/README.md section 6.1). A node sends its own list to every open link when it changes,
sends every list it holds to a link that comes up, and relays a list it accepted (newer than the
one it held) to its other links; version order ends the flood. A list that does not verify, is
for another mesh, is older than the one held (a replay) or differs at the same version is
rejected, logged and counted; the link stays up.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import trio

from hydra_node.mesh.invites import InviteBook, InviteBookError, InviteRecord, RevocationTable, check_invite
from hydra_node.mesh.wire.errors import MeshError, TokenError
from hydra_node.mesh.wire.revocations import RevocationRejected
from hydra_node.mesh.wire.token import InviteToken, TokenUnknown

__all__ = ["InviteService", "InviteStatistics", "REVOCATIONS_MESSAGE", "RELAY_SEND_TIMEOUT_S"]

log = logging.getLogger("hydra.mesh")

REVOCATIONS_MESSAGE = "revocations"
#: Bound on queueing one list on one link (a stuck link must not hold the relay).
RELAY_SEND_TIMEOUT_S = 2.0
#: Rejections logged per code (later ones are only counted), so a noisy member cannot flood the log.
MAX_LOGGED_REJECTIONS = 20


@dataclass(frozen=True)
class InviteStatistics:
    """``/api/status`` ``invites``: our live invites by state, the lists we hold, what we refused."""

    issued: Mapping[str, int]
    lists_held: int
    list_version: int | None
    lists_accepted: int
    lists_rejected: Mapping[str, int]
    admissions_refused: Mapping[str, int]


class InviteService:
    """Issue, revoke and check invites; keep and relay revocation lists. ``enter(...)`` binds it to the
    mesh we are in (its session nursery, the open links, who is a member)."""

    def __init__(self, book: InviteBook, node_id: str, *, wall_clock: Callable[[], float] = time.time) -> None:
        self.book = book
        self.node_id = node_id
        self._clock = wall_clock
        self._mesh_id: str | None = None
        self._table: RevocationTable | None = None
        self._nursery: trio.Nursery | None = None
        self._links: Callable[[], list[Any]] = list
        self._is_member: Callable[[str], bool] = lambda _pid: False
        self._accepted = 0
        self._rejected: Counter[str] = Counter()
        self._refused: Counter[str] = Counter()

    def enter(
        self, mesh_id: str, nursery: trio.Nursery, open_links: Callable[[], list[Any]], is_member: Callable[[str], bool]
    ) -> None:
        try:
            self.book.records(self._clock())  # a corrupt records file is one clear error at start
        except InviteBookError as exc:
            raise MeshError(str(exc)) from None
        self._mesh_id, self._nursery, self._links, self._is_member = mesh_id, nursery, open_links, is_member
        self._table = RevocationTable(mesh_id)

    def leave(self) -> None:
        self._mesh_id = self._table = self._nursery = None

    # ---- operator requests -----------------------------------------------------------------
    def issue(self, addrs: list[str], ttl_s: float, uses: int | None = None) -> str:
        if self._mesh_id is None:
            raise RuntimeError("this node is not in a mesh")
        return self.book.issue(self._mesh_id, addrs, ttl_s, self._clock(), uses)

    def revoke(self, token_or_id: str) -> InviteRecord:
        """Revoke one of our tokens and publish the new list (InviteBookError for a bad id)."""
        rec = self.book.revoke(token_or_id, self._clock())
        self._publish_own()
        return rec

    def records(self) -> list[InviteRecord]:
        return self.book.records(self._clock(), self._mesh_id)

    # ---- admission (called by the handshake, synchronously) ----------------------------------
    def check(self, token: InviteToken) -> None:
        """TokenError (a code the handshake's reject carries) when the token must not admit."""
        try:
            try:
                changed = check_invite(token, own_id=self.node_id, book=self.book, table=self._table, now=self._clock())
            except (InviteBookError, OSError) as exc:  # records unreadable or unwritable: refuse, never crash
                raise TokenUnknown(f"the issuer cannot read or record its invites: {exc}") from None
        except TokenError as exc:
            self._refused[exc.code] += 1
            raise
        if changed:
            self._publish_own()

    # ---- links -----------------------------------------------------------------------------------
    def link_up(self, link: Any) -> None:
        """A link came up: send it every list we hold (ours first)."""
        if self._nursery is None or self._table is None or self._mesh_id is None or link is None:  # (set together)
            return
        own = self.book.revocation_list(self._mesh_id, self._clock())
        lists = ([own] if own is not None else []) + [held.raw for held in self._table.lists()]
        for raw in lists:
            self._nursery.start_soon(self._send, link, raw)

    async def on_message(self, link: Any, body: dict) -> None:
        """``{"t": "revocations", "l": bytes}`` from an authenticated link (never raises)."""
        if self._table is None:
            return
        raw = body.get("l")
        try:
            if set(body) != {"t", "l"} or not isinstance(raw, bytes):
                raise RevocationRejected("a revocations message is exactly {t, l: bytes}", code="malformed")
            new = self._table.offer(raw, is_member=self._is_member, own_id=self.node_id)
        except RevocationRejected as exc:
            self._rejected[exc.code] += 1
            if self._rejected[exc.code] <= MAX_LOGGED_REJECTIONS:
                log.warning(
                    "event=revocations_rejected peer=%s reason=%s detail=%r", link.peer_id[:16], exc.code, str(exc)
                )
            return
        if new is None:
            return
        self._accepted += 1
        log.info(
            "event=revocations_accepted issuer=%s version=%d entries=%d via=%s",
            new.issuer_id[:16],
            new.version,
            len(new.entries),
            link.peer_id[:16],
        )
        self._relay(raw, skip=link.peer_id)
        await trio.lowlevel.checkpoint()

    # ---- status ----------------------------------------------------------------------------------
    def statistics(self) -> InviteStatistics:
        now = self._clock()
        issued = Counter(r.state(now) for r in self.book.records(now, self._mesh_id)) if self._mesh_id else Counter()
        own = self.book.revocation_list(self._mesh_id, now) if self._mesh_id else None
        return InviteStatistics(
            issued=dict(issued),
            lists_held=len(self._table.lists()) if self._table is not None else 0,
            list_version=self.book.list_version if own is not None else None,
            lists_accepted=self._accepted,
            lists_rejected=dict(self._rejected),
            admissions_refused=dict(self._refused),
        )

    # ---- plumbing --------------------------------------------------------------------------------
    def _publish_own(self) -> None:
        if self._mesh_id is None:
            return
        raw = self.book.revocation_list(self._mesh_id, self._clock())
        if raw is not None:
            self._relay(raw, skip=None)

    def _relay(self, raw: bytes, skip: str | None) -> None:
        if self._nursery is None:
            return
        for link in self._links():
            if link.peer_id != skip:
                self._nursery.start_soon(self._send, link, raw)

    async def _send(self, link: Any, raw: bytes) -> None:
        with trio.move_on_after(RELAY_SEND_TIMEOUT_S):
            try:
                await link.send_message({"t": REVOCATIONS_MESSAGE, "l": raw})
            except (MeshError, OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                # the link went down: it gets every list again when it comes back up
                log.debug("event=revocations_send_failed peer=%s error=%r", link.peer_id[:16], exc)
