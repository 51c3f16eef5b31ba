"""NIP-01 relay client over trio-websocket (no asyncio anywhere in the node).

:class:`RelayConnection` keeps one relay in the state we want: the replaceable events
we publish (re-sent after every reconnect), a bounded outbox of one-off events and
our subscriptions.  Publishing never blocks: it changes that state and wakes the
writer.  A failed or dead relay is retried with exponential back-off and jitter, so
it costs a sleeping task, never a stalled node.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Hashable, Mapping, Sequence
from urllib.parse import urlsplit

import trio

if TYPE_CHECKING:  # nostr-sdk loads on first use (about 19 MB): a node without Nostr never pays
    from nostr_sdk import Event

from hydra_node.backoff import Backoff
from hydra_node.discovery.nostr._ws import open_relay_websocket
from hydra_node.discovery.nostr.wire import (
    RelayAuth,
    RelayClosed,
    RelayEose,
    RelayEvent,
    RelayNotice,
    RelayOk,
    RelayProtocolError,
    decode_relay_message,
    encode_event,
    encode_req,
)

log = logging.getLogger("hydra.discovery.nostr")

DEFAULT_RELAYS = ("wss://relay.damus.io", "wss://nos.lol", "wss://relay.nostr.band")
MAX_OUTBOX = 16  # one-off events waiting for a connection; the oldest is dropped beyond this
STABLE_SESSION_S = 30.0  # a session this long resets the back-off


class RelaySubscriptionClosed(Exception):
    """The relay closed one of our subscriptions (CLOSED); we reconnect after back-off."""


@dataclass(frozen=True)
class RelayConfig:
    connect_timeout_s: float = 10.0
    disconnect_timeout_s: float = 2.0
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 300.0
    ping_interval_s: float = 60.0  # a websocket ping this often notices a silently dead relay
    ping_timeout_s: float = 20.0


@dataclass(frozen=True)
class RelayStatistics:
    url: str
    connected: bool
    connects: int
    failures: int
    events_sent: int
    ok_accepted: int
    ok_rejected: int
    events_received: int
    notices: int
    protocol_errors: int
    outbox_dropped: int
    last_error: str


def validate_relay_url(url: str) -> str:
    """Relay URLs must be ws:// or wss:// with a host (``--nostr-relay`` is checked with this)."""
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ValueError(f"relay URL must be ws:// or wss:// with a host, not {url!r}")
    return url


def backoff_delay(failures: int, rng: random.Random, config: RelayConfig) -> float:
    """The node's exponential back-off with 'equal jitter': a delay in [d/2, d], d = min(cap, base * 2**n)."""
    d = Backoff(initial_s=config.backoff_base_s, factor=2.0, max_s=config.backoff_cap_s, jitter=0.0).delay(
        failures, 0.0
    )
    return d / 2 + rng.uniform(0, d / 2)


def describe_error(exc: BaseException) -> str:
    """One line for logs and statistics; looks inside exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"[:200]


EventHandler = Callable[[str, RelayEvent], None]


class RelayConnection:
    def __init__(
        self,
        url: str,
        *,
        config: RelayConfig = RelayConfig(),
        on_event: EventHandler | None = None,
        on_state: Callable[[], None] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.url = validate_relay_url(url)
        self.config = config
        self._on_event = on_event
        self._on_state = on_state
        self._rng = rng or random.Random()
        self._desired: dict[Hashable, Event] = {}
        self._dirty: set[Hashable] = set()
        self._outbox: deque[Event] = deque()
        self._subs: dict[str, list[Mapping[str, Any]]] = {}
        self._subs_sent: set[str] = set()
        self._wake = trio.Event()
        self.connected = False
        self.synced: set[str] = set()  # subscriptions whose stored events all arrived (EOSE) this session
        self._failures = 0
        self._n = dict.fromkeys(
            (
                "connects",
                "failures",
                "events_sent",
                "ok_accepted",
                "ok_rejected",
                "events_received",
                "notices",
                "protocol_errors",
                "outbox_dropped",
            ),
            0,
        )
        self._last_error = ""

    # ------------------------------------------------------------ state changes (never block)

    def set_event(self, key: Hashable, event: Event | None) -> None:
        """Keep ``event`` published under ``key`` (re-sent on reconnect); None forgets the key."""
        if event is None:
            self._desired.pop(key, None)
            self._dirty.discard(key)
        else:
            self._desired[key] = event
            self._dirty.add(key)
        self._wake.set()

    def send_once(self, event: Event) -> None:
        if len(self._outbox) >= MAX_OUTBOX:
            self._outbox.popleft()
            self._n["outbox_dropped"] += 1
        self._outbox.append(event)
        self._wake.set()

    def subscribe(self, subscription_id: str, filters: Sequence[Mapping[str, Any]]) -> None:
        self._subs[subscription_id] = list(filters)
        self._subs_sent.discard(subscription_id)
        self._wake.set()

    def statistics(self) -> RelayStatistics:
        return RelayStatistics(url=self.url, connected=self.connected, last_error=self._last_error, **self._n)

    # ------------------------------------------------------------ driver

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, serve, and reconnect forever (until cancelled)."""
        task_status.started()
        while True:
            started = trio.current_time()
            try:
                await self._session()
            except Exception as exc:  # the boundary to an untrusted remote: map every failure to a retry
                self._last_error = describe_error(exc)
                log.info("event=relay_failed url=%s error=%r", self.url, self._last_error)
            finally:
                self.connected = False
                self.synced.clear()
            self._n["failures"] += 1
            if self._on_state is not None:
                self._on_state()
            if trio.current_time() - started >= STABLE_SESSION_S:
                self._failures = 0
            delay = backoff_delay(self._failures, self._rng, self.config)
            self._failures += 1
            await trio.sleep(delay)

    async def _session(self) -> None:
        c = self.config
        async with open_relay_websocket(
            self.url, connect_timeout_s=c.connect_timeout_s, disconnect_timeout_s=c.disconnect_timeout_s
        ) as ws:
            self.connected = True
            self._n["connects"] += 1
            self._dirty = set(self._desired)
            self._subs_sent.clear()
            log.info("event=relay_connected url=%s", self.url)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._reader, ws)
                nursery.start_soon(self._keepalive, ws)
                await self._writer(ws)

    async def _keepalive(self, ws) -> None:
        while True:
            await trio.sleep(self.config.ping_interval_s)
            with trio.fail_after(self.config.ping_timeout_s):  # TooSlowError ends the session
                await ws.ping()

    async def _writer(self, ws) -> None:
        while True:
            self._wake = trio.Event()
            for sub_id, filters in list(self._subs.items()):
                if sub_id not in self._subs_sent:
                    await ws.send_message(encode_req(sub_id, filters))
                    self._subs_sent.add(sub_id)
            while self._dirty:
                key = self._dirty.pop()
                event = self._desired.get(key)
                if event is not None:
                    await ws.send_message(encode_event(event))
                    self._n["events_sent"] += 1
            while self._outbox:
                event = self._outbox[0]
                await ws.send_message(encode_event(event))
                self._outbox.popleft()  # only after the send succeeded
                self._n["events_sent"] += 1
            await self._wake.wait()

    async def _reader(self, ws) -> None:
        while True:
            text = await ws.get_message()
            try:
                msg = decode_relay_message(text)
            except RelayProtocolError as exc:
                self._n["protocol_errors"] += 1
                log.debug("event=relay_protocol_error url=%s error=%s", self.url, exc)
                continue
            if isinstance(msg, RelayEvent):
                if msg.subscription_id in self._subs:
                    self._n["events_received"] += 1
                    if self._on_event is not None:
                        self._on_event(self.url, msg)
            elif isinstance(msg, RelayOk):
                self._record_ok(msg)
            elif isinstance(msg, RelayClosed):
                if msg.subscription_id in self._subs:
                    raise RelaySubscriptionClosed(msg.message[:120])
            elif isinstance(msg, RelayNotice):
                self._n["notices"] += 1
                log.info("event=relay_notice url=%s notice=%r", self.url, msg.message[:200])
            elif isinstance(msg, RelayEose):
                if msg.subscription_id in self._subs:
                    self.synced.add(msg.subscription_id)
                    if self._on_state is not None:
                        self._on_state()
            elif isinstance(msg, RelayAuth):
                pass  # NIP-42: we publish and read publicly

    def _record_ok(self, msg: RelayOk) -> None:
        self._n["ok_accepted" if msg.accepted else "ok_rejected"] += 1
        if not msg.accepted:
            log.info("event=relay_rejected url=%s id=%s message=%r", self.url, msg.event_id[:16], msg.message[:200])


async def publish_once(url: str, event: Event, *, connect_timeout_s: float = 10.0) -> tuple[bool, str]:
    """Send one event on a fresh connection and wait for its OK (bound it with a cancel scope)."""
    event_id = event.id().to_hex()
    async with open_relay_websocket(
        validate_relay_url(url), connect_timeout_s=connect_timeout_s, disconnect_timeout_s=1.0
    ) as ws:
        await ws.send_message(encode_event(event))
        while True:
            try:
                msg = decode_relay_message(await ws.get_message())
            except RelayProtocolError:
                continue
            if isinstance(msg, RelayOk) and msg.event_id == event_id:
                return msg.accepted, msg.message
