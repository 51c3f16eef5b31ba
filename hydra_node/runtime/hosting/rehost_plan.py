"""Which node hosts a model again when it has fewer live hosts than wanted (pure, sans-IO).

Every node runs the same election over the same gossiped view, so every node elects the same
candidates, and only the elected act (docs/models.md "Growing back"):

* **Wanted**: the largest ``min_hosts`` any alive member (or this node's ``[rehost]``) asks for
  (:func:`merge_wanted`); 0 never re-hosts.
* **Live hosts** of a model: alive members announcing it in a hosting state (starting, placing,
  loading, ready, restarting: not failed, stopped nor ``stopping``) or claiming it
  (``extra.rehosting``).
* **Candidates** (:func:`rank_candidates`): alive ``host`` members that offer ``spare`` room for one
  more model and for its size (unknown size: any room), do not host or claim it, and are not in
  back-off for it; ranked standby first, then those holding the file (``models_held`` names its
  sha256 or id; every node holds the bundled model), then the most spare bytes, then a rendezvous
  hash ``sha256(model + node id)``. The first ``min_hosts - live hosts`` are elected.
* **Settle**: :class:`RehostPlanner` acts only once a model has been short for ``settle_s`` in
  this node's view (gossip converges first: no thundering herd).
* **Races**: when the claims and the permanent hosts (hosting without a claim) exceed
  ``min_hosts``, the claimants are ranked standby first, then by the rendezvous hash, and those
  beyond the slots left release their claim (and unload what they loaded).
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from hydra_node.runtime.hosting.rehost_wire import PeerRehost, Wanted

__all__ = [
    "HOSTING_STATES",
    "Action",
    "Decision",
    "MemberView",
    "RehostPlanner",
    "decide",
    "merge_wanted",
    "own_wishes",
    "rank_candidates",
    "rendezvous",
]

#: Announced model states that count as hosting it (a ``stopping`` host is leaving: not counted).
HOSTING_STATES = frozenset({"starting", "placing", "loading", "ready", "restarting"})


class Action(enum.StrEnum):
    NONE = "none"
    SETTLING = "settling"  # we are elected, but the model has not been short for settle_s yet
    CLAIM = "claim"  # we are elected: claim it and host it
    RELEASE = "release"  # our claim lost a race (or the hosts came back): drop it, unload


@dataclass(frozen=True)
class MemberView:
    """One alive-or-not member (this node included) as the election reads it."""

    node_id: str
    role: str = "host"
    alive: bool = True
    #: model ids it announces in a hosting state
    hosting: frozenset[str] = frozenset()
    #: model ids and sha256s of its ``models_held`` (the files it could load without a fetch)
    held: frozenset[str] = frozenset()
    rehost: PeerRehost = field(default_factory=PeerRehost)


@dataclass(frozen=True)
class Decision:
    """The election of one wanted model that is short of hosts (or that we claim)."""

    model: str
    min_hosts: int
    #: live hosts and claimants, sorted
    hosts: tuple[str, ...]
    #: eligible candidates, best first
    candidates: tuple[str, ...]
    elected: tuple[str, ...]
    action: Action = Action.NONE
    #: our place among the candidates (0: first), None when we are not one
    rank: int | None = None


def rendezvous(model: str, node_id: str) -> str:
    """The tie-break every node computes alike: sha256 of the model id and the node id."""
    return hashlib.sha256(f"{model}\0{node_id}".encode()).hexdigest()


def merge_wanted(members: Iterable[MemberView], own: Mapping[str, Wanted]) -> dict[str, Wanted]:
    """model → the largest ``min_hosts`` over the alive members' ``keep_hosted`` and ``own``, with
    the first known ident, sha256 and size."""
    out: dict[str, Wanted] = {}
    sources: list[Wanted] = list(own.values())
    for m in members:
        if m.alive:
            sources.extend(m.rehost.keep)
    for w in sources:
        had = out.get(w.model)
        if had is None:
            out[w.model] = w
            continue
        out[w.model] = Wanted(
            w.model,
            max(had.min_hosts, w.min_hosts),
            had.ident or w.ident,
            had.sha256 or w.sha256,
            had.size_bytes or w.size_bytes,
        )
    return out


def own_wishes(
    min_hosts: Mapping[str, int], recent: Mapping[str, float], *, now_unix: float, keep_recent_s: float, limit: int
) -> dict[str, tuple[int, str]]:
    """model → (hosts, reason) this node asks for: its ``min_hosts`` above 0 (``"min_hosts"``),
    then (``keep_recent_s`` > 0) the models last requested through its API (``recent``: model →
    unix s) within ``keep_recent_s``, most recent first, at 1 host (``"recent"``); a model set to 0
    is never kept by the recent-use policy. At most ``limit`` models."""
    out: dict[str, tuple[int, str]] = {}
    for model, n in min_hosts.items():
        if n > 0 and len(out) < limit:
            out[model] = (n, "min_hosts")
    if keep_recent_s > 0:
        for model, at in sorted(recent.items(), key=lambda kv: -kv[1]):
            if at >= now_unix - keep_recent_s and model not in min_hosts and len(out) < limit:
                out[model] = (1, "recent")
    return out


def _holds(m: MemberView, want: Wanted, bundled_id: str) -> bool:
    return want.model == bundled_id or want.model in m.held or (bool(want.sha256) and want.sha256 in m.held)


def rank_candidates(want: Wanted, members: Sequence[MemberView], now_unix: float, *, bundled_id: str) -> list[str]:
    """The eligible candidates for ``want``, best first (see the module docstring)."""
    ranked = []
    for m in members:
        spare = m.rehost.spare
        if (
            not m.alive
            or m.role != "host"
            or spare is None
            or spare.models <= 0
            or (want.size_bytes and spare.free_bytes < want.size_bytes)
            or want.model in m.hosting
            or want.model in m.rehost.claims
            or m.rehost.failed.get(want.model, 0.0) > now_unix
        ):
            continue
        key = (
            not m.rehost.standby,
            not _holds(m, want, bundled_id),
            -spare.free_bytes,
            rendezvous(want.model, m.node_id),
        )
        ranked.append((key, m.node_id))
    return [node for _, node in sorted(ranked)]


def decide(
    node_id: str,
    members: Sequence[MemberView],
    wanted: Mapping[str, Wanted],
    now_unix: float,
    *,
    bundled_id: str,
    refuse: frozenset[str] = frozenset(),
) -> list[Decision]:
    """The election of every wanted model that is short of hosts or that ``node_id`` claims
    (:attr:`Decision.action` ``claim`` / ``release`` for ``node_id``, never ``settling``).
    ``refuse``: models this node never takes (its own ``min_hosts`` 0)."""
    alive = [m for m in members if m.alive]
    me = next((m for m in alive if m.node_id == node_id), None)
    mine = me.rehost.claims if me is not None else frozenset()
    out = []
    for model in sorted(set(wanted) | set(mine)):
        want = wanted.get(model, Wanted(model, 0))
        hosting = {m.node_id for m in alive if model in m.hosting}
        claimants = {m.node_id for m in alive if model in m.rehost.claims}
        live = hosting | claimants
        if model in mine:
            permanent = hosting - claimants
            slots = max(0, want.min_hosts - len(permanent))
            by_rank = sorted(
                (m for m in alive if m.node_id in claimants),
                key=lambda m: (not m.rehost.standby, rendezvous(model, m.node_id)),
            )
            keep = [m.node_id for m in by_rank[:slots]]
            action = Action.NONE if node_id in keep else Action.RELEASE
            out.append(Decision(model, want.min_hosts, tuple(sorted(live)), (), tuple(keep), action))
            continue
        short = want.min_hosts - len(live)
        if short <= 0:
            continue
        candidates = rank_candidates(want, alive, now_unix, bundled_id=bundled_id)
        elected = candidates[:short]
        rank = candidates.index(node_id) if node_id in candidates else None
        action = Action.CLAIM if node_id in elected and model not in refuse else Action.NONE
        out.append(
            Decision(model, want.min_hosts, tuple(sorted(live)), tuple(candidates), tuple(elected), action, rank)
        )
    return out


class RehostPlanner:
    """:func:`decide` with the settle delay: a ``claim`` only once the model has been short of
    hosts for ``settle_s`` (monotonic seconds) in this node's view; before that, ``settling``."""

    def __init__(self, node_id: str, *, settle_s: float, bundled_id: str) -> None:
        self.node_id = node_id
        self.settle_s = settle_s
        self.bundled_id = bundled_id
        self._short_since: dict[str, float] = {}

    def step(
        self,
        members: Sequence[MemberView],
        wanted: Mapping[str, Wanted],
        *,
        now: float,
        now_unix: float,
        refuse: frozenset[str] = frozenset(),
    ) -> list[Decision]:
        decisions = decide(self.node_id, members, wanted, now_unix, bundled_id=self.bundled_id, refuse=refuse)
        short = {d.model for d in decisions if d.candidates or d.min_hosts > len(d.hosts)}
        self._short_since = {m: self._short_since.get(m, now) for m in short}
        out = []
        for d in decisions:
            if d.action is Action.CLAIM and now - self._short_since[d.model] < self.settle_s:
                d = Decision(d.model, d.min_hosts, d.hosts, d.candidates, d.elected, Action.SETTLING, d.rank)
            out.append(d)
        return out

    def short_for(self, model: str, now: float) -> float | None:
        """How long ``model`` has been short of hosts in our view (None: it is not)."""
        since = self._short_since.get(model)
        return None if since is None else now - since
