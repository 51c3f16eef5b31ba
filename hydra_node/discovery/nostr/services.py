"""Nostr publishing and discovery services for the node (trio, one task per relay).

* :class:`NostrPublisher` signs the current listing every ``interval_s`` (60 s) with a
  ``ttl_s`` (120 s) NIP-40 expiration and keeps it on every relay; ``refresh()``
  republishes at once; when the listing source returns None (e.g. the mesh is full)
  the listing is withdrawn with a NIP-09 deletion.  On shutdown it sends a deletion to
  every relay on fresh connections, in a shielded finally bounded by
  ``deletion_bound_s``.
* :class:`NostrDiscoverer` subscribes to kind 31990 with ``#k = hydra`` (and to Hydra
  deletions), verifies everything, keeps the newest listing per (pubkey, d) and
  counts what it drops.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

import trio

if TYPE_CHECKING:  # nostr-sdk loads on first use (about 19 MB): a node without Nostr never pays
    from nostr_sdk import Event, Keys

from hydra_node.discovery.nostr.events import (
    APP_TAG,
    DELETION_KIND,
    LISTING_KIND,
    Listing,
    ListingContent,
    build_deletion_event,
    build_listing_event,
)
from hydra_node.discovery.nostr.relay import (
    DEFAULT_RELAYS,
    RelayConfig,
    RelayConnection,
    RelayStatistics,
    publish_once,
)
from hydra_node.discovery.nostr.table import ListingTable, TableStatistics
from hydra_node.discovery.nostr.wire import RelayEvent

log = logging.getLogger("hydra.discovery.nostr")

SUBSCRIPTION_ID = "hydra-listings"
QUERY_LIMIT = 100  # events a relay sends back for the initial query (upstream uses 100)
EXPIRY_CHECK_S = 5.0  # how often the discoverer drops expired listings

Clock = Callable[[], float]


@dataclass(frozen=True)
class PublisherConfig:
    relays: tuple[str, ...] = DEFAULT_RELAYS
    interval_s: float = 60.0
    ttl_s: int = 120
    deletion_bound_s: float = 3.0
    relay: RelayConfig = field(default_factory=RelayConfig)


@dataclass(frozen=True)
class DiscovererConfig:
    relays: tuple[str, ...] = DEFAULT_RELAYS
    relay: RelayConfig = field(default_factory=RelayConfig)


@dataclass(frozen=True)
class PublisherStatistics:
    published: int
    withdrawn: int
    current_event_id: str | None
    relays: tuple[RelayStatistics, ...]


@dataclass(frozen=True)
class DiscovererStatistics:
    table: TableStatistics
    relays: tuple[RelayStatistics, ...]


def listing_filters() -> list[dict]:
    """NIP-01 filters: Hydra listings, and Hydra deletions of listings."""
    return [
        {"kinds": [LISTING_KIND], "#k": [APP_TAG], "limit": QUERY_LIMIT},
        {"kinds": [DELETION_KIND], "#k": [str(LISTING_KIND)], "#t": [APP_TAG], "limit": QUERY_LIMIT},
    ]


class NostrPublisher:
    def __init__(
        self,
        keys: Keys,
        listing: Callable[[], ListingContent | None],
        config: PublisherConfig = PublisherConfig(),
        *,
        clock: Clock = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self._keys = keys
        self._listing = listing
        self.config = config
        self._clock = clock
        rng = rng or random.Random()
        self._relays = [RelayConnection(u, config=config.relay, rng=rng) for u in config.relays]
        self._current: Event | None = None
        self._current_d: str | None = None
        self._last_created = 0
        self._refresh = trio.Event()
        self._published = 0
        self._withdrawn = 0

    @property
    def pubkey(self) -> str:
        return self._keys.public_key().to_hex()

    def refresh(self) -> None:
        """Republish now (the listing changed)."""
        self._refresh.set()

    def statistics(self) -> PublisherStatistics:
        return PublisherStatistics(
            published=self._published,
            withdrawn=self._withdrawn,
            current_event_id=self._current.id().to_hex() if self._current is not None else None,
            relays=tuple(r.statistics() for r in self._relays),
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            for relay in self._relays:
                await nursery.start(relay.run)
            try:
                self._publish_now()
                task_status.started()
                while True:
                    with trio.move_on_after(self.config.interval_s):
                        await self._refresh.wait()
                    self._refresh = trio.Event()
                    self._publish_now()
            finally:
                with trio.CancelScope(shield=True) as scope:
                    scope.deadline = trio.current_time() + self.config.deletion_bound_s
                    await self._delete_on_shutdown()

    def _now(self) -> int:
        now = max(int(self._clock()), self._last_created + 1)  # replacement needs a newer created_at
        self._last_created = now
        return now

    def _publish_now(self) -> None:
        content = self._listing()
        if content is None or (self._current_d is not None and content.d_tag != self._current_d):
            self._withdraw()
        if content is None:
            return
        event = build_listing_event(self._keys, content, now=self._now(), ttl_s=self.config.ttl_s)
        self._current, self._current_d = event, content.d_tag
        for relay in self._relays:
            relay.set_event(("listing", content.d_tag), event)
        self._published += 1
        log.debug("event=nostr_published id=%s d=%s", event.id().to_hex()[:16], content.d_tag)

    def _withdraw(self) -> None:
        if self._current is None:
            return
        deletion = build_deletion_event(self._keys, self._current, now=self._now())
        for relay in self._relays:
            relay.set_event(("listing", self._current_d), None)
            relay.send_once(deletion)
        self._current, self._current_d = None, None
        self._withdrawn += 1

    async def _delete_on_shutdown(self) -> None:
        if self._current is None:
            return
        deletion = build_deletion_event(self._keys, self._current, now=self._now())
        self._current = None

        async def one(url: str) -> None:
            try:
                accepted, message = await publish_once(url, deletion, connect_timeout_s=self.config.deletion_bound_s)
                log.info("event=nostr_deleted url=%s accepted=%s message=%r", url, accepted, message[:100])
            except Exception as exc:  # a dead relay must not delay shutdown beyond the bound
                log.info("event=nostr_delete_failed url=%s error=%r", url, exc)

        async with trio.open_nursery() as nursery:
            for relay in self._relays:
                nursery.start_soon(one, relay.url)


class NostrDiscoverer:
    def __init__(
        self,
        config: DiscovererConfig = DiscovererConfig(),
        *,
        clock: Clock = time.time,
        rng: random.Random | None = None,
        table: ListingTable | None = None,
    ) -> None:
        self.config = config
        self._clock = clock
        rng = rng or random.Random()
        self._table = table or ListingTable()
        self._changed = trio.Event()
        self._state_changed = trio.Event()
        self._relays = [
            RelayConnection(u, config=config.relay, on_event=self._on_event, on_state=self._on_state, rng=rng)
            for u in config.relays
        ]
        for relay in self._relays:
            relay.subscribe(SUBSCRIPTION_ID, listing_filters())

    @property
    def generation(self) -> int:
        return self._table.generation

    def listings(self) -> tuple[Listing, ...]:
        """Live listings, newest first."""
        return self._table.listings(int(self._clock()))

    async def wait_changed(self, generation: int) -> int:
        while self._table.generation == generation:
            await self._changed.wait()
        return self._table.generation

    async def wait_for(self, predicate: Callable[[tuple[Listing, ...]], bool]) -> tuple[Listing, ...]:
        """Wait until ``predicate(listings())`` holds (bound it with a cancel scope)."""
        while True:
            gen = self.generation
            current = self.listings()
            if predicate(current):
                return current
            with trio.move_on_after(EXPIRY_CHECK_S):
                await self.wait_changed(gen)

    def synced(self) -> bool:
        """Every relay has either sent all its stored listings (EOSE) or failed at least once."""
        return all(SUBSCRIPTION_ID in r.synced or r.statistics().failures > 0 for r in self._relays)

    async def wait_synced(self) -> None:
        """Wait until :meth:`synced` (bound it with a cancel scope: a hung relay never answers)."""
        while not self.synced():
            await self._state_changed.wait()

    def statistics(self) -> DiscovererStatistics:
        return DiscovererStatistics(self._table.statistics(), tuple(r.statistics() for r in self._relays))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            for relay in self._relays:
                await nursery.start(relay.run)
            task_status.started()
            while True:
                await trio.sleep(EXPIRY_CHECK_S)
                if self._table.expire(int(self._clock())):
                    self._notify()

    def _on_event(self, url: str, msg: RelayEvent) -> None:
        if self._table.offer_raw(msg.event, now=int(self._clock())):
            self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _on_state(self) -> None:
        self._state_changed.set()
        self._state_changed = trio.Event()


def relays_or_default(relays: Sequence[str]) -> tuple[str, ...]:
    """``--nostr-relay`` values, or the documented public defaults when none were given."""
    return tuple(relays) if relays else DEFAULT_RELAYS
