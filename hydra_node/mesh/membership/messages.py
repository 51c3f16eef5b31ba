"""Membership records, the merge rule, and the ten messages peers exchange.

Every message is a frozen dataclass with `to_wire() -> dict` and `from_wire(dict)`; the dict
has a text `"type"` key and only CBOR-friendly values. `decode_message` dispatches on it and
raises `InvalidMessage` (the sender's fault) for anything malformed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

from hydra_node.mesh.membership.announcement import (
    Announcement,
    InvalidMessage,
    exact_map,
    node_id,
    seq_of,
    uint,
)
from hydra_node.mesh.membership.state import PeerState, status_key

__all__ = [
    "Ack",
    "DigestEntry",
    "DigestSync",
    "Gossip",
    "Leave",
    "Message",
    "Nack",
    "PeerRecord",
    "Ping",
    "PingReq",
    "Pull",
    "Suspect",
    "Sync",
    "decode_message",
    "merge_records",
    "MAX_WIRE_RECORDS",
    "MAX_WIRE_DIGEST",
    "MAX_WIRE_BUCKETS",
]

MAX_WIRE_RECORDS = 64  # records in one message, whatever a sender's config says
MAX_WIRE_DIGEST = 4096  # digest entries in one Sync (>= any sane max_peers)
MAX_WIRE_BUCKETS = 1024  # anti-entropy buckets in one DigestSync (4096 entries / 4 per bucket)
_WIRE_STATES = {s.value: s for s in PeerState if s is not PeerState.UNKNOWN}


def _state(value: Any) -> PeerState:
    if value not in _WIRE_STATES:
        raise InvalidMessage(f"unknown peer state {value!r}")
    return _WIRE_STATES[value]


@dataclass(frozen=True)
class PeerRecord:
    """One peer's (incarnation, state) claim plus its latest known announcement.

    Alive and suspect records carry the announcement of that incarnation; dead and left
    records (tombstones) may carry an older one or none.
    """

    node_id: str
    incarnation: int
    state: PeerState
    announcement: Announcement | None = None

    def __post_init__(self) -> None:
        node_id(self.node_id)
        uint(self.incarnation, "incarnation")
        if not isinstance(self.state, PeerState) or self.state is PeerState.UNKNOWN:
            raise InvalidMessage(f"record state must be alive/suspect/dead/left, got {self.state!r}")
        ann = self.announcement
        if ann is None:
            if self.state.is_member:
                raise InvalidMessage(f"a {self.state.value} record needs its announcement")
            return
        if not isinstance(ann, Announcement) or ann.node_id != self.node_id:
            raise InvalidMessage("record announcement must be the same node's")
        if self.state.is_member and ann.incarnation != self.incarnation:
            raise InvalidMessage("an alive/suspect record's announcement must be of its incarnation")
        if ann.incarnation > self.incarnation:
            raise InvalidMessage("announcement incarnation is newer than the record's")

    @property
    def status(self) -> tuple[int, int]:
        return status_key(self.incarnation, self.state)

    @property
    def seq(self) -> int | None:
        """Seq of the announcement of this incarnation, None if not known."""
        ann = self.announcement
        return ann.seq if ann is not None and ann.incarnation == self.incarnation else None

    def digest(self) -> DigestEntry:
        return DigestEntry(self.node_id, self.incarnation, self.state, self.seq)

    def to_wire(self) -> dict[str, Any]:
        ann = None if self.announcement is None else self.announcement.to_wire()
        return {"id": self.node_id, "inc": self.incarnation, "state": self.state.value, "ann": ann}

    @classmethod
    def from_wire(cls, wire: Any) -> PeerRecord:
        m = exact_map(wire, "record", frozenset({"id", "inc", "state", "ann"}))
        ann = None if m["ann"] is None else Announcement.from_wire(m["ann"])
        return cls(m["id"], m["inc"], _state(m["state"]), ann)


@dataclass(frozen=True)
class DigestEntry:
    """A record's version without its announcement: (id, incarnation, state, seq or None)."""

    node_id: str
    incarnation: int
    state: PeerState
    seq: int | None

    def __post_init__(self) -> None:
        node_id(self.node_id)
        uint(self.incarnation, "incarnation")
        if not isinstance(self.state, PeerState) or self.state is PeerState.UNKNOWN:
            raise InvalidMessage("digest state must be alive/suspect/dead/left")
        if self.seq is not None:
            uint(self.seq, "seq")

    @property
    def key(self) -> tuple[int, int, int]:
        """Lexicographic version: status first, then the announcement seq (-1: none)."""
        return (*status_key(self.incarnation, self.state), -1 if self.seq is None else self.seq)

    def to_wire(self) -> list[Any]:
        return [self.node_id, self.incarnation, self.state.value, self.seq]

    @classmethod
    def from_wire(cls, wire: Any) -> DigestEntry:
        items = seq_of(wire, "digest entry", 4)
        if len(items) != 4:
            raise InvalidMessage("digest entry must be [id, incarnation, state, seq]")
        return cls(items[0], items[1], _state(items[2]), items[3])


def _ann_order(ann: Announcement | None) -> tuple[int | str, ...]:
    if ann is None:
        return (-1, -1, "")
    return (ann.incarnation, ann.seq)


def _ann_tiebreak(ann: Announcement) -> str:
    return json.dumps(ann.to_wire(), sort_keys=True, default=lambda b: b.hex())


def merge_records(a: PeerRecord, b: PeerRecord) -> PeerRecord:
    """Join of two records about the same peer: max status, max announcement.

    Commutative, associative and idempotent (a semilattice), and monotone: the result is never
    older than either input in (incarnation, state precedence) nor in announcement version.
    Two different announcements with the same (incarnation, seq) — a buggy or lying peer —
    are ordered by their canonical JSON so every node still picks the same one.
    """
    if a.node_id != b.node_id:
        raise InvalidMessage(f"cannot merge records of {a.node_id!r} and {b.node_id!r}")
    top = a if a.status >= b.status else b
    ann_a, ann_b = a.announcement, b.announcement
    if _ann_order(ann_a) != _ann_order(ann_b):
        ann = ann_a if _ann_order(ann_a) > _ann_order(ann_b) else ann_b
    elif ann_a is None or ann_b is None or ann_a == ann_b:  # (equal orders: both None or neither)
        ann = ann_a
    else:
        ann = ann_a if _ann_tiebreak(ann_a) >= _ann_tiebreak(ann_b) else ann_b
    if top.announcement == ann:
        return top
    return PeerRecord(top.node_id, top.incarnation, top.state, ann)


def _records(wire: Any) -> tuple[PeerRecord, ...]:
    return tuple(PeerRecord.from_wire(r) for r in seq_of(wire, "records", MAX_WIRE_RECORDS))


def _view(wire: Any) -> DigestEntry | None:
    return None if wire is None else DigestEntry.from_wire(wire)


def _check_records(records: Any) -> tuple[PeerRecord, ...]:
    checked = tuple(seq_of(records, "records", MAX_WIRE_RECORDS))
    if not all(isinstance(r, PeerRecord) for r in checked):
        raise InvalidMessage("records must be PeerRecord values")
    return checked


@dataclass(frozen=True)
class Ping:
    """Direct probe. `view` is the sender's record version of the recipient (so it can refute)."""

    TYPE: ClassVar[str] = "ping"
    probe_id: int
    view: DigestEntry | None = None
    records: tuple[PeerRecord, ...] = ()

    def __post_init__(self) -> None:
        uint(self.probe_id, "probe_id")
        object.__setattr__(self, "records", _check_records(self.records))

    def to_wire(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "probe": self.probe_id,
            "view": None if self.view is None else self.view.to_wire(),
            "records": [r.to_wire() for r in self.records],
        }

    @classmethod
    def from_wire(cls, wire: Any) -> Ping:
        m = exact_map(wire, "ping", frozenset({"type", "probe", "view", "records"}))
        return cls(m["probe"], _view(m["view"]), _records(m["records"]))


@dataclass(frozen=True)
class Ack:
    """Answer to a Ping; `subject` is who was probed (the sender, or the target of a PingReq)."""

    TYPE: ClassVar[str] = "ack"
    probe_id: int
    subject: str
    records: tuple[PeerRecord, ...] = ()

    def __post_init__(self) -> None:
        uint(self.probe_id, "probe_id")
        node_id(self.subject, "subject")
        object.__setattr__(self, "records", _check_records(self.records))

    def to_wire(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "probe": self.probe_id,
            "subject": self.subject,
            "records": [r.to_wire() for r in self.records],
        }

    @classmethod
    def from_wire(cls, wire: Any) -> Ack:
        m = exact_map(wire, "ack", frozenset({"type", "probe", "subject", "records"}))
        return cls(m["probe"], m["subject"], _records(m["records"]))


@dataclass(frozen=True)
class PingReq:
    """Ask the recipient to probe `target` for us and forward the Ack (SWIM indirect probe)."""

    TYPE: ClassVar[str] = "ping_req"
    probe_id: int
    target: str
    view: DigestEntry | None = None
    records: tuple[PeerRecord, ...] = ()

    def __post_init__(self) -> None:
        uint(self.probe_id, "probe_id")
        node_id(self.target, "target")
        object.__setattr__(self, "records", _check_records(self.records))

    def to_wire(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "probe": self.probe_id,
            "target": self.target,
            "view": None if self.view is None else self.view.to_wire(),
            "records": [r.to_wire() for r in self.records],
        }

    @classmethod
    def from_wire(cls, wire: Any) -> PingReq:
        m = exact_map(wire, "ping_req", frozenset({"type", "probe", "target", "view", "records"}))
        return cls(m["probe"], m["target"], _view(m["view"]), _records(m["records"]))


@dataclass(frozen=True)
class Gossip:
    """Records pushed to a peer: changes being disseminated, or answers to a Sync/Pull."""

    TYPE: ClassVar[str] = "gossip"
    records: tuple[PeerRecord, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "records", _check_records(self.records))

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.TYPE, "records": [r.to_wire() for r in self.records]}

    @classmethod
    def from_wire(cls, wire: Any) -> Gossip:
        m = exact_map(wire, "gossip", frozenset({"type", "records"}))
        return cls(_records(m["records"]))


@dataclass(frozen=True)
class Sync:
    """Anti-entropy: the sender's whole digest; the recipient pushes what is newer, pulls the rest."""

    TYPE: ClassVar[str] = "sync"
    digest: tuple[DigestEntry, ...]
    records: tuple[PeerRecord, ...] = ()

    def __post_init__(self) -> None:
        digest = tuple(seq_of(self.digest, "digest", MAX_WIRE_DIGEST))
        if not all(isinstance(d, DigestEntry) for d in digest):
            raise InvalidMessage("digest must hold DigestEntry values")
        object.__setattr__(self, "digest", digest)
        object.__setattr__(self, "records", _check_records(self.records))

    def to_wire(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "digest": [d.to_wire() for d in self.digest],
            "records": [r.to_wire() for r in self.records],
        }

    @classmethod
    def from_wire(cls, wire: Any) -> Sync:
        m = exact_map(wire, "sync", frozenset({"type", "digest", "records"}))
        digest = tuple(DigestEntry.from_wire(d) for d in seq_of(m["digest"], "digest", MAX_WIRE_DIGEST))
        return cls(digest, _records(m["records"]))


@dataclass(frozen=True)
class Pull:
    """Ask for the full records of these peers (answered with Gossip)."""

    TYPE: ClassVar[str] = "pull"
    ids: tuple[str, ...]

    def __post_init__(self) -> None:
        ids = tuple(seq_of(self.ids, "ids", MAX_WIRE_DIGEST))
        for i in ids:
            node_id(i, "pull id")
        object.__setattr__(self, "ids", ids)

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.TYPE, "ids": list(self.ids)}

    @classmethod
    def from_wire(cls, wire: Any) -> Pull:
        m = exact_map(wire, "pull", frozenset({"type", "ids"}))
        return cls(tuple(seq_of(m["ids"], "ids", MAX_WIRE_DIGEST)))


@dataclass(frozen=True)
class Leave:
    """The sender leaves the mesh for good at this incarnation (clean shutdown)."""

    TYPE: ClassVar[str] = "leave"
    incarnation: int

    def __post_init__(self) -> None:
        uint(self.incarnation, "incarnation")

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.TYPE, "inc": self.incarnation}

    @classmethod
    def from_wire(cls, wire: Any) -> Leave:
        m = exact_map(wire, "leave", frozenset({"type", "inc"}))
        return cls(m["inc"])


@dataclass(frozen=True)
class Nack:
    """A helper's answer to a PingReq whose target did not ack in time (Lifeguard): the helper
    is alive and heard us, so our failed probe is not our own fault."""

    TYPE: ClassVar[str] = "nack"
    probe_id: int

    def __post_init__(self) -> None:
        uint(self.probe_id, "probe_id")

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.TYPE, "probe": self.probe_id}

    @classmethod
    def from_wire(cls, wire: Any) -> Nack:
        return cls(exact_map(wire, "nack", frozenset({"type", "probe"}))["probe"])


@dataclass(frozen=True)
class Suspect:
    """First-hand evidence: the sender's own probe of `target` at `incarnation` failed. Counts as
    one independent confirmation of a suspicion (Lifeguard); never relayed."""

    TYPE: ClassVar[str] = "suspect"
    target: str
    incarnation: int

    def __post_init__(self) -> None:
        node_id(self.target, "target")
        uint(self.incarnation, "incarnation")

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.TYPE, "target": self.target, "inc": self.incarnation}

    @classmethod
    def from_wire(cls, wire: Any) -> Suspect:
        m = exact_map(wire, "suspect", frozenset({"type", "target", "inc"}))
        return cls(m["target"], m["inc"])


@dataclass(frozen=True)
class DigestSync:
    """Bounded anti-entropy (see membership/antientropy.py). With `hashes` (one per bucket of
    `buckets`): the sender's bucket hashes, answered with the entries of differing buckets.
    With `parts`: the sender's complete digest of those buckets, answered by push and pull."""

    TYPE: ClassVar[str] = "dsync"
    buckets: int
    hashes: tuple[int, ...] = ()
    parts: tuple[int, ...] = ()
    digest: tuple[DigestEntry, ...] = ()
    records: tuple[PeerRecord, ...] = ()

    def __post_init__(self) -> None:
        b = uint(self.buckets, "buckets", MAX_WIRE_BUCKETS)
        if b < 1 or b & (b - 1):
            raise InvalidMessage("buckets must be a power of two in 1..1024")
        hashes = tuple(uint(h, "bucket hash", 2**32 - 1) for h in seq_of(self.hashes, "hashes", b))
        if hashes and len(hashes) != b:
            raise InvalidMessage("hashes must be empty or one per bucket")
        parts = tuple(uint(i, "part", b - 1) for i in seq_of(self.parts, "parts", b))
        digest = tuple(seq_of(self.digest, "digest", MAX_WIRE_DIGEST))
        if not all(isinstance(d, DigestEntry) for d in digest):
            raise InvalidMessage("digest must hold DigestEntry values")
        if digest and not parts:
            raise InvalidMessage("a digest needs the parts it covers")
        for name, value in (("hashes", hashes), ("parts", parts), ("digest", digest)):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "records", _check_records(self.records))

    def to_wire(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "buckets": self.buckets,
            "hashes": list(self.hashes),
            "parts": list(self.parts),
            "digest": [d.to_wire() for d in self.digest],
            "records": [r.to_wire() for r in self.records],
        }

    @classmethod
    def from_wire(cls, wire: Any) -> DigestSync:
        m = exact_map(wire, "dsync", frozenset({"type", "buckets", "hashes", "parts", "digest", "records"}))
        digest = tuple(DigestEntry.from_wire(d) for d in seq_of(m["digest"], "digest", MAX_WIRE_DIGEST))
        return cls(
            m["buckets"],
            tuple(seq_of(m["hashes"], "hashes", MAX_WIRE_BUCKETS)),
            tuple(seq_of(m["parts"], "parts", MAX_WIRE_BUCKETS)),
            digest,
            _records(m["records"]),
        )


Message = Ping | Ack | PingReq | Gossip | Sync | Pull | Leave | Nack | Suspect | DigestSync
MESSAGE_TYPES: dict[str, type[Message]] = {
    c.TYPE: c for c in (Ping, Ack, PingReq, Gossip, Sync, Pull, Leave, Nack, Suspect, DigestSync)
}


def decode_message(wire: Any) -> Message:
    """A wire dict to a message, or InvalidMessage (the sender's fault)."""
    if not isinstance(wire, dict):
        raise InvalidMessage(f"a message must be a map, got {type(wire).__name__}")
    kind = wire.get("type")
    cls = MESSAGE_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise InvalidMessage(f"unknown message type {ascii(kind)[:40]}")
    try:
        return cls.from_wire(wire)
    except InvalidMessage:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as exc:
        raise InvalidMessage(f"malformed {cls.TYPE}: {exc}") from exc
