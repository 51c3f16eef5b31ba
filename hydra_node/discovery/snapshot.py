"""One-shot discovery for ``hydra-node discover [--json]``: browse mDNS and/or Nostr for a while.

Invite tokens found on Nostr are public (they are in the listing); LAN adverts carry
only a fingerprint.  The report never contains secrets of ours.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import trio

from hydra_node.discovery.auto import AutoContext, ListingScore, explain
from hydra_node.discovery.mdns.service import MdnsConfig, MdnsService
from hydra_node.discovery.mdns.wire import MdnsAdvert
from hydra_node.discovery.nostr.relay import RelayStatistics
from hydra_node.discovery.nostr.services import DiscovererConfig, NostrDiscoverer
from hydra_node.discovery.nostr.table import TableStatistics

LAN_SETTLE_S = 1.2  # covers the first two queries (0 and 1 s) and their answers


@dataclass(frozen=True)
class DiscoveryReport:
    lan: tuple[MdnsAdvert, ...]
    nostr: tuple[ListingScore, ...]  # every listing, eligible ones first in --auto order
    nostr_table: TableStatistics | None
    relays: tuple[RelayStatistics, ...]


async def discover_once(
    *,
    wait_s: float,
    mdns: MdnsConfig | None = None,
    nostr: DiscovererConfig | None = None,
    context: AutoContext | None = None,
) -> DiscoveryReport:
    """Listen on the sources given (None = skip that source) for at most ``wait_s`` seconds.

    Returns early once every relay has sent its stored listings (or failed) and mDNS has had
    ``LAN_SETTLE_S`` (unicast answers to our first query arrive within milliseconds).
    """
    browser = MdnsService(mdns, None) if mdns is not None else None
    discoverer = NostrDiscoverer(nostr) if nostr is not None else None
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        if browser is not None:
            await nursery.start(browser.run)
        if discoverer is not None:
            await nursery.start(discoverer.run)
        with trio.move_on_after(wait_s):
            if discoverer is not None:
                await discoverer.wait_synced()
            if browser is not None:
                await trio.sleep_until(start + LAN_SETTLE_S)
        lan = browser.adverts() if browser is not None else ()
        listings = discoverer.listings() if discoverer is not None else ()
        stats = discoverer.statistics() if discoverer is not None else None
        nursery.cancel_scope.cancel()
    ctx = context or AutoContext(now=int(time.time()))
    return DiscoveryReport(
        lan=lan,
        nostr=explain(listings, ctx),
        nostr_table=stats.table if stats is not None else None,
        relays=stats.relays if stats is not None else (),
    )


def report_to_json(report: DiscoveryReport) -> dict[str, Any]:
    def advert(a: MdnsAdvert) -> dict[str, Any]:
        return {
            "instance": a.instance,
            "name": a.name,
            "node_id": a.node_id,
            "mesh_id": a.mesh_id,
            "token_fingerprint": a.token_fingerprint,
            "addresses": list(a.addresses),
            "port": a.port,
            "models": list(a.models),
            "node_count": a.node_count,
            "version": a.version,
        }

    def scored(s: ListingScore) -> dict[str, Any]:
        c = s.listing.content
        return {
            "pubkey": s.listing.pubkey,
            "d": s.listing.d,
            "created_at": s.listing.created_at,
            "expires_at": s.listing.expires_at,
            "mesh_id": c.mesh_id,
            "name": c.name,
            "region": c.region,
            "serving": list(c.serving),
            "wanted": list(c.wanted),
            "node_count": c.node_count,
            "client_count": c.client_count,
            "max_clients": c.max_clients,
            "vram_bytes": c.vram_bytes,
            "spare_slots": c.spare_slots,
            "version": c.version,
            "invite_token": c.invite_token,
            "eligible": s.eligible,
            "reason": s.reason,
            "score": s.total,
            "terms": dict(s.terms),
        }

    out: dict[str, Any] = {"lan": [advert(a) for a in report.lan], "nostr": [scored(s) for s in report.nostr]}
    if report.nostr_table is not None:
        t = report.nostr_table
        out["nostr_dropped"] = dict(t.rejected)
        out["relays"] = [
            {"url": r.url, "connected": r.connected, "events_received": r.events_received, "last_error": r.last_error}
            for r in report.relays
        ]
    return out


def format_report(report: DiscoveryReport) -> str:
    lines = [f"LAN (mDNS): {len(report.lan)} node(s)"]
    for a in report.lan:
        lines.append(
            f"  {a.name or a.instance:<20} mesh={a.mesh_id} nodes={a.node_count} "
            f"at {','.join(a.addresses)}:{a.port} models={','.join(a.models) or '-'}"
        )
    lines.append(f"Nostr: {len(report.nostr)} listing(s)")
    for s in report.nostr:
        c = s.listing.content
        verdict = f"score={s.total:.0f}" if s.eligible else f"skipped ({s.reason})"
        lines.append(
            f"  {c.name or c.mesh_id:<20} nodes={c.node_count} serving={','.join(c.serving) or '-'} "
            f"region={c.region or '-'} {verdict}"
        )
    if report.nostr_table is not None and report.nostr_table.rejected:
        dropped = ", ".join(f"{k}={v}" for k, v in report.nostr_table.rejected.items())
        lines.append(f"  dropped: {dropped}")
    for r in report.relays:
        if not r.connected and r.last_error:
            lines.append(f"  relay {r.url}: {r.last_error}")
    return "\n".join(lines)


def discovery_sources(mode: str) -> tuple[bool, bool]:
    """``--mesh-discovery-mode``: ``mdns`` = LAN only, ``nostr`` = Nostr only, ``both``."""
    if mode not in ("mdns", "nostr", "both"):
        raise ValueError(f"discovery mode must be mdns, nostr or both, not {mode!r}")
    return mode in ("mdns", "both"), mode in ("nostr", "both")


__all__ = ("DiscoveryReport", "discover_once", "format_report", "report_to_json", "discovery_sources")
