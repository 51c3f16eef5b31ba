"""Hydra mesh listings as Nostr events (sync, pure over nostr-sdk's model layer).

A listing is a kind 31990 addressable event with tags ``d = hydra:<mesh_id>`` (so
``(pubkey, d)`` names one mesh listing per key), ``k = hydra``, ``t = hydra`` and a
NIP-40 ``expiration``; its content is :class:`ListingContent` as JSON.  Incoming
events are checked with ``Event.verify()`` (id and signature), then kind, tags,
expiry, size and content; a rejection raises :class:`ListingRejected` naming a
:class:`RejectReason`.  Upstream Mesh LLM listings (any ``mesh-llm`` tag) are refused.
Deletion is NIP-09: kind 5 with ``a = 31990:<pubkey>:<d>`` and ``e = <event id>``.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # nostr-sdk loads on first use (about 19 MB): a node without Nostr never pays
    from nostr_sdk import Event, Keys

LISTING_KIND = 31990  # NIP-89 application handler, addressable
DELETION_KIND = 5  # NIP-09
APP_TAG = "hydra"
D_PREFIX = "hydra:"
UPSTREAM_TAG = "mesh-llm"
CONTENT_VERSION = 1

MAX_EVENT_JSON = 16 * 1024  # bytes of one event as JSON
MAX_CONTENT = 8 * 1024  # bytes of the listing JSON
MAX_TOKEN = 4096
MAX_MODELS = 32
MAX_MODEL_NAME = 128
MAX_TEXT = 64  # name, region, version
MAX_COUNT = 1_000_000
MAX_VRAM = 1 << 50  # bytes (1 PiB)
MAX_FUTURE_SKEW_S = 900  # created_at further ahead than this is refused
MAX_LIFETIME_S = 24 * 3600  # expiration further than this after created_at is refused

_MESH_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class RejectReason(enum.Enum):
    MALFORMED = "malformed"  # not an event object / not parseable by nostr-sdk
    TOO_LARGE = "too_large"
    BAD_SIGNATURE = "bad_signature"  # verify() failed: id or signature
    WRONG_KIND = "wrong_kind"
    MISSING_TAG = "missing_tag"
    UPSTREAM = "upstream_mesh_llm"
    EXPIRED = "expired"
    BAD_TIME = "bad_time"  # created_at in the future or lifetime too long
    BAD_CONTENT = "bad_content"
    D_MISMATCH = "d_mismatch"  # d tag does not name the content's mesh
    DELETED = "deleted"  # older than a deletion we saw
    STALE = "stale"  # older than the listing we hold for (pubkey, d)


class ListingRejected(Exception):
    """An incoming event is unusable (the publisher's or relay's fault)."""

    def __init__(self, reason: RejectReason, detail: str = "") -> None:
        super().__init__(f"{reason.value}: {detail}" if detail else reason.value)
        self.reason = reason


@dataclass(frozen=True)
class ListingContent:
    """What a mesh advertises; validated when built (so invalid content cannot exist)."""

    mesh_id: str
    invite_token: str
    serving: tuple[str, ...] = ()
    wanted: tuple[str, ...] = ()
    node_count: int = 1
    client_count: int = 0
    max_clients: int = 0  # 0 = unlimited
    vram_bytes: int = 0
    spare_slots: int = 0  # request slots free right now
    name: str | None = None
    region: str | None = None
    version: str = ""

    def __post_init__(self) -> None:
        _need(isinstance(self.mesh_id, str) and bool(_MESH_ID.match(self.mesh_id)), "mesh_id")
        _need(
            isinstance(self.invite_token, str)
            and 0 < len(self.invite_token) <= MAX_TOKEN
            and self.invite_token.isascii()
            and self.invite_token.isprintable(),
            "invite_token",
        )
        for field_name in ("serving", "wanted"):
            models = getattr(self, field_name)
            _need(isinstance(models, tuple) and len(models) <= MAX_MODELS, field_name)
            for m in models:
                _need(isinstance(m, str) and 0 < len(m) <= MAX_MODEL_NAME and m.isprintable(), field_name)
            _need(len(set(models)) == len(models), f"{field_name} has duplicates")
        _need(_int(self.node_count, 1, MAX_COUNT), "node_count")
        for field_name in ("client_count", "max_clients", "spare_slots"):
            _need(_int(getattr(self, field_name), 0, MAX_COUNT), field_name)
        _need(_int(self.vram_bytes, 0, MAX_VRAM), "vram_bytes")
        for field_name in ("name", "region"):
            v = getattr(self, field_name)
            _need(v is None or (isinstance(v, str) and 0 < len(v) <= MAX_TEXT and v.isprintable()), field_name)
        _need(isinstance(self.version, str) and len(self.version) <= MAX_TEXT and self.version.isprintable(), "version")

    @property
    def d_tag(self) -> str:
        return D_PREFIX + self.mesh_id

    def to_json(self) -> str:
        obj = {"v": CONTENT_VERSION, **{k: getattr(self, k) for k in _FIELDS}}
        obj["serving"], obj["wanted"] = list(self.serving), list(self.wanted)
        return json.dumps(obj, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ListingContent":
        """Strict: a JSON object with ``v == 1``, known keys only, right types and bounds."""
        if len(text.encode()) > MAX_CONTENT:
            raise ListingRejected(RejectReason.TOO_LARGE, "content")
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError):
            raise ListingRejected(RejectReason.BAD_CONTENT, "not JSON") from None
        if not isinstance(obj, dict) or obj.get("v") != CONTENT_VERSION:
            raise ListingRejected(RejectReason.BAD_CONTENT, "not a v1 listing object")
        unknown = set(obj) - set(_FIELDS) - {"v"}
        if unknown:
            raise ListingRejected(RejectReason.BAD_CONTENT, f"unknown keys {sorted(unknown)[:4]}")
        kwargs: dict[str, Any] = {k: obj[k] for k in _FIELDS if k in obj}
        for k in ("serving", "wanted"):
            if k in kwargs:
                if not isinstance(kwargs[k], list):
                    raise ListingRejected(RejectReason.BAD_CONTENT, f"{k} is not a list")
                kwargs[k] = tuple(kwargs[k])
        try:
            return cls(**kwargs)
        except (ValueError, TypeError) as exc:
            raise ListingRejected(RejectReason.BAD_CONTENT, str(exc)) from None


_FIELDS = tuple(f for f in ListingContent.__dataclass_fields__)


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise ValueError(f"invalid {what}")


def _int(v: object, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


@dataclass(frozen=True)
class Listing:
    """A verified listing event."""

    pubkey: str
    d: str
    event_id: str
    created_at: int
    expires_at: int
    content: ListingContent

    @property
    def key(self) -> tuple[str, str]:
        return (self.pubkey, self.d)


@dataclass(frozen=True)
class Deletion:
    """A verified NIP-09 deletion of Hydra listings: (pubkey, d) coordinates and event ids."""

    pubkey: str
    created_at: int
    coordinates: tuple[str, ...]  # d values of 31990 events by the same pubkey
    event_ids: tuple[str, ...]


# ---------------------------------------------------------------- building


def build_listing_event(keys: Keys, content: ListingContent, *, now: int, ttl_s: int = 120) -> Event:
    """Sign a listing valid from ``now`` for ``ttl_s`` seconds (NIP-40 expiration)."""
    if not 0 < ttl_s <= MAX_LIFETIME_S:
        raise ValueError("ttl_s out of range")
    from nostr_sdk import EventBuilder, Kind, Tag, Timestamp

    tags = [
        Tag.parse(["d", content.d_tag]),
        Tag.parse(["k", APP_TAG]),
        Tag.parse(["t", APP_TAG]),
        Tag.parse(["expiration", str(now + ttl_s)]),
        Tag.parse(["alt", "Hydra mesh listing"]),  # NIP-31
    ]
    builder = EventBuilder(Kind(LISTING_KIND), content.to_json()).tags(tags)
    return builder.custom_created_at(Timestamp.from_secs(now)).finalize(keys)


def build_deletion_event(keys: Keys, listing: Event, *, now: int) -> Event:
    """A NIP-09 request to delete ``listing`` (our own), tagged so discoverers can subscribe to it."""
    d = _first_tag(json.loads(listing.as_json()).get("tags", []), "d")
    if d is None:
        raise ValueError("listing event has no d tag")
    pubkey = keys.public_key().to_hex()
    from nostr_sdk import EventBuilder, Kind, Tag, Timestamp

    tags = [
        Tag.parse(["a", f"{LISTING_KIND}:{pubkey}:{d}"]),
        Tag.parse(["e", listing.id().to_hex()]),
        Tag.parse(["k", str(LISTING_KIND)]),
        Tag.parse(["t", APP_TAG]),
    ]
    builder = EventBuilder(Kind(DELETION_KIND), "hydra node shut down").tags(tags)
    return builder.custom_created_at(Timestamp.from_secs(now)).finalize(keys)


# ---------------------------------------------------------------- parsing


def _first_tag(tags: list, name: str) -> str | None:
    for t in tags:
        if isinstance(t, list) and len(t) >= 2 and t[0] == name and isinstance(t[1], str):
            return t[1]
    return None


def verify_event(raw: Any) -> dict:
    """Parse a relay's event object with nostr-sdk and check id + signature; returns the JSON object."""
    try:
        text = raw if isinstance(raw, str) else json.dumps(raw, separators=(",", ":"))
    except (TypeError, ValueError):
        raise ListingRejected(RejectReason.MALFORMED, "not JSON-serialisable") from None
    if len(text.encode()) > MAX_EVENT_JSON:
        raise ListingRejected(RejectReason.TOO_LARGE, f"{len(text)} bytes")
    from nostr_sdk import Event

    try:
        event = Event.from_json(text)
    except Exception as exc:  # nostr-sdk's NostrSdkError and friends
        raise ListingRejected(RejectReason.MALFORMED, type(exc).__name__) from None
    if not event.verify():  # id AND signature; verify_signature() alone trusts the claimed id
        raise ListingRejected(RejectReason.BAD_SIGNATURE)
    return json.loads(event.as_json())


def parse_event(raw: Any, *, now: int) -> Listing | Deletion:
    """Verify and decode one event from a relay into a :class:`Listing` or :class:`Deletion`."""
    obj = verify_event(raw)
    tags = obj.get("tags", [])
    for t in tags:
        if UPSTREAM_TAG in t[:2]:
            raise ListingRejected(RejectReason.UPSTREAM, f"tag {t[0]}")
    kind, created = obj["kind"], int(obj["created_at"])
    if created > now + MAX_FUTURE_SKEW_S:
        raise ListingRejected(RejectReason.BAD_TIME, "created_at in the future")
    if kind == DELETION_KIND:
        return _parse_deletion(obj, tags)
    if kind != LISTING_KIND:
        raise ListingRejected(RejectReason.WRONG_KIND, str(kind))
    d, k, exp = _first_tag(tags, "d"), _first_tag(tags, "k"), _first_tag(tags, "expiration")
    if d is None or k != APP_TAG or exp is None:
        raise ListingRejected(RejectReason.MISSING_TAG, "need d, k=hydra and expiration")
    if not (exp.isascii() and exp.isdigit() and len(exp) <= 12):
        raise ListingRejected(RejectReason.MISSING_TAG, "expiration is not a timestamp")
    expires = int(exp)
    if expires <= now:
        raise ListingRejected(RejectReason.EXPIRED, f"expired {now - expires} s ago")
    if expires - created > MAX_LIFETIME_S:
        raise ListingRejected(RejectReason.BAD_TIME, "lifetime too long")
    content = ListingContent.from_json(obj["content"])
    if d != content.d_tag:
        raise ListingRejected(RejectReason.D_MISMATCH, d[:80])
    return Listing(
        pubkey=obj["pubkey"], d=d, event_id=obj["id"], created_at=created, expires_at=expires, content=content
    )


def _parse_deletion(obj: dict, tags: list) -> Deletion:
    pubkey = obj["pubkey"]
    coords, ids = [], []
    for t in tags:
        if len(t) < 2 or not isinstance(t[1], str):
            continue
        if t[0] == "a":
            kind, _, rest = t[1].partition(":")
            author, _, d = rest.partition(":")
            if kind == str(LISTING_KIND) and author == pubkey and d.startswith(D_PREFIX):
                coords.append(d)
        elif t[0] == "e" and _HEX64.match(t[1]):
            ids.append(t[1])
    if not coords and not ids:
        raise ListingRejected(RejectReason.MISSING_TAG, "deletion names no hydra listing")
    return Deletion(
        pubkey=pubkey, created_at=int(obj["created_at"]), coordinates=tuple(coords[:16]), event_ids=tuple(ids[:16])
    )
