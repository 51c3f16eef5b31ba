"""Peer states and the legal moves between them, as one table.

A peer's state only changes through `transition(state, trigger)`; a move not in the table
raises `LocalMembershipError` naming the state, because the core must never attempt one.
Note what is *absent*: ALIVE has no CONFIRM, so a death claim always passes through SUSPECT
(our own probe, or a suspicion period the peer can refute), and DEAD/LEFT only leave their
tombstone through ALIVE at a higher incarnation (a restart or refutation) or EXPIRE.
"""

from __future__ import annotations

import enum

from hydra_node.mesh.membership.announcement import LocalMembershipError
from hydra_node.statemachine import InvalidTransition, StateTable

__all__ = ["PeerState", "Trigger", "TRANSITIONS", "PEER_MACHINE", "transition", "STATE_RANK", "status_key"]


class PeerState(enum.Enum):
    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"
    UNKNOWN = "unknown"  # not in the table (never heard of, or tombstone expired)

    @property
    def is_member(self) -> bool:
        """Alive or suspect: probed, gossiped to, routable (suspect with care)."""
        return self in (PeerState.ALIVE, PeerState.SUSPECT)

    @property
    def is_tombstone(self) -> bool:
        return self in (PeerState.DEAD, PeerState.LEFT)


class Trigger(enum.Enum):
    ALIVE = "alive"  # an announcement at a newer incarnation (join, restart, refutation), or newer seq
    SUSPECT = "suspect"  # our probe failed, or a suspect/death claim at >= the known incarnation
    CONFIRM = "confirm"  # suspicion timed out, or a death claim corroborated by our own failed probe
    LEAVE = "leave"  # the peer's own leave message
    EXPIRE = "expire"  # tombstone TTL passed; the entry is forgotten


S, T = PeerState, Trigger

TRANSITIONS: dict[PeerState, dict[Trigger, PeerState]] = {
    S.UNKNOWN: {T.ALIVE: S.ALIVE, T.CONFIRM: S.DEAD, T.LEAVE: S.LEFT},
    S.ALIVE: {T.ALIVE: S.ALIVE, T.SUSPECT: S.SUSPECT, T.LEAVE: S.LEFT},
    S.SUSPECT: {T.ALIVE: S.ALIVE, T.SUSPECT: S.SUSPECT, T.CONFIRM: S.DEAD, T.LEAVE: S.LEFT},
    S.DEAD: {T.ALIVE: S.ALIVE, T.LEAVE: S.LEFT, T.EXPIRE: S.UNKNOWN},
    S.LEFT: {T.ALIVE: S.ALIVE, T.CONFIRM: S.DEAD, T.EXPIRE: S.UNKNOWN},  # CONFIRM: a later life died
}
PEER_MACHINE = StateTable("peer", TRANSITIONS)

# Precedence at equal incarnation: a later claim about the same life wins.
STATE_RANK = {S.ALIVE: 0, S.SUSPECT: 1, S.DEAD: 2, S.LEFT: 3}


def transition(state: PeerState, trigger: Trigger) -> PeerState:
    """The next state, or LocalMembershipError if the table has no such move."""
    try:
        return PEER_MACHINE.next(state, trigger)
    except InvalidTransition as exc:
        raise LocalMembershipError(f"no move {trigger.value!r} from state {state.value!r}") from exc


def status_key(incarnation: int, state: PeerState) -> tuple[int, int]:
    """Total order of status claims: incarnation first, then state precedence."""
    return (incarnation, STATE_RANK[state])
