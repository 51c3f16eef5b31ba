"""Joining a mesh: the plan (invites to be admitted with, members to link with) and its pure planning.

A :class:`JoinPlan` says how to get into (or further into) a mesh. :func:`plan_join` turns it, with
the mesh we are in (or hold a key for), into :class:`JoinSteps`: whether an invite must admit us
first (and into which mesh), and which nodes to dial afterwards. The service runs the steps
(:meth:`hydra_node.mesh.service.MeshService.join`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from hydra_node.mesh.wire.token import InviteToken, parse_invite

__all__ = ["DialCandidate", "JoinFailed", "JoinPlan", "JoinSteps", "PERMANENT_JOIN_ERRORS", "plan_join"]

#: Handshake refusals that retrying cannot fix.
PERMANENT_JOIN_ERRORS = frozenset(
    {
        "token_expired",
        "token_forged",
        "token_foreign_mesh",
        "token_malformed",
        "foreign_mesh",
        "token_revoked",
        "token_used_up",
        "token_issuer_only",
        "token_unknown",
        "admission_refused",
        "rejected_by_peer",
        "generation_mismatch",
        "peer_authentication_failed",
    }
)


class JoinFailed(Exception):
    """The plan could not get us admitted: no address of the invite was reachable, or it was refused."""


@dataclass(frozen=True)
class DialCandidate:
    """A node to link with: its link URLs (tried in order) and, when known, its node id."""

    urls: tuple[str, ...]
    peer_id: str | None = None

    def __post_init__(self) -> None:
        if not self.urls:
            raise ValueError("a dial candidate needs at least one url")


@dataclass(frozen=True)
class JoinPlan:
    """Invites to be admitted with (the first one decides the mesh) and members to link with.

    An empty plan means: stay in (or resume) the mesh whose key we hold, or create one.
    ``admission_timeout_s`` bounds the retries of the admitting invite (None: the service's setting).
    """

    invites: tuple[InviteToken, ...] = ()
    members: tuple[DialCandidate, ...] = ()
    admission_timeout_s: float | None = None

    @classmethod
    def from_tokens(cls, tokens: Iterable[str], now: float, *, admission_timeout_s: float | None = None) -> JoinPlan:
        """A plan from invite token texts (``--join``); TokenError for a malformed or expired one."""
        return cls(invites=tuple(parse_invite(t, now) for t in tokens), admission_timeout_s=admission_timeout_s)


@dataclass(frozen=True)
class JoinSteps:
    """What to do for a plan. ``admit_with``: the invite that must admit us first (None: we are, or
    will be, in ``mesh_id`` already, with ``mesh_id`` None meaning "create a new mesh"). ``dials``: nodes
    to link with afterwards, in order. ``must_reach``: fail unless at least one of them (or the
    admission) gave us a seed. ``conflict``: the plan names another mesh than the one we are in."""

    admit_with: InviteToken | None
    mesh_id: str | None
    dials: tuple[DialCandidate, ...]
    must_reach: bool
    conflict: str | None = None


def plan_join(plan: JoinPlan, *, current_mesh_id: str | None, held_mesh_id: str | None) -> JoinSteps:
    """Plan ``plan`` for a node in ``current_mesh_id`` (None: not in a mesh yet) holding a key for
    ``held_mesh_id`` (None: no key file)."""
    first = plan.invites[0] if plan.invites else None
    if current_mesh_id is not None:
        if first is not None and first.mesh_id != current_mesh_id:
            return JoinSteps(
                None,
                current_mesh_id,
                (),
                must_reach=False,
                conflict=f"this node is already in mesh {current_mesh_id}, not {first.mesh_id}",
            )
        mesh_id: str | None = current_mesh_id
        admit_with = None
    elif first is not None and first.mesh_id != held_mesh_id:
        mesh_id, admit_with = first.mesh_id, first
    else:
        mesh_id, admit_with = held_mesh_id, None
    dials: list[DialCandidate] = []
    seen: set[str] = set()
    for tok in plan.invites:
        # Invites of another mesh cannot link us (their nodes refuse a foreign mesh); the admitting
        # invite's issuer is linked by the admission itself, but dialling it again is harmless (the
        # service skips peers it already has a link to).
        if tok.mesh_id == mesh_id and tok.issuer_id not in seen:
            seen.add(tok.issuer_id)
            dials.append(DialCandidate(tok.urls, tok.issuer_id))
    for cand in plan.members:
        if cand.peer_id is None or cand.peer_id not in seen:
            if cand.peer_id is not None:
                seen.add(cand.peer_id)
            dials.append(cand)
    return JoinSteps(admit_with, mesh_id, tuple(dials), must_reach=bool(plan.invites))
