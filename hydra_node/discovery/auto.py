"""``--auto`` mesh choice (pure): score Nostr listings and rank them, best first.

Starts from upstream Mesh LLM's ``score_mesh`` and adds what a node can measure.
Every term is reported in :class:`ListingScore` so ``discover --json`` can show why.
The formula is documented in ``docs/discovery.md``; weights are the named constants.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from hydra_node.discovery.nostr.events import APP_TAG, Listing

BASE = 100.0
PUBLIC_MESH = 300.0  # unnamed listing, or named "hydra", or the name asked for
STICKY = 500.0  # the mesh we joined last time
FULL = -1000.0  # kept for the breakdown; full meshes are ineligible
HEADROOM_CAP = 20  # client slots below max_clients, counted up to this
SPARE_SLOT_WEIGHT = 2.0  # per free request slot, up to SPARE_SLOTS_CAP
SPARE_SLOTS_CAP = 20
NODE_WEIGHT = 5.0  # per node, up to NODES_CAP
NODES_CAP = 10
SERVING_WEIGHT = 10.0  # per model served, up to MODELS_CAP (a long list buys nothing more)
MODELS_CAP = 8
WANTED_SERVED_WEIGHT = 40.0  # per model we want that the mesh serves
CAN_HELP_WEIGHT = 15.0  # per model the mesh wants that we can serve
RTT_BEST = 100.0  # bonus at 0 ms, falling by RTT_SLOPE per ms to 0
RTT_SLOPE = 0.5
FRESH_S = 60  # listings are republished every 60 s; older ones lose STALE_WEIGHT per second
STALE_WEIGHT = 1.0
STALE_CAP = 60.0


@dataclass(frozen=True)
class ListingProbe:
    """What the caller measured towards a listing's entry point (None = not probed)."""

    reachable: bool
    rtt_ms: float | None = None


@dataclass(frozen=True)
class AutoContext:
    now: int
    last_mesh_id: str | None = None
    mesh_name: str | None = None  # --mesh-name: only this name is eligible
    wanted_models: frozenset[str] = frozenset()  # what we want to use
    local_models: frozenset[str] = frozenset()  # what we could serve
    probes: Mapping[tuple[str, str], ListingProbe] = field(default_factory=dict)  # by Listing.key


@dataclass(frozen=True)
class ListingScore:
    listing: Listing
    eligible: bool
    reason: str  # why ineligible, "" otherwise
    total: float
    terms: tuple[tuple[str, float], ...]
    rtt_ms: float | None


def score_listing(listing: Listing, ctx: AutoContext) -> ListingScore:
    c = listing.content
    terms: list[tuple[str, float]] = [("base", BASE)]
    reason = ""
    name = (c.name or "").strip()
    if ctx.mesh_name is not None:
        if name.lower() != ctx.mesh_name.strip().lower():
            reason = "name_mismatch"
        else:
            terms.append(("public_mesh", PUBLIC_MESH))
    elif not name or name.lower() == APP_TAG:
        terms.append(("public_mesh", PUBLIC_MESH))
    else:
        reason = "named_mesh_needs_mesh_name"
    if ctx.last_mesh_id is not None and c.mesh_id == ctx.last_mesh_id:
        terms.append(("sticky", STICKY))
    if c.max_clients > 0:
        headroom = c.max_clients - c.client_count
        if headroom <= 0:
            terms.append(("full", FULL))
            reason = reason or "full"
        else:
            terms.append(("headroom", float(min(headroom, HEADROOM_CAP))))
    if c.spare_slots:
        terms.append(("spare_slots", SPARE_SLOT_WEIGHT * min(c.spare_slots, SPARE_SLOTS_CAP)))
    terms.append(("nodes", NODE_WEIGHT * min(c.node_count, NODES_CAP)))
    if c.serving:
        terms.append(("serving", SERVING_WEIGHT * min(len(c.serving), MODELS_CAP)))
    wanted_served = len(ctx.wanted_models & set(c.serving))
    if wanted_served:
        terms.append(("wanted_served", WANTED_SERVED_WEIGHT * wanted_served))
    can_help = len(ctx.local_models & set(c.wanted))
    if can_help:
        terms.append(("can_help", CAN_HELP_WEIGHT * min(can_help, MODELS_CAP)))
    probe = ctx.probes.get(listing.key)
    rtt = None
    if probe is not None:
        if not probe.reachable:
            reason = reason or "unreachable"
        elif probe.rtt_ms is not None:
            rtt = max(0.0, float(probe.rtt_ms))
            terms.append(("rtt", max(0.0, RTT_BEST - RTT_SLOPE * rtt)))
    age = ctx.now - listing.created_at
    if age > FRESH_S:
        terms.append(("stale", -min(STALE_CAP, STALE_WEIGHT * (age - FRESH_S))))
    if listing.expires_at <= ctx.now:
        reason = reason or "expired"
    total = sum(v for _, v in terms)
    if not reason and total <= 0 and ctx.mesh_name is None:
        reason = "score_not_positive"
    return ListingScore(listing, not reason, reason, total, tuple(terms), rtt)


def rank_listings(listings: Iterable[Listing], ctx: AutoContext) -> tuple[ListingScore, ...]:
    """Eligible listings, best first; ties go to lower RTT, more nodes, then (pubkey, d, event id)."""
    scored = [score_listing(x, ctx) for x in listings]
    eligible = [s for s in scored if s.eligible]
    eligible.sort(
        key=lambda s: (
            -s.total,
            s.rtt_ms if s.rtt_ms is not None else float("inf"),
            -s.listing.content.node_count,
            s.listing.key,
            s.listing.event_id,
        )
    )
    return tuple(eligible)


def explain(listings: Iterable[Listing], ctx: AutoContext) -> tuple[ListingScore, ...]:
    """Every listing with its breakdown (eligible ones first, in rank order), for ``discover``."""
    listings = tuple(listings)
    ranked = rank_listings(listings, ctx)
    ranked_ids = {s.listing.event_id for s in ranked}
    rest = sorted(
        (score_listing(x, ctx) for x in listings if x.event_id not in ranked_ids),
        key=lambda s: (s.reason, s.listing.key),
    )
    return ranked + tuple(rest)
