"""Sans-IO NIP-01 messages: client -> relay encoders, relay -> client decoder.

Relay messages are untrusted text; :func:`decode_relay_message` returns one of the
frozen events below or raises :class:`RelayProtocolError`.  Event objects inside
``EVENT`` messages are passed on raw; they are verified by :mod:`nostr_events`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:  # nostr-sdk loads on first use (about 19 MB): a node without Nostr never pays
    from nostr_sdk import Event

MAX_RELAY_MESSAGE = 128 * 1024  # bytes of one relay message (our events are <= 16 KiB)
MAX_SUBSCRIPTION_ID = 64  # NIP-01


class RelayProtocolError(Exception):
    """The relay sent something that is not NIP-01 (the relay's fault)."""


@dataclass(frozen=True)
class RelayEvent:
    subscription_id: str
    event: Mapping[str, Any]  # raw, unverified


@dataclass(frozen=True)
class RelayOk:
    event_id: str
    accepted: bool
    message: str


@dataclass(frozen=True)
class RelayEose:
    subscription_id: str


@dataclass(frozen=True)
class RelayClosed:
    subscription_id: str
    message: str


@dataclass(frozen=True)
class RelayNotice:
    message: str


@dataclass(frozen=True)
class RelayAuth:
    challenge: str


RelayMessage = RelayEvent | RelayOk | RelayEose | RelayClosed | RelayNotice | RelayAuth


def encode_event(event: Event) -> str:
    return '["EVENT",' + event.as_json() + "]"


def encode_req(subscription_id: str, filters: Sequence[Mapping[str, Any]]) -> str:
    _check_sub(subscription_id)
    return json.dumps(["REQ", subscription_id, *filters], separators=(",", ":"))


def encode_close(subscription_id: str) -> str:
    _check_sub(subscription_id)
    return json.dumps(["CLOSE", subscription_id], separators=(",", ":"))


def _check_sub(subscription_id: str) -> None:
    if not 0 < len(subscription_id) <= MAX_SUBSCRIPTION_ID:
        raise ValueError("subscription id must be 1..64 characters")


def _text(v: Any, what: str) -> str:
    if not isinstance(v, str):
        raise RelayProtocolError(f"{what} is not a string")
    return v


def decode_relay_message(message: str | bytes) -> RelayMessage:
    if len(message) > MAX_RELAY_MESSAGE:
        raise RelayProtocolError("message too large")
    try:
        obj = json.loads(message)
    except (ValueError, RecursionError):
        raise RelayProtocolError("not JSON") from None
    if not isinstance(obj, list) or not obj or not isinstance(obj[0], str):
        raise RelayProtocolError("not a NIP-01 message array")
    verb, args = obj[0], obj[1:]
    if verb == "EVENT" and len(args) == 2 and isinstance(args[1], dict):
        return RelayEvent(_text(args[0], "subscription id"), args[1])
    if verb == "OK" and len(args) >= 2 and isinstance(args[1], bool):
        return RelayOk(
            _text(args[0], "event id"), args[1], args[2] if len(args) > 2 and isinstance(args[2], str) else ""
        )
    if verb == "EOSE" and len(args) == 1:
        return RelayEose(_text(args[0], "subscription id"))
    if verb == "CLOSED" and len(args) >= 1:
        return RelayClosed(
            _text(args[0], "subscription id"), args[1] if len(args) > 1 and isinstance(args[1], str) else ""
        )
    if verb == "NOTICE" and len(args) >= 1:
        return RelayNotice(_text(args[0], "notice"))
    if verb == "AUTH" and len(args) >= 1:
        return RelayAuth(_text(args[0], "challenge"))
    raise RelayProtocolError(f"unexpected {verb[:16]!r} message")
