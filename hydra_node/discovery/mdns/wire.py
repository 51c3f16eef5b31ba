"""Sans-IO mDNS codec for ``_hydra._tcp.local.`` (dnslib for the DNS wire format).

Bytes in, frozen events out; adverts in, bytes out.  No sockets, no clock.
A node announces one instance: PTR (service -> instance), SRV (instance -> host:port),
TXT (the fields below, never a secret) and one A record per address.  TTL 0 is a
goodbye (RFC 6762 §10.1).  Untrusted packets yield a :class:`MdnsQuery`, an
:class:`MdnsResponse` (whose unusable adverts are listed in ``rejected``) or raise
:class:`MdnsDecodeError`; nothing else.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from dnslib import A, DNSHeader, DNSQuestion, DNSRecord, PTR, QTYPE, RR, SRV, TXT

SERVICE = "_hydra._tcp.local."
APP_ID = "hydra"
TXT_SCHEMA = "1"

CLASS_IN = 1
CACHE_FLUSH = 0x8000  # top bit of rclass in answers (RFC 6762 §10.2)
UNICAST_RESPONSE = 0x8000  # top bit of qclass in questions (QU)

DEFAULT_TTL = 120  # seconds, for PTR/SRV/TXT/A (RFC 6762 recommends 120 s for host records)
LEGACY_TTL = 10  # RFC 6762 §6.7: unicast answers to one-shot queries carry at most 10 s
MAX_PACKET = 9000  # bytes; RFC 6762 §17: mDNS packets up to 9000 bytes
MAX_RECORDS = 64  # per packet; ours carry 3 + addresses
MAX_ADDRESSES = 8  # A records kept per advert
MAX_MODELS = 16  # models listed in TXT
MAX_TXT_STRING = 255  # DNS character-string limit
MAX_NAME = 64
MAX_MODEL_NAME = 96
MAX_NODE_COUNT = 100_000

_HEX = re.compile(r"^[0-9a-f]+$")
_MESH_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_MODEL = re.compile(r"^[A-Za-z0-9._:/@+\-]{1,%d}$" % MAX_MODEL_NAME)
_VERSION = re.compile(r"^[A-Za-z0-9._+\-]{1,32}$")
_LABEL = re.compile(r"^[a-z0-9][a-z0-9\-]{0,62}$")


class MdnsError(Exception):
    """Base class for mDNS errors."""


class MdnsDecodeError(MdnsError):
    """A remote packet is not a DNS message we can read (the sender's fault)."""


class MdnsAdvertError(MdnsError):
    """Advert fields are invalid (remote TXT data, or our own config when building)."""


@dataclass(frozen=True)
class MdnsAdvert:
    """One node's advertisement, validated when built."""

    instance: str  # DNS label, e.g. "hydra-1a2b3c4d"
    port: int
    addresses: tuple[str, ...]
    node_id: str
    mesh_id: str
    token_fingerprint: str
    name: str
    models: tuple[str, ...]
    node_count: int
    version: str
    origin: str  # random per process run; lets a service drop its own packets

    def __post_init__(self) -> None:
        _require(bool(_LABEL.match(self.instance)), f"instance {self.instance!r} is not a DNS label")
        _require(isinstance(self.port, int) and 0 < self.port < 65536, f"port {self.port!r} out of range")
        _require(1 <= len(self.addresses) <= MAX_ADDRESSES, f"need 1..{MAX_ADDRESSES} addresses")
        for a in self.addresses:
            try:
                ipaddress.IPv4Address(a)
            except ValueError:
                raise MdnsAdvertError(f"address {a!r} is not IPv4") from None
        _require(_is_hex(self.node_id, 16, 64), "node_id must be 16..64 lowercase hex")
        _require(bool(_MESH_ID.match(self.mesh_id)), "mesh_id must be 1..128 of [A-Za-z0-9._:-]")
        _require(_is_hex(self.token_fingerprint, 32, 32), "token_fingerprint must be 32 lowercase hex")
        _require(len(self.name) <= MAX_NAME and self.name.isprintable() and "|" not in self.name, "bad name")
        _require(len(self.models) <= MAX_MODELS, f"at most {MAX_MODELS} models")
        for m in self.models:
            _require(bool(_MODEL.match(m)), f"bad model name {m!r}")
        _require(isinstance(self.node_count, int) and 1 <= self.node_count <= MAX_NODE_COUNT, "bad node_count")
        _require(bool(_VERSION.match(self.version)), "bad version")
        _require(_is_hex(self.origin, 16, 32), "origin must be 16..32 lowercase hex")
        for key, value in _txt_pairs(self):
            _require(len(key) + 1 + len(value.encode()) <= MAX_TXT_STRING, f"TXT {key} too long")

    @property
    def instance_fqdn(self) -> str:
        return f"{self.instance}.{SERVICE}"

    @property
    def host(self) -> str:
        return f"{self.instance}.local."


@dataclass(frozen=True)
class MdnsQuery:
    """A question packet; ``asks_for_service`` is true when it asks for our PTR (or ANY)."""

    query_id: int
    asks_for_service: bool
    known_instances: frozenset[str]  # instance labels in the known-answer section (TTL > half)


@dataclass(frozen=True)
class MdnsResponse:
    """An answer packet: complete adverts, goodbyes (instance labels), rejects (label, reason)."""

    adverts: tuple[tuple[MdnsAdvert, int], ...]  # (advert, ttl seconds)
    goodbyes: tuple[str, ...]
    rejected: tuple[tuple[str, str], ...] = field(default=())


MdnsEvent = MdnsQuery | MdnsResponse


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise MdnsAdvertError(msg)


def _is_hex(value: object, lo: int, hi: int) -> bool:
    return isinstance(value, str) and lo <= len(value) <= hi and bool(_HEX.match(value))


def _txt_pairs(a: MdnsAdvert) -> list[tuple[str, str]]:
    return [
        ("svc", APP_ID),
        ("schema", TXT_SCHEMA),
        ("id", a.node_id),
        ("origin", a.origin),
        ("mesh", a.mesh_id),
        ("tok_fp", a.token_fingerprint),
        ("name", a.name),
        ("models", "|".join(a.models)),
        ("nodes", str(a.node_count)),
        ("ver", a.version),
    ]


# ---------------------------------------------------------------- encoding


def encode_announcement(advert: MdnsAdvert, ttl: int = DEFAULT_TTL, *, legacy_query_id: int | None = None) -> bytes:
    """An unsolicited response for ``advert``; ``ttl=0`` makes it a goodbye.

    ``legacy_query_id`` makes it a unicast answer to a query sent from a port other
    than the mDNS port (RFC 6762 §6.7): the id and question are echoed, no cache-flush
    bits are set, and the TTL is capped at 10 s.
    """
    if not 0 <= ttl <= 4500:
        raise MdnsAdvertError(f"ttl {ttl} out of range")
    legacy = legacy_query_id is not None
    if legacy_query_id is not None and not 0 <= legacy_query_id <= 0xFFFF:
        raise MdnsAdvertError("query id out of range")
    if legacy:
        ttl = min(ttl, LEGACY_TTL)
    r = DNSRecord(DNSHeader(id=legacy_query_id if legacy else 0, qr=1, aa=1, ra=0, rd=0))
    if legacy:
        r.add_question(DNSQuestion(SERVICE, QTYPE.PTR, CLASS_IN))
    inst = advert.instance_fqdn
    r.add_answer(RR(SERVICE, QTYPE.PTR, CLASS_IN, ttl, PTR(inst)))
    flush = CLASS_IN if legacy else CLASS_IN | CACHE_FLUSH
    r.add_answer(RR(inst, QTYPE.SRV, flush, ttl, SRV(priority=0, weight=0, port=advert.port, target=advert.host)))
    txt = [f"{k}={v}".encode() for k, v in _txt_pairs(advert)]
    r.add_answer(RR(inst, QTYPE.TXT, flush, ttl, TXT(txt)))
    for addr in advert.addresses:
        r.add_ar(RR(advert.host, QTYPE.A, flush, ttl, A(addr)))
    return bytes(r.pack())


def encode_goodbye(advert: MdnsAdvert) -> bytes:
    return encode_announcement(advert, ttl=0)


def encode_query(query_id: int = 0, *, known: MdnsAdvert | None = None, unicast: bool = False) -> bytes:
    """A PTR question for the service; ``known`` adds our own PTR as a known answer."""
    if not 0 <= query_id <= 0xFFFF:
        raise MdnsAdvertError("query id out of range")
    r = DNSRecord(DNSHeader(id=query_id, qr=0, rd=0))
    r.add_question(DNSQuestion(SERVICE, QTYPE.PTR, CLASS_IN | (UNICAST_RESPONSE if unicast else 0)))
    if known is not None:
        r.add_answer(RR(SERVICE, QTYPE.PTR, CLASS_IN, DEFAULT_TTL, PTR(known.instance_fqdn)))
    return bytes(r.pack())


# ---------------------------------------------------------------- decoding


def _norm(label: object) -> str:
    return str(label).lower()


def _instance_label(fqdn: str) -> str | None:
    if not fqdn.endswith("." + SERVICE):
        return None
    label = fqdn[: -len(SERVICE) - 1]
    return label if _LABEL.match(label) else None


def decode_packet(data: bytes) -> MdnsEvent:
    """Decode one datagram.  Raises :class:`MdnsDecodeError` for unreadable packets."""
    if len(data) > MAX_PACKET:
        raise MdnsDecodeError(f"packet of {len(data)} bytes exceeds {MAX_PACKET}")
    if len(data) < 12:
        raise MdnsDecodeError("packet shorter than a DNS header")
    try:
        msg = DNSRecord.parse(bytes(data))
    except Exception as exc:  # dnslib raises many types (DNSError, struct.error, UnicodeError, ...)
        raise MdnsDecodeError(f"not a DNS message: {type(exc).__name__}") from None
    records = list(msg.rr) + list(msg.auth) + list(msg.ar)
    if len(records) + len(msg.questions) > MAX_RECORDS:
        raise MdnsDecodeError("too many records")
    if msg.header.qr == 0:
        return _decode_query(msg)
    return _decode_response(records)


def _decode_query(msg: DNSRecord) -> MdnsQuery:
    asks = any(_norm(q.qname) == SERVICE and q.qtype in (QTYPE.PTR, QTYPE.ANY) for q in msg.questions)
    known: set[str] = set()
    for rr in msg.rr:
        if rr.rtype == QTYPE.PTR and _norm(rr.rname) == SERVICE and rr.ttl > DEFAULT_TTL // 2:
            label = _instance_label(_norm(rr.rdata.label))
            if label:
                known.add(label)
    return MdnsQuery(query_id=msg.header.id, asks_for_service=asks, known_instances=frozenset(known))


def _decode_response(records: list) -> MdnsResponse:
    ptrs: dict[str, int] = {}
    srv: dict[str, tuple[int, str]] = {}
    txt: dict[str, list[bytes]] = {}
    addrs: dict[str, list[str]] = {}
    for rr in records:
        name = _norm(rr.rname)
        if rr.rtype == QTYPE.PTR and name == SERVICE:
            label = _instance_label(_norm(rr.rdata.label))
            if label is not None:
                ptrs[label] = min(ptrs.get(label, rr.ttl), rr.ttl)
        elif rr.rtype == QTYPE.SRV:
            srv[name] = (int(rr.rdata.port), _norm(rr.rdata.target))
        elif rr.rtype == QTYPE.TXT:
            txt[name] = [bytes(s) for s in rr.rdata.data]
        elif rr.rtype == QTYPE.A:
            addrs.setdefault(name, []).append(str(rr.rdata))
    adverts: list[tuple[MdnsAdvert, int]] = []
    goodbyes: list[str] = []
    rejected: list[tuple[str, str]] = []
    for label, ttl in sorted(ptrs.items()):
        if ttl == 0:
            goodbyes.append(label)
            continue
        fqdn = f"{label}.{SERVICE}"
        if fqdn not in srv or fqdn not in txt:
            rejected.append((label, "incomplete: SRV or TXT missing"))
            continue
        port, target = srv[fqdn]
        try:
            adverts.append((_advert_from(label, port, addrs.get(target, []), txt[fqdn]), ttl))
        except MdnsAdvertError as exc:
            rejected.append((label, str(exc)))
    return MdnsResponse(adverts=tuple(adverts), goodbyes=tuple(goodbyes), rejected=tuple(rejected))


def _parse_txt(strings: list[bytes]) -> dict[str, str]:
    out: dict[str, str] = {}
    for s in strings:
        try:
            text = s.decode("utf-8")
        except UnicodeDecodeError:
            raise MdnsAdvertError("TXT string is not UTF-8") from None
        key, sep, value = text.partition("=")
        if not sep or not key:
            continue  # RFC 6763 §6.4: boolean attributes; none of ours
        key = key.lower()
        if key in out:
            continue  # RFC 6763 §6.4: only the first occurrence counts
        out[key] = value
    return out


def _advert_from(label: str, port: int, addresses: list[str], strings: list[bytes]) -> MdnsAdvert:
    f = _parse_txt(strings)
    if f.get("svc") != APP_ID:
        raise MdnsAdvertError(f"svc is {f.get('svc')!r}, not {APP_ID!r}")
    if f.get("schema") != TXT_SCHEMA:
        raise MdnsAdvertError(f"unsupported TXT schema {f.get('schema')!r}")
    missing = [k for k in ("id", "origin", "mesh", "tok_fp", "nodes", "ver") if k not in f]
    if missing:
        raise MdnsAdvertError(f"TXT missing {', '.join(missing)}")
    nodes = f["nodes"]
    if not (nodes.isascii() and nodes.isdigit() and len(nodes) <= 6):
        raise MdnsAdvertError("nodes is not a small integer")
    models = tuple(m for m in f.get("models", "").split("|") if m)
    unique_addrs = tuple(dict.fromkeys(addresses))[:MAX_ADDRESSES]
    return MdnsAdvert(
        instance=label,
        port=port,
        addresses=unique_addrs,
        node_id=f["id"],
        mesh_id=f["mesh"],
        token_fingerprint=f["tok_fp"],
        name=f.get("name", ""),
        models=models,
        node_count=int(nodes),
        version=f["ver"],
        origin=f["origin"],
    )
