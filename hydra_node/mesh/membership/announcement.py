"""What a peer announces about itself: `Announcement`, validated when built.

Wire forms are CBOR-friendly dicts (text keys, ints, text, lists, maps, null; no floats) so the
link layer can sign and send them. Decoding is strict: unknown or missing keys are errors, so
`from_wire(x).to_wire() == x` and a relayed announcement re-encodes to the same bytes.
"""

from __future__ import annotations

import re

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ROLES",
    "Announcement",
    "Hardware",
    "InvalidMessage",
    "LocalMembershipError",
    "MembershipError",
    "ModelEntry",
    "RpcCapacity",
]

MAX_UINT = 2**63 - 1
MAX_NODE_ID_CHARS = 128  # an Ed25519 key in hex is 64
MAX_TEXT_CHARS = 256  # model ids, versions, addresses
MAX_STATE_CHARS = 32
MAX_ADDRESSES = 16
MAX_MODELS = 64
#: Largest ``free_slots`` a model entry may announce: far above any runner's parallel sequences
#: (llama.cpp's LLAMA_MAX_SEQ is 256), small enough to be a sane scheduling input.
MAX_FREE_SLOTS = 1024
#: A model entry's ``ident``: hex characters (hydra_node/routing/identity.py ``IDENT_HEX``).
IDENT_HEX = 16
_IDENT = re.compile(r"[0-9a-f]{%d}" % IDENT_HEX)
MAX_THROUGHPUT_HINTS = 64  # same bound as upstream advertised_model_throughput
MAX_EXTRA_ITEMS = 256  # scalars + containers in `extra`, all levels together
MAX_EXTRA_DEPTH = 4
ROLES = ("host", "worker", "client")


class MembershipError(Exception):
    """Base class of membership errors."""


class InvalidMessage(MembershipError, ValueError):
    """A message or announcement breaks the wire rules; when decoded, the sender is to blame."""


class LocalMembershipError(MembershipError):
    """The local caller misused the membership core (our bug)."""


def text(value: Any, name: str, max_chars: int = MAX_TEXT_CHARS) -> str:
    if not isinstance(value, str):
        raise InvalidMessage(f"{name} must be text, got {type(value).__name__}")
    if not 0 < len(value) <= max_chars:
        raise InvalidMessage(f"{name} must be 1..{max_chars} characters")
    if not value.isprintable():
        raise InvalidMessage(f"{name} must be printable")
    return value


def uint(value: Any, name: str, maximum: int = MAX_UINT) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidMessage(f"{name} must be an integer, got {type(value).__name__}")
    if not 0 <= value <= maximum:
        raise InvalidMessage(f"{name} must be in 0..{maximum}")
    return value


#: An address peers may dial: ``host:port`` or ``ws[s]://host:port[/path]``; host a DNS name, an
#: IPv4 address or a bracketed IPv6 address; port 1-65535.
_ADDRESS = re.compile(
    r"(?:wss?://)?(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\])"
    r":(?P<port>[0-9]{1,5})(?:/[!-~]{0,100})?"
)
MAX_ADDRESS_CHARS = 300


def address(value: Any, name: str = "address") -> str:
    v = text(value, name, MAX_ADDRESS_CHARS)
    m = _ADDRESS.fullmatch(v)
    if m is None or not 1 <= int(m["port"]) <= 65535:
        raise InvalidMessage(f"{name} must be host:port or ws[s]://host:port[/path], not {v[:60]!r}")
    return v


def node_id(value: Any, name: str = "node_id") -> str:
    return text(value, name, MAX_NODE_ID_CHARS)


def seq_of(value: Any, name: str, max_items: int) -> list[Any]:
    if not isinstance(value, (list, tuple)):
        raise InvalidMessage(f"{name} must be a list")
    if len(value) > max_items:
        raise InvalidMessage(f"{name} has more than {max_items} items")
    return list(value)


def exact_map(
    value: Any, name: str, required: frozenset[str], optional: frozenset[str] = frozenset()
) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise InvalidMessage(f"{name} must be a map")
    keys = set(value)
    if missing := required - keys:
        raise InvalidMessage(f"{name} lacks {sorted(missing)}")
    if unknown := keys - required - optional:
        raise InvalidMessage(f"{name} has unknown keys {sorted(map(str, unknown))}")
    return value


def _check_extra(value: Any, depth: int, budget: list[int]) -> None:
    budget[0] -= 1
    if budget[0] < 0:
        raise InvalidMessage(f"extra has more than {MAX_EXTRA_ITEMS} items")
    if value is None or isinstance(value, (bool, str, bytes)):
        if isinstance(value, (str, bytes)) and len(value) > MAX_TEXT_CHARS:
            raise InvalidMessage(f"extra strings are at most {MAX_TEXT_CHARS} long")
        return
    if isinstance(value, int):
        uint(abs(value), "extra integer")
        return
    if depth >= MAX_EXTRA_DEPTH:
        raise InvalidMessage(f"extra nests deeper than {MAX_EXTRA_DEPTH}")
    if isinstance(value, (list, tuple)):
        for item in value:
            _check_extra(item, depth + 1, budget)
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            text(key, "extra key")
            _check_extra(item, depth + 1, budget)
        return
    raise InvalidMessage(f"extra holds a {type(value).__name__}; only null, bool, int, text, bytes, lists, maps")


def _thaw(value: Any) -> Any:
    """Copy `extra` into plain lists and dicts, the form cbor2 decodes to."""
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class ModelEntry:
    """A model the peer knows about and its state (e.g. "ready", "loading"), and optionally how
    many more sequences its runner could take right now (``free_slots``; absent: not reported,
    e.g. a runner without continuous batching, or an older node), and the model's identity
    (``ident``: 16 lowercase hex characters over its GGUF file's digest and chat template, sent by a
    node that resumes generations — :mod:`hydra_node.routing.identity`; absent: unknown)."""

    id: str
    state: str
    free_slots: int | None = None
    ident: str | None = None

    def __post_init__(self) -> None:
        text(self.id, "model id")
        text(self.state, "model state", MAX_STATE_CHARS)
        if self.free_slots is not None:
            uint(self.free_slots, "free_slots", MAX_FREE_SLOTS)
        if self.ident is not None and not (isinstance(self.ident, str) and _IDENT.fullmatch(self.ident)):
            raise InvalidMessage(f"model ident must be {IDENT_HEX} lowercase hex characters, not {self.ident!r:.40}")

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"id": self.id, "state": self.state}
        if self.free_slots is not None:  # omitted when unknown: the entry stays as older nodes wrote it
            wire["free_slots"] = self.free_slots
        if self.ident is not None:  # the same
            wire["ident"] = self.ident
        return wire

    @classmethod
    def from_wire(cls, wire: Any) -> ModelEntry:
        m = exact_map(wire, "model", frozenset({"id", "state"}), frozenset({"free_slots", "ident"}))
        return cls(m["id"], m["state"], m.get("free_slots"), m.get("ident"))


@dataclass(frozen=True)
class Hardware:
    """Machine capacity; `usable_bytes` is what the node is willing to fill with weights."""

    cores: int = 0
    ram_bytes: int = 0
    vram_bytes: int = 0
    usable_bytes: int = 0

    def __post_init__(self) -> None:
        uint(self.cores, "cores", 65535)
        for name in ("ram_bytes", "vram_bytes", "usable_bytes"):
            uint(getattr(self, name), name)

    def to_wire(self) -> dict[str, Any]:
        return {
            "cores": self.cores,
            "ram_bytes": self.ram_bytes,
            "vram_bytes": self.vram_bytes,
            "usable_bytes": self.usable_bytes,
        }

    @classmethod
    def from_wire(cls, wire: Any) -> Hardware:
        m = exact_map(wire, "hardware", frozenset({"cores", "ram_bytes", "vram_bytes", "usable_bytes"}))
        return cls(m["cores"], m["ram_bytes"], m["vram_bytes"], m["usable_bytes"])


@dataclass(frozen=True)
class RpcCapacity:
    """What the node's llama.cpp RPC worker can still take."""

    free_bytes: int
    device: str

    def __post_init__(self) -> None:
        uint(self.free_bytes, "rpc free_bytes")
        text(self.device, "rpc device")

    def to_wire(self) -> dict[str, Any]:
        return {"free_bytes": self.free_bytes, "device": self.device}

    @classmethod
    def from_wire(cls, wire: Any) -> RpcCapacity:
        m = exact_map(wire, "rpc", frozenset({"free_bytes", "device"}))
        return cls(m["free_bytes"], m["device"])


_ANN_KEYS = frozenset(
    {
        "node_id",
        "incarnation",
        "seq",
        "version",
        "role",
        "addresses",
        "api_port",
        "console_port",
        "models",
        "hardware",
        "queue_depth",
        "throughput_milli",
        "rpc",
        "extra",
    }
)


@dataclass(frozen=True)
class Announcement:
    """A node's self-description. Only the node itself creates one for its own id.

    `incarnation` grows on restart and on refuting a suspicion; `seq` grows on every change, so
    (incarnation, seq) orders a node's announcements. `throughput_milli` maps a model id to
    tokens per second times 1000 (ints, no floats on the wire). `extra` holds opaque
    CBOR-friendly data for fields added later; treat it as read-only.
    """

    node_id: str
    incarnation: int = 0
    seq: int = 0
    version: str = "0"
    role: str = "host"
    addresses: tuple[str, ...] = ()
    api_port: int | None = None
    console_port: int | None = None
    models: tuple[ModelEntry, ...] = ()
    hardware: Hardware = Hardware()
    queue_depth: int = 0
    throughput_milli: tuple[tuple[str, int], ...] = ()
    rpc: RpcCapacity | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        node_id(self.node_id)
        uint(self.incarnation, "incarnation")
        uint(self.seq, "seq")
        text(self.version, "version")
        if self.role not in ROLES:
            raise InvalidMessage(f"role must be one of {ROLES}, got {self.role!r}")
        set_ = object.__setattr__
        set_(self, "addresses", tuple(address(a) for a in seq_of(self.addresses, "addresses", MAX_ADDRESSES)))
        for name in ("api_port", "console_port"):
            if getattr(self, name) is not None:
                uint(getattr(self, name), name, 65535)
        models = tuple(seq_of(self.models, "models", MAX_MODELS))
        if not all(isinstance(m, ModelEntry) for m in models):
            raise InvalidMessage("models must be ModelEntry values")
        set_(self, "models", models)
        if not isinstance(self.hardware, Hardware):
            raise InvalidMessage("hardware must be a Hardware value")
        uint(self.queue_depth, "queue_depth", 2**32)
        hints = self.throughput_milli
        pairs = hints.items() if isinstance(hints, Mapping) else seq_of(hints, "throughput_milli", MAX_THROUGHPUT_HINTS)
        norm = {}
        for pair in pairs:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise InvalidMessage("throughput_milli items must be (model, milli tokens/s) pairs")
            norm[text(pair[0], "throughput model")] = uint(pair[1], "throughput milli tokens/s", 10**9)
        if len(norm) > MAX_THROUGHPUT_HINTS:
            raise InvalidMessage(f"more than {MAX_THROUGHPUT_HINTS} throughput hints")
        set_(self, "throughput_milli", tuple(sorted(norm.items())))
        if self.rpc is not None and not isinstance(self.rpc, RpcCapacity):
            raise InvalidMessage("rpc must be an RpcCapacity value or None")
        if not isinstance(self.extra, Mapping):
            raise InvalidMessage("extra must be a map")
        _check_extra(self.extra, 0, [MAX_EXTRA_ITEMS + 1])
        set_(self, "extra", _thaw(self.extra))

    @property
    def throughput(self) -> dict[str, int]:
        """Model id -> milli tokens per second."""
        return dict(self.throughput_milli)

    def version_key(self) -> tuple[int, int]:
        """Order of a node's own announcements."""
        return (self.incarnation, self.seq)

    def to_wire(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "incarnation": self.incarnation,
            "seq": self.seq,
            "version": self.version,
            "role": self.role,
            "addresses": list(self.addresses),
            "api_port": self.api_port,
            "console_port": self.console_port,
            "models": [m.to_wire() for m in self.models],
            "hardware": self.hardware.to_wire(),
            "queue_depth": self.queue_depth,
            "throughput_milli": dict(self.throughput_milli),
            "rpc": None if self.rpc is None else self.rpc.to_wire(),
            "extra": _thaw(self.extra),
        }

    @classmethod
    def from_wire(cls, wire: Any) -> Announcement:
        m = exact_map(wire, "announcement", _ANN_KEYS)
        hints = m["throughput_milli"]
        if not isinstance(hints, Mapping):
            raise InvalidMessage("throughput_milli must be a map")
        if len(hints) > MAX_THROUGHPUT_HINTS:
            raise InvalidMessage(f"more than {MAX_THROUGHPUT_HINTS} throughput hints")
        return cls(
            node_id=m["node_id"],
            incarnation=m["incarnation"],
            seq=m["seq"],
            version=m["version"],
            role=m["role"],
            addresses=tuple(seq_of(m["addresses"], "addresses", MAX_ADDRESSES)),
            api_port=m["api_port"],
            console_port=m["console_port"],
            models=tuple(ModelEntry.from_wire(x) for x in seq_of(m["models"], "models", MAX_MODELS)),
            hardware=Hardware.from_wire(m["hardware"]),
            queue_depth=m["queue_depth"],
            throughput_milli=tuple(hints.items()),
            rpc=None if m["rpc"] is None else RpcCapacity.from_wire(m["rpc"]),
            extra=m["extra"],
        )
