#!/usr/bin/env python3
"""Write protocol/vectors/*.json from the reference implementation, deterministically.

Every key, nonce, ephemeral secret and clock value is fixed, so running this
twice gives identical files; tests/mesh/wire/test_vectors.py checks both that the
files match a fresh run and that every vector holds against the code.

Usage: python protocol/generate_vectors.py [--check]
JSON form of CBOR values: bytes are {"bytes": "<hex>"}; everything else maps 1:1.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cbor2  # noqa: E402
from nacl.signing import SigningKey  # noqa: E402

from hydra_node.mesh.wire import cbor  # noqa: E402
from hydra_node.mesh.wire.secure_channel import SecureChannel  # noqa: E402
from hydra_node.mesh.wire.envelope import seal  # noqa: E402
from hydra_node.mesh.wire.errors import MeshError  # noqa: E402
from hydra_node.mesh.wire.frames import (  # noqa: E402
    Close,
    Data,
    GoAway,
    Message,
    Open,
    LinkPing,
    LinkPong,
    Reset,
    Window,
    encode_frame,
)
from hydra_node.mesh.wire.handshake import Handshake  # noqa: E402
from hydra_node.mesh.wire.ids import MeshSecret, node_id_from_public_key  # noqa: E402
from hydra_node.mesh.wire.token import issue_invite, parse_invite  # noqa: E402

sys.path.insert(0, str(ROOT / "protocol"))
from relay_vectors import relay_vectors  # noqa: E402  (protocol/relay_vectors.py)
from membership_vectors import membership_vectors  # noqa: E402  (protocol/membership_vectors.py)
from caps_vectors import caps_vectors  # noqa: E402  (protocol/caps_vectors.py)

VECTORS = ROOT / "protocol" / "vectors"
SEED_A = bytes([0xA1]) * 32
SEED_B = bytes([0xB2]) * 32
SEED_C = bytes([0xC3]) * 32
EPH_I = bytes([0x11]) * 32
EPH_R = bytes([0x22]) * 32
MESH_KEY = bytes([0x77]) * 32
OTHER_MESH_KEY = bytes([0x88]) * 32
NOW = 1_790_000_000
NONCE = bytes(range(16))


def to_json(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_json(v) for v in value]
    return value


def error_code(fn: Any) -> str:
    try:
        fn()
    except MeshError as exc:
        return exc.code
    raise AssertionError("expected an error")


def cbor_vectors() -> dict[str, Any]:
    valid = [
        ("uint 0", 0),
        ("uint 23", 23),
        ("uint 24", 24),
        ("uint 255", 255),
        ("uint 256", 256),
        ("uint 65536", 65536),
        ("uint 2^32", 2**32),
        ("uint max", 2**64 - 1),
        ("nint -1", -1),
        ("nint -24", -24),
        ("nint -25", -25),
        ("nint min", -(2**64)),
        ("false", False),
        ("true", True),
        ("null", None),
        ("float 1.0 is half", 1.0),
        ("float 1.5", 1.5),
        ("float 100000.0 is single", 100000.0),
        ("float 0.1 is double", 0.1),
        ("float -0.0", -0.0),
        ("empty bytes", b""),
        ("bytes", b"\x00\x01\xff"),
        ("empty text", ""),
        ("text", "hydra"),
        ("text utf8", "ü水"),
        ("empty array", []),
        ("array", [1, [2, 3], "x"]),
        ("empty map", {}),
        ("map keys sorted bytewise == length-first for text keys", {"b": 1, "a": 2, "aa": 3, "z": 4, "": 5}),
        ("nested map", {"peer": {"gpu": "none", "vram": 0}, "t": "announce"}),
    ]
    invalid = [
        ("duplicate key", "a2616101616102", "duplicate_key"),
        ("keys out of order", "a2616201616101", "unsorted_keys"),
        ("longer key before shorter", "a262616101616202", "unsorted_keys"),
        ("non-shortest uint 1 byte", "1817", "non_shortest"),
        ("non-shortest uint 2 bytes", "190017", "non_shortest"),
        ("non-shortest uint 4 bytes", "1a000000ff", "non_shortest"),
        ("non-shortest uint 8 bytes", "1b00000000ffffffff", "non_shortest"),
        ("non-shortest nint", "3800", "non_shortest"),
        ("non-shortest length", "5801ff", "non_shortest"),
        ("indefinite bytes", "5f41ff41ffff", "indefinite_length"),
        ("indefinite text", "7f6161ff", "indefinite_length"),
        ("indefinite array", "9f01ff", "indefinite_length"),
        ("indefinite map", "bf616101ff", "indefinite_length"),
        ("lone break", "ff", "indefinite_length"),
        ("tag epoch time", "c11a514b67b0", "tag"),
        ("tag bignum", "c249010000000000000000", "tag"),
        ("tag 35 (a regular expression in generic decoders)", "d8236161", "tag"),
        ("tag 258 (a set in generic decoders)", "d901028101", "tag"),
        ("tag nested in a map value", "a16172d8236161", "tag"),
        ("undefined", "f7", "bad_simple"),
        ("simple value 16", "f0", "bad_simple"),
        ("simple value 255", "f8ff", "bad_simple"),
        ("float not shortest (1.0 as single)", "fa3f800000", "non_canonical"),
        ("float not shortest (1.5 as double)", "fb3ff8000000000000", "non_canonical"),
        ("NaN", "f97e00", "non_finite_float"),
        ("infinity", "f97c00", "non_finite_float"),
        ("integer map key", "a10102", "non_text_key"),
        ("bytes map key", "a1416101", "non_text_key"),
        ("trailing bytes", "0000", "trailing_bytes"),
        ("truncated head", "19ff", "truncated"),
        ("truncated string", "636162", "truncated"),
        ("array claims too many items", "9a7fffffff00", "truncated"),
        ("empty input", "", "truncated"),
        ("reserved additional info", "1c", "reserved"),
        ("invalid utf8", "62c328", "invalid_utf8"),
        ("too deep", "81" * 17 + "00", "too_deep"),
    ]
    out_valid = [{"name": n, "hex": cbor.encode(v).hex(), "decoded": to_json(v)} for n, v in valid]
    out_invalid = [
        {"name": n, "hex": h, "error": error_code(lambda h=h: cbor.decode(bytes.fromhex(h)))} for n, h, _ in invalid
    ]
    for vector, (_, _, expected) in zip(out_invalid, invalid):
        assert vector["error"] == expected, (vector, expected)
    return {
        "description": "Canonical CBOR of the restricted data model (protocol/README.md section 2)",
        "max_depth": cbor.MAX_DEPTH,
        "valid": out_valid,
        "invalid": out_invalid,
    }


def envelope_vectors() -> dict[str, Any]:
    key = SigningKey(SEED_A)
    body = {"t": "announce", "seq": 7, "models": ["smollm2-135m"]}
    good = seal(key, "announce", body)
    outer = cbor.decode(good)
    forged = cbor.encode({**outer, "body": cbor.encode({**body, "seq": 8})})
    other_gen = cbor.encode({**outer, "gen": 2})
    return {
        "description": "Signed envelopes (protocol/README.md section 3); signer seed is the Ed25519 seed",
        "signer_seed": SEED_A.hex(),
        "signer_id": node_id_from_public_key(bytes(key.verify_key)),
        "valid": [
            {
                "name": "announce",
                "context": "announce",
                "body": to_json(body),
                "hex": good.hex(),
                "signing_input_hex": (b"hydra/1/announce\x00" + cbor.encode(body)).hex(),
            }
        ],
        "invalid": [
            {
                "name": "body altered after signing",
                "hex": forged.hex(),
                "context": "announce",
                "error": "bad_signature",
            },
            {"name": "generation 2", "hex": other_gen.hex(), "context": "announce", "error": "generation_mismatch"},
            {"name": "wrong context", "hex": good.hex(), "context": "invite", "error": "wrong_context"},
            {"name": "not a map", "hex": "80", "context": "announce", "error": "malformed"},
        ],
    }


def token_vectors() -> dict[str, Any]:
    key = SigningKey(SEED_A)
    mesh = MeshSecret(MESH_KEY)
    text = issue_invite(key, mesh.mesh_id, ["ws://192.168.1.10:7300", "10.0.0.2:7300"], 3600, NOW, nonce=NONCE)
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    outer = cbor.decode(raw)
    body = cbor.decode(outer["body"])
    forged_raw = cbor.encode({**outer, "body": cbor.encode({**body, "exp": body["exp"] + 10**6})})
    forged = base64.urlsafe_b64encode(forged_raw).rstrip(b"=").decode()
    cases = [
        ("valid", text, NOW + 10, None),
        ("expired", text, NOW + 3600, None),
        ("forged expiry", forged, NOW + 10, None),
        ("foreign mesh", text, NOW + 10, MeshSecret(OTHER_MESH_KEY).mesh_id),
        ("not base64url", "not a token!", NOW, None),
        ("padded base64", text + "=", NOW, None),
        ("truncated", text[:-10], NOW, None),
    ]
    out = []
    for name, token_text, now, expected_mesh in cases:
        entry: dict[str, Any] = {"name": name, "token": token_text, "now": now, "expected_mesh_id": expected_mesh}
        try:
            token = parse_invite(token_text, now, expected_mesh_id=expected_mesh)
            entry["parsed"] = {
                "mesh_id": token.mesh_id,
                "issuer_id": token.issuer_id,
                "addrs": list(token.addrs),
                "expires_at": token.expires_at,
                "nonce": token.nonce.hex(),
            }
        except MeshError as exc:
            entry["error"] = exc.code
        out.append(entry)
    return {
        "description": "Invite tokens (protocol/README.md section 6)",
        "issuer_seed": SEED_A.hex(),
        "mesh_key": MESH_KEY.hex(),
        "mesh_id": mesh.mesh_id,
        "cases": out,
    }


def invite_vectors() -> dict[str, Any]:
    """Tokens with ``uses``, signed revocation lists, and the admission rule (section 6.1)."""
    import tempfile

    from hydra_node.mesh.invites import InviteBook, RevocationTable, check_invite
    from hydra_node.mesh.wire.revocations import Revocation, open_revocations, seal_revocations

    issuer, member, outsider = SigningKey(SEED_A), SigningKey(SEED_B), SigningKey(SEED_C)
    mesh = MeshSecret(MESH_KEY)
    addrs = ["127.0.0.1:7300"]

    def token_b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    def code_of(fn: Any) -> str | None:
        try:
            fn()
        except MeshError as exc:
            return exc.code
        return None

    once = issue_invite(issuer, mesh.mesh_id, addrs, 3600, NOW, nonce=bytes([1]) * 16, uses=1)
    twice = issue_invite(issuer, mesh.mesh_id, addrs, 3600, NOW, nonce=bytes([2]) * 16, uses=2)
    plain = issue_invite(issuer, mesh.mesh_id, addrs, 3600, NOW, nonce=bytes([3]) * 16)
    body = {"addrs": addrs, "exp": NOW + 3600, "mesh": mesh.mesh_id, "nonce": bytes([4]) * 16}
    tokens = []
    for name, text in [
        ("uses 1", once),
        ("uses 2", twice),
        ("no uses (unlimited, as before uses existed)", plain),
        ("uses 0", token_b64(seal(issuer, "invite", {**body, "uses": 0}))),
        ("uses 1001", token_b64(seal(issuer, "invite", {**body, "uses": 1001}))),
        ("uses as text", token_b64(seal(issuer, "invite", {**body, "uses": "1"}))),
        ("unknown key", token_b64(seal(issuer, "invite", {**body, "use": 1}))),
    ]:
        entry: dict[str, Any] = {"name": name, "token": text, "now": NOW + 10}
        try:
            tok = parse_invite(text, NOW + 10)
            entry["parsed"] = {"id": tok.token_id, "uses": tok.uses, "expires_at": tok.expires_at}
        except MeshError as exc:
            entry["error"] = exc.code
        tokens.append(entry)

    revoked = [Revocation(bytes([3]) * 16, NOW + 3600, "revoked"), Revocation(bytes([1]) * 16, NOW + 3600, "used")]
    v2 = seal_revocations(issuer, mesh.mesh_id, 2, revoked)
    v2_decoded = cbor.decode(cbor.decode(v2)["body"])
    outer = cbor.decode(v2)
    lists_invalid = []
    for name, raw in [
        ("altered body (forged)", cbor.encode({**outer, "body": cbor.encode({**v2_decoded, "ver": 9})})),
        ("other mesh", seal_revocations(issuer, MeshSecret(OTHER_MESH_KEY).mesh_id, 2, revoked)),
        (
            "entries out of order",
            seal(issuer, "invite-revocations", {**v2_decoded, "revoked": list(reversed(v2_decoded["revoked"]))}),
        ),
        ("duplicate id", seal(issuer, "invite-revocations", {**v2_decoded, "revoked": v2_decoded["revoked"][:1] * 2})),
        (
            "unknown reason",
            seal(
                issuer, "invite-revocations", {**v2_decoded, "revoked": [{**v2_decoded["revoked"][0], "why": "lost"}]}
            ),
        ),
        ("version 0", seal(issuer, "invite-revocations", {**v2_decoded, "ver": 0})),
        ("extra key", seal(issuer, "invite-revocations", {**v2_decoded, "note": "x"})),
        ("an invite token's envelope (wrong context)", base64.urlsafe_b64decode(plain + "=" * (-len(plain) % 4))),
    ]:
        lists_invalid.append(
            {
                "name": name,
                "hex": raw.hex(),
                "error": code_of(lambda r=raw: open_revocations(r, expected_mesh_id=mesh.mesh_id)),
            }
        )

    # A receiver's table: which offers it takes (the newest list per issuer; its signer must be a member).
    members = {node_id_from_public_key(bytes(k.verify_key)) for k in (issuer, member)}
    table = RevocationTable(mesh.mesh_id)
    v1 = seal_revocations(issuer, mesh.mesh_id, 1, revoked[:1])
    v2_other = seal_revocations(issuer, mesh.mesh_id, 2, revoked[:1])
    v3 = seal_revocations(issuer, mesh.mesh_id, 3, [])
    stranger = seal_revocations(outsider, mesh.mesh_id, 5, revoked)
    table_steps = []
    for name, raw in [
        ("v1 from the issuer", v1),
        ("v2 (newer)", v2),
        ("v1 again (a replay)", v1),
        ("v2 again (a duplicate: taken, not relayed)", v2),
        ("another v2 (equivocation)", v2_other),
        ("v3 (empty: nothing revoked any more)", v3),
        ("a list signed by a non-member", stranger),
    ]:
        try:
            got = table.offer(raw, is_member=members.__contains__)
            outcome = "accepted" if got is not None else "duplicate"
        except MeshError as exc:
            outcome = exc.code
        table_steps.append({"name": name, "hex": raw.hex(), "outcome": outcome})

    # The admission rule at a member that did not issue the token, holding the issuer's v2 list.
    held = RevocationTable(mesh.mesh_id)
    held.offer(v2, is_member=members.__contains__)
    member_id = node_id_from_public_key(bytes(member.verify_key))
    fresh = issue_invite(issuer, mesh.mesh_id, addrs, 3600, NOW, nonce=bytes([5]) * 16)
    at_member = []
    for name, text, now in [
        ("revoked token", plain, NOW + 10),
        ("used-up token", once, NOW + 10),
        ("uses-limited token at a non-issuer", twice, NOW + 10),
        ("unlisted unlimited token", fresh, NOW + 10),
    ]:
        tok = parse_invite(text, now)
        result = code_of(lambda t=tok, n=now: check_invite(t, own_id=member_id, book=None, table=held, now=n))
        at_member.append({"name": name, "token": text, "now": now, "result": result or "admitted"})

    # The issuer's own count: a uses-2 token admits twice, then is used up; then its list names it.
    with tempfile.TemporaryDirectory() as tmp:
        book = InviteBook(Path(tmp) / "invites.json", issuer)
        tok = parse_invite(twice, NOW)
        book.record(tok, NOW)
        issuer_story = []
        for i in range(3):
            result = code_of(
                lambda i=i: check_invite(tok, own_id=tok.issuer_id, book=book, table=None, now=NOW + 10 + i)
            )
            issuer_story.append({"now": NOW + 10 + i, "result": result or "admitted"})
        after = open_revocations(book.revocation_list(mesh.mesh_id, NOW + 20), expected_mesh_id=mesh.mesh_id)
    return {
        "description": "Invite tokens with uses, signed invite revocation lists and the admission rule "
        "(protocol/README.md section 6.1)",
        "issuer_seed": SEED_A.hex(),
        "member_seed": SEED_B.hex(),
        "outsider_seed": SEED_C.hex(),
        "mesh_key": MESH_KEY.hex(),
        "mesh_id": mesh.mesh_id,
        "tokens": tokens,
        "list": {
            "hex": v2.hex(),
            "issuer_id": node_id_from_public_key(bytes(issuer.verify_key)),
            "body": to_json(v2_decoded),
        },
        "lists_invalid": lists_invalid,
        "table_story": table_steps,
        "at_member": at_member,
        "issuer_story": {
            "token": twice,
            "steps": issuer_story,
            "list_after": [to_json(e.to_wire()) for e in after.entries],
        },
    }


def frame_vectors() -> dict[str, Any]:
    frames = [
        ("open", Open(1, {"kind": "generate", "model": "smollm2-135m"})),
        ("data", Data(1, b"hello")),
        ("close", Close(1)),
        ("reset", Reset(2, "cancel", "client went away")),
        ("window", Window(3, 131072)),
        ("message", Message({"t": "gossip", "seq": 1})),
        ("ping", LinkPing(bytes(8))),
        ("pong", LinkPong(b"\x00\x00\x00\x00\x00\x00\x00\x07")),
        ("goaway", GoAway("normal", "")),
    ]
    valid = [{"name": n, "hex": encode_frame(f).hex(), "kind": type(f).__name__} for n, f in frames]
    invalid = [
        ("short header", "0100", "bad_frame"),
        ("unknown kind", "0a00000000", "bad_frame"),
        ("data on stream 0", "020000000061", "bad_frame"),
        ("empty data", "0200000001", "bad_frame"),
        ("message on stream 1", "0600000001a0", "bad_frame"),
        ("open header not a map", "010000000180", "bad_cbor"),
        ("open header not canonical", "0100000001a2616201616101", "bad_cbor"),
        ("close with payload", "030000000100", "bad_frame"),
        ("window of zero", "050000000100000000", "bad_frame"),
        ("ping of 7 bytes", "0700000000" + "00" * 7, "bad_frame"),
    ]
    from hydra_node.mesh.wire.frames import decode_frame

    out_invalid = []
    for name, hexstr, expected in invalid:
        code = error_code(lambda h=hexstr: decode_frame(bytes.fromhex(h)))
        assert code == expected, (name, code)
        out_invalid.append({"name": name, "hex": hexstr, "error": code})
    return {
        "description": "Plaintext link frames (protocol/README.md section 5)",
        "valid": valid,
        "invalid": out_invalid,
    }


def channel_vectors() -> dict[str, Any]:
    k1, k2 = bytes([0x01]) * 32, bytes([0x02]) * 32
    sender = SecureChannel(k1, k2)
    frames = [sender.seal(p) for p in (b"first", b"", b"third frame")]
    return {
        "description": "Encrypted frames (protocol/README.md section 4.5): sender uses send_key; receiver swaps the keys",
        "send_key": k1.hex(),
        "receive_key": k2.hex(),
        "frames": [{"plaintext": p.hex(), "hex": f.hex()} for p, f in zip((b"first", b"", b"third frame"), frames)],
        "receiver_story": [
            {"hex": frames[0].hex(), "result": "ok"},
            {"hex": frames[0].hex(), "result": "replay"},
            {"hex": frames[2].hex(), "result": "reorder"},
            {"hex": (frames[1][:-1] + bytes([frames[1][-1] ^ 1])).hex(), "result": "tamper"},
            {"hex": frames[1].hex(), "result": "ok"},
            {"hex": frames[2].hex(), "result": "ok"},
        ],
    }


def _story(
    name: str, initiator: Handshake, responder: Handshake, setup: dict[str, Any], first: bytes | None = None
) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    story: dict[str, Any] = {"name": name, "setup": setup, "messages": messages}
    data, side = (initiator.initiate() if first is None else first), "initiator"
    peers = {"initiator": responder, "responder": initiator}
    while data is not None:
        messages.append({"from": side, "hex": data.hex()})
        receiver = "responder" if side == "initiator" else "initiator"
        try:
            data = peers[side].receive(data)
        except MeshError as exc:
            story["error"] = {"side": receiver, "code": exc.code}
            reply = getattr(exc, "reply", None)
            if reply is not None:
                messages.append({"from": receiver, "hex": reply.hex()})
                try:
                    peers[receiver].receive(reply)
                except MeshError as exc2:
                    story["peer_error"] = {"side": side, "code": exc2.code}
            return story
        side = receiver
    ri, rr = initiator.result, responder.result
    story["result"] = {
        "session_id": ri.session_id.hex(),
        "admitted_by": ri.admitted_by,
        "mesh_id": ri.mesh.mesh_id,
        "initiator_send_key": ri.send_key.hex(),
        "responder_send_key": rr.send_key.hex(),
        "initiator_sees": ri.peer_id,
        "responder_sees": rr.peer_id,
    }
    assert ri.session_id == rr.session_id and ri.send_key == rr.receive_key
    return story


def handshake_vectors() -> dict[str, Any]:
    """Each story's `setup` says how to build both sides; replaying it must reproduce every message."""
    b = SigningKey(SEED_B)
    mesh = MeshSecret(MESH_KEY)
    token_text = issue_invite(b, mesh.mesh_id, ["127.0.0.1:7300"], 600, NOW, nonce=NONCE)
    foreign_text = issue_invite(SigningKey(SEED_A), mesh.mesh_id, ["127.0.0.1:7300"], 600, NOW, nonce=NONCE)
    raw = base64.urlsafe_b64decode(token_text + "=" * (-len(token_text) % 4))
    outer = cbor.decode(raw)
    forged_body = {**cbor.decode(outer["body"]), "exp": NOW + 10**7}
    forged_text = (
        base64.urlsafe_b64encode(cbor.encode({**outer, "body": cbor.encode(forged_body)})).rstrip(b"=").decode()
    )
    member = {"initiator_seed": SEED_A.hex(), "mesh_key": MESH_KEY.hex()}
    newcomer = {"initiator_seed": SEED_C.hex(), "invite": token_text}
    setups = [
        ("member joins by mesh key", member),
        ("newcomer joins by invite token", newcomer),
        ("invite expired at the responder", {**newcomer, "responder_now": NOW + 600}),
        ("invite issued by a non-member", {**newcomer, "invite": foreign_text}),
        ("invite forged (presented text differs from what was parsed)", {**newcomer, "present": forged_text}),
        ("different mesh", {**member, "mesh_key": OTHER_MESH_KEY.hex()}),
        (
            "stranger claims the mesh id without its key",
            {**member, "mesh_key": OTHER_MESH_KEY.hex(), "claim_mesh_id": mesh.mesh_id},
        ),
        (
            "protocol generation 2 hello",
            {**member, "first": cbor.encode({"eph": bytes(32), "gen": 2, "mesh": mesh.mesh_id, "type": "hello"}).hex()},
        ),
    ]
    stories = []
    for name, setup in setups:
        initiator, responder = build_story_parties(setup)
        first = bytes.fromhex(setup["first"]) if "first" in setup else None
        stories.append(_story(name, initiator, responder, setup, first))
    return {
        "description": "Handshake stories (protocol/README.md section 4). Build each side from `setup` "
        "(see build_story_parties in protocol/generate_vectors.py), feed each side the other's messages, "
        "and every message and error must match.",
        "responder_seed": SEED_B.hex(),
        "initiator_ephemeral": EPH_I.hex(),
        "responder_ephemeral": EPH_R.hex(),
        "responder_mesh_key": MESH_KEY.hex(),
        "now": NOW,
        "stories": stories,
    }


def build_story_parties(setup: dict[str, Any]) -> tuple[Handshake, Handshake]:
    """Both handshake cores of a story, from its setup (fixed keys, ephemerals and clocks)."""
    if "invite" in setup:
        token = parse_invite(setup["invite"], NOW)
        if "present" in setup:
            token = type(token)(
                mesh_id=token.mesh_id,
                issuer_public_key=token.issuer_public_key,
                addrs=token.addrs,
                expires_at=token.expires_at,
                nonce=token.nonce,
                text=setup["present"],
            )
        credential: Any = token
    else:
        credential = MeshSecret(bytes.fromhex(setup["mesh_key"]))
    initiator = Handshake(
        "initiator",
        SigningKey(bytes.fromhex(setup["initiator_seed"])),
        credential,
        now=setup.get("initiator_now", NOW),
        ephemeral_secret=EPH_I,
    )
    if "claim_mesh_id" in setup:
        initiator._mesh_id = setup["claim_mesh_id"]  # a stranger who knows the public mesh id but not the key
    responder = Handshake(
        "responder",
        SigningKey(SEED_B),
        MeshSecret(MESH_KEY),
        now=setup.get("responder_now", NOW),
        ephemeral_secret=EPH_R,
    )
    return initiator, responder


def announcement_vectors() -> dict[str, Any]:
    """Signed announcements (section 11.2) and a gossip message carrying one (section 11.1)."""
    import dataclasses

    from hydra_node.mesh.membership.signing import _unsigned_bytes, sign_announcement
    from hydra_node.mesh.wire.ids import node_id_from_public_key
    from hydra_node.mesh.membership import Announcement, Gossip, Hardware, ModelEntry, PeerRecord, PeerState

    key = SigningKey(bytes(range(32, 64)))
    nid = node_id_from_public_key(bytes(key.verify_key))
    ann = sign_announcement(
        key,
        Announcement(
            node_id=nid,
            incarnation=1795940000,
            seq=3,
            version="0.1.0",
            role="host",
            addresses=("10.0.0.5:9338",),
            api_port=9337,
            console_port=3131,
            models=(ModelEntry("SmolLM2-135M-Instruct-Q4_1", "ready"),),
            hardware=Hardware(cores=8, ram_bytes=16 << 30, vram_bytes=0, usable_bytes=12 << 30),
            queue_depth=1,
            throughput_milli=(("SmolLM2-135M-Instruct-Q4_1", 180000),),
            extra={"name": "alpha"},
        ),
    )
    forged = dataclasses.replace(ann, queue_depth=0)
    slots = sign_announcement(
        key,
        dataclasses.replace(  # a model entry with the optional free_slots
            ann,
            seq=4,
            models=(ModelEntry("SmolLM2-135M-Instruct-Q4_1", "ready", free_slots=3),),
            extra={"name": "alpha"},
        ),
    )
    ident = sign_announcement(
        key,
        dataclasses.replace(  # a model entry with the optional ident (its file's identity)
            ann,
            seq=5,
            models=(ModelEntry("SmolLM2-135M-Instruct-Q4_1", "ready", free_slots=3, ident="3f9a0c12de45b678"),),
            extra={"name": "alpha"},
        ),
    )
    gossip = Gossip((PeerRecord(nid, ann.incarnation, PeerState.ALIVE, ann),))
    message = {"t": "gossip", "m": gossip.to_wire()}
    return {
        "description": "Announcements signed by the node they describe; verify with the node id as public key.",
        "seed": {"bytes": bytes(range(32, 64)).hex()},
        "valid": [
            {
                "name": "signed_announcement",
                "wire": to_json(ann.to_wire()),
                "signing_input": {"bytes": _unsigned_bytes(ann).hex()},
                "signature": {"bytes": dict(ann.extra)["sig"].hex()},
            },
            {
                "name": "signed_announcement_with_free_slots",
                "wire": to_json(slots.to_wire()),
                "signing_input": {"bytes": _unsigned_bytes(slots).hex()},
                "signature": {"bytes": dict(slots.extra)["sig"].hex()},
            },
            {
                "name": "signed_announcement_with_model_ident",
                "wire": to_json(ident.to_wire()),
                "signing_input": {"bytes": _unsigned_bytes(ident).hex()},
                "signature": {"bytes": dict(ident.extra)["sig"].hex()},
            },
        ],
        "invalid": [
            {
                "name": "queue_depth_changed_after_signing",
                "wire": to_json(forged.to_wire()),
                "error": "bad_announcement_signature",
            }
        ],
        "messages": [
            {
                "name": "gossip_message_on_the_priority_lane",
                "decoded": to_json(message),
                "hex": cbor.encode(message).hex(),
            }
        ],
    }


def generate_stream_vectors() -> dict[str, Any]:
    """The generate stream (section 11.3): a continuation's request (``resume_tokens``,
    ``resume_skip``) and delta events carrying ``tokens``, as CBOR and as the frames a host sends."""
    import dataclasses

    from hydra_node.inference import Finished, GenerationRequest, InvalidRequest, MalformedRemoteEvent, TextDelta
    from hydra_node.inference import event_frame, event_from_wire

    plain = GenerationRequest(model="m", kind="completion", prompt="Hello", max_tokens=8, temperature=0.0, seed=7)
    resumed = dataclasses.replace(plain, resume_tokens=(9906, 11, 1917), resume_skip=6, max_tokens=5)
    requests = [("a request (no resume fields on the wire)", plain), ("a continuation", resumed)]
    events = [
        ("a delta with its token ids", TextDelta(" world", tokens=(1917,))),
        ("a delta holding text back (ids, no text yet)", TextDelta("", tokens=(13, 198))),
        ("a delta from a host that sends no ids", TextDelta("!")),
        ("the finished event", Finished("length", prompt_tokens=2, completion_tokens=5, served_by="n1")),
    ]
    bad_requests = [
        ("resume_skip without resume_tokens", dict(plain.to_wire(), resume_skip=3), "resume_skip"),
        ("a token id out of range", dict(plain.to_wire(), resume_tokens=[2**31]), "resume_tokens"),
        ("resume_tokens not a list", dict(plain.to_wire(), resume_tokens=5), "resume_tokens"),
    ]
    bad_events = [
        ("tokens not a list", {"type": "delta", "text": "x", "tokens": 5}),
        ("a negative token id", {"type": "delta", "text": "x", "tokens": [-1]}),
    ]
    for _, wire, param in bad_requests:
        try:
            GenerationRequest.from_wire(wire)
        except InvalidRequest as exc:
            assert exc.param == param, (param, exc.param)
        else:
            raise AssertionError(param)
    for name, wire in bad_events:
        try:
            event_from_wire(wire)
        except MalformedRemoteEvent:
            pass
        else:
            raise AssertionError(name)
    bodies, bad_bodies = _generate_body_vectors(plain)
    images = _generate_image_vectors()
    return {
        "description": "The generate stream (protocol/README.md section 11.3): the request of the OPEN header "
        "(a continuation carries resume_tokens and resume_skip; both are omitted when empty) and the "
        "event frames a host sends (a delta's 'tokens': the ids generated since the previous delta, "
        "omitted when empty). 'frame' is the whole length-prefixed frame. 'bodies': a request whose "
        "{'kind': 'generate', 'req': ...} header would pass 16 KiB goes as {'kind': 'generate', 'body': N} and "
        "then N bytes of its canonical CBOR in the stream's data; 'invalid_bodies': headers and bodies a host "
        "answers with an invalid_request error event. 'images': chat requests carrying images (one with "
        "its bytes, one elided, a repeat elided within its request), the host's images_missing error frame, "
        "and malformed images (refused with param 'images' or 'messages').",
        "requests": [
            {"name": n, "decoded": to_json(r.to_wire()), "hex": cbor.encode(r.to_wire()).hex()} for n, r in requests
        ],
        "events": [{"name": n, "decoded": to_json(e.to_wire()), "frame": event_frame(e).hex()} for n, e in events],
        "invalid_requests": [{"name": n, "decoded": to_json(w), "param": p} for n, w, p in bad_requests],
        "invalid_events": [{"name": n, "decoded": to_json(w)} for n, w in bad_events],
        "bodies": bodies,
        "invalid_bodies": bad_bodies,
        "images": images,
    }


#: Two 2x2 one-colour RGB PNGs (red, blue), as bytes: fixed here (a zlib build may compress differently).
RED_PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000002000000020802000000fdd49a730000001049444154789c63f8cfc000440c100a"
    "001fee03fd8b5f14d40000000049454e44ae426082"
)
BLUE_PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000002000000020802000000fdd49a730000000f49444154789c636060f80f46600a00"
    "17f603fd7eeb37f30000000049454e44ae426082"
)


def _generate_image_vectors() -> dict[str, Any]:
    """A chat's images on a generate request (section 11.3): ``images`` in the order of the U+FFFC
    marks in the messages' content, each ``{sha256, mime, width, height, data?}``."""
    from hydra_node.inference import ChatMessage, GenerationError, GenerationRequest, InvalidRequest, event_frame
    from hydra_node.inference.images import IMAGE_MARK, MAX_IMAGES, ImageBlob, image_sha256
    from hydra_node.routing.image_cache import SentImages
    from hydra_node.routing.remote import images_missing_error

    red = ImageBlob(image_sha256(RED_PNG), RED_PNG, "image/png", 2, 2)
    blue = ImageBlob(image_sha256(BLUE_PNG), BLUE_PNG, "image/png", 2, 2)

    def chat(*images: ImageBlob, text: str = "What colour is this?") -> GenerationRequest:
        return GenerationRequest(
            model="m",
            kind="chat",
            messages=(ChatMessage("user", text + IMAGE_MARK * len(images)),),
            images=images,
            max_tokens=8,
            seed=7,
        )

    requests = [
        ("a chat with one image and its bytes", chat(red)),
        ("the same image elided (the host holds it from this requester)", chat(red.without_data())),
        (
            "an image twice: its bytes once, the repeat elided (filled from the same request)",
            chat(*SentImages.once([red, blue, red]), text="Which differs? "),
        ),
    ]
    base = chat(red).to_wire()
    image = base["images"][0]
    bad = [
        ("a sha256 that is not 64 lower-case hex digits", {**image, "sha256": image["sha256"].upper()}, "images"),
        ("bytes that do not match the sha256", {**image, "data": BLUE_PNG}, "images"),
        ("a type the host does not decode", {**image, "mime": "image/webp"}, "images"),
        ("a width of 0", {**image, "width": 0}, "images"),
        ("data that is text, not bytes", {**image, "data": RED_PNG.hex()}, "images"),
    ]
    invalid = [(n, {**base, "images": [im]}, p) for n, im, p in bad]
    invalid += [
        ("an image without its mark in the messages", {**base, "messages": [["user", "What colour?"]]}, "messages"),
        (
            f"more than {MAX_IMAGES} images",
            {**base, "messages": [["user", IMAGE_MARK * (MAX_IMAGES + 1)]], "images": [image] * (MAX_IMAGES + 1)},
            "messages",
        ),
        (
            "images on a completion",
            {**GenerationRequest(model="m", kind="completion", prompt=IMAGE_MARK).to_wire(), "images": [image]},
            "prompt",
        ),
        ("images not a list", {**base, "images": image}, "images"),
    ]
    for name, wire, param in invalid:
        try:
            GenerationRequest.from_wire(wire)
        except InvalidRequest as exc:
            assert exc.param == param, (name, exc.param)
        else:
            raise AssertionError(name)
    missing: GenerationError = images_missing_error("ab" * 32, (red.sha256,))
    return {
        "requests": [
            {"name": n, "decoded": to_json(r.to_wire()), "hex": cbor.encode(r.to_wire()).hex()} for n, r in requests
        ],
        "images_missing": {
            "decoded": to_json({"type": "error", **missing.to_wire()}),
            "frame": event_frame(missing).hex(),
        },
        "invalid": [{"name": n, "decoded": to_json(w), "param": p} for n, w, p in invalid],
    }


def _generate_body_vectors(plain: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A request too large for the OPEN header travels as the stream's body (section 11.3):
    ``{"kind": "generate", "body": N}``, then the request's N bytes of canonical CBOR."""
    from hydra_node.inference import ChatMessage, GenerationRequest, InvalidRequest
    from hydra_node.routing.remote import MAX_GENERATE_BODY_BYTES, body_length, generate_header, request_from_body

    long_chat = GenerationRequest(
        model="m",
        kind="chat",
        messages=(ChatMessage("system", "You are terse. " * 1100), ChatMessage("user", "Hello")),
        max_tokens=8,
        seed=7,
    )
    header, body = generate_header(long_chat)
    assert body is not None and generate_header(plain)[1] is None
    small = cbor.encode(plain.to_wire())
    bodies = [
        {
            "name": "a chat too large for the header (a requester must send it as a body)",
            "header": to_json(header),
            "header_hex": cbor.encode(header).hex(),
            "body_hex": body.hex(),
            "decoded": to_json(long_chat.to_wire()),
        },
        {
            "name": "a small request sent as a body (a host accepts it; requesters send it in the header)",
            "header": {"kind": "generate", "body": len(small)},
            "header_hex": cbor.encode({"kind": "generate", "body": len(small)}).hex(),
            "body_hex": small.hex(),
            "decoded": to_json(plain.to_wire()),
        },
    ]
    n = len(small)
    bad = [
        ("N above the bound", {"kind": "generate", "body": MAX_GENERATE_BODY_BYTES + 1}, b""),
        ("N zero", {"kind": "generate", "body": 0}, b""),
        ("N not an integer", {"kind": "generate", "body": "12"}, b""),
        ("both req and body", {"kind": "generate", "body": n, "req": plain.to_wire()}, small),
        ("a truncated body (the stream ended early)", {"kind": "generate", "body": n}, small[:-1]),
        ("an over-long body", {"kind": "generate", "body": n}, small + b"\x00"),
        ("junk", {"kind": "generate", "body": 4}, b"\xff\xff\xff\xff"),
        ("non-canonical CBOR (an integer with a longer head)", {"kind": "generate", "body": 2}, b"\x18\x05"),
        ("CBOR that is not a request map", {"kind": "generate", "body": 4}, b"\x83\x01\x02\x03"),
    ]
    bad_bodies = []
    for name, h, data in bad:
        try:
            length = body_length(h)
            assert length is not None
            request_from_body(data, length)
        except InvalidRequest:
            pass
        else:
            raise AssertionError(name)
        bad_bodies.append({"name": name, "header": to_json(h), "body_hex": data.hex(), "error": "invalid_request"})
    return bodies, bad_bodies


def tunnel_data_vectors() -> dict[str, Any]:
    from hydra_node.runtime.rpc.dataconn import MAGIC, channel_for, direction_keys, seal_frame

    secret, ticket = bytes(range(32)), bytes(range(0xA0, 0xB0))
    c2w, w2c = direction_keys(secret)
    coord, worker = channel_for(secret, "coordinator"), channel_for(secret, "worker")
    frames = [
        ("coordinator", b""),
        ("worker", b""),
        ("coordinator", bytes([8]) + bytes(8) + b"get"),
        ("worker", b"\x03\x00\x00\x00\x00\x00\x00\x00abc"),
    ]
    out = []
    for side, plaintext in frames:
        wire = seal_frame(coord if side == "coordinator" else worker, plaintext)
        out.append({"from": side, "plaintext": plaintext.hex(), "wire": wire.hex()})
    return {
        "description": "Tunnel data connections (protocol/README.md section 11.5): keys are BLAKE2b-256 keyed "
        "with the offer's secret, personalisation 'hydra-tun-c2w' / 'hydra-tun-w2c'; a frame is "
        "u32 big-endian length || counter u64 big-endian || XChaCha20-Poly1305; the first frame "
        "each way is the empty hello / accept",
        "secret": secret.hex(),
        "ticket": ticket.hex(),
        "preamble": (MAGIC + ticket).hex(),
        "key_c2w": c2w.hex(),
        "key_w2c": w2c.hex(),
        "frames": out,
    }


def _codec_error(fn: Any) -> str:
    from hydra_node.codec.errors import DecodeError
    from hydra_node.runtime.rpc.lease_wire import ControlError

    try:
        fn()
    except (DecodeError, ControlError) as exc:
        return exc.code
    raise AssertionError("expected an error")


def _decode_all(data: bytes, limit: int) -> list[Any]:
    from hydra_node.codec.framing import MessageDecoder

    decoder = MessageDecoder(limit)
    decoder.receive_data(data)
    out = []
    while (msg := decoder.next_message()) is not None:
        out.append(msg)
    return out


def framing_vectors() -> dict[str, Any]:
    from hydra_node.codec.framing import MAX_MESSAGE_DEPTH, MAX_OP_CHARS, encode_message

    limit = 64
    valid = [
        ("small map", {"op": "ping", "n": 1}),
        ("event", {"op": "event", "ev": {"type": "delta", "text": "hi"}}),
        ("bytes and floats", {"op": "x", "b": b"\x00\xff", "f": 0.5}),
    ]
    out_valid = [{"name": n, "decoded": to_json(m), "hex": encode_message(m, limit=limit).hex()} for n, m in valid]

    def fr(body: bytes) -> str:
        return (len(body).to_bytes(4, "big") + body).hex()

    invalid = [
        ("length above the limit (refused before the body)", (limit + 1).to_bytes(4, "big").hex(), "too_large"),
        ("body is not a map", fr(cbor.encode(1)), "bad_message"),
        ("map without op", fr(cbor.encode({"a": 1})), "bad_message"),
        ("op is not text", fr(cbor.encode({"op": 1})), "bad_message"),
        ("op too long", fr(cbor.encode({"op": "a" * (MAX_OP_CHARS + 1)})), "bad_message"),
        (
            "tag 35 (regex) in the body",
            fr(cbor2.dumps({"op": "x", "r": cbor2.CBORTag(35, "a")}, canonical=True)),
            "tag",
        ),
        (
            "tag 258 (set) in the body",
            fr(cbor2.dumps({"op": "x", "s": cbor2.CBORTag(258, [1])}, canonical=True)),
            "tag",
        ),
        ("duplicate key", fr(bytes.fromhex("a2626f706178626f706179")), "duplicate_key"),
        ("float not in its shortest form", fr(bytes.fromhex("a26166fb3ff0000000000000626f706178")), "non_canonical"),
        ("too deep", fr(cbor.encode({"op": "x", "d": [[[[[[[[1]]]]]]]]})), "too_deep"),
        ("truncated body: waiting for more", (5).to_bytes(4, "big").hex() + "a1626f70", None),
    ]
    out_invalid = []
    for name, hexdata, expected in invalid:
        data = bytes.fromhex(hexdata)
        if expected is None:
            assert _decode_all(data, limit) == []
            out_invalid.append({"name": name, "hex": hexdata, "error": None})
            continue
        got = _codec_error(lambda data=data: _decode_all(data, limit))
        assert got == expected, (name, got, expected)
        out_invalid.append({"name": name, "hex": hexdata, "error": got})
    return {
        "description": "Length-prefixed frames (protocol/README.md section 2.1): u32 big-endian length || one "
        "canonical CBOR map with a text 'op'; decoded with the frame limit below. An error of "
        "null means the decoder is still waiting for bytes (no message, no error).",
        "limit": limit,
        "max_depth": MAX_MESSAGE_DEPTH,
        "max_op_chars": MAX_OP_CHARS,
        "valid": out_valid,
        "invalid": out_invalid,
    }


def lease_vectors() -> dict[str, Any]:
    from hydra_node.runtime.rpc.proto import ProtoVersion
    from hydra_node.runtime.rpc.lease_wire import (
        MAX_CONTROL_FRAME_BYTES,
        ControlDecoder,
        DataOffer,
        LeaseGranted,
        NoDataOffer,
        PathChoice,
        encode_control,
    )

    def event_json(ev: Any) -> dict[str, Any]:
        if isinstance(ev, LeaseGranted):
            return {
                "type": "lease_granted",
                "proto": str(ev.proto),
                "free_bytes": ev.free_bytes,
                "device": ev.device,
                "data": ev.data,
            }
        if isinstance(ev, DataOffer):
            return {"type": "data_offer", "port": ev.port, "ticket": ev.ticket.hex(), "secret": ev.secret.hex()}
        if isinstance(ev, NoDataOffer):
            return {"type": "no_data_offer"}
        return {"type": "path", "via": ev.via}

    grant = LeaseGranted(ProtoVersion(7, 0, 0), 6 * 2**30, "CUDA0 NVIDIA H200", True)
    offer = DataOffer(40123, bytes(range(0xA0, 0xB0)), bytes(range(32)))
    events = [
        ("lease granted", grant),
        ("lease granted, no data connections", LeaseGranted(ProtoVersion(7, 1, 2), 0, "CPU", False)),
        ("data offer", offer),
        ("no data offer", NoDataOffer()),
        ("path data", PathChoice("data")),
        ("path link", PathChoice("link")),
    ]
    valid = [{"name": n, "event": event_json(ev), "hex": encode_control(ev).hex()} for n, ev in events]

    def frame_of_raw(body: bytes) -> str:
        return (len(body).to_bytes(4, "big") + body).hex()

    def frame_of(msg: dict[str, Any]) -> str:
        return frame_of_raw(cbor.encode(msg))

    invalid_msgs = [
        ("unknown op", frame_of({"op": "lease_revoked"}), "unexpected"),
        (
            "grant without proto",
            frame_of({"op": "lease_granted", "free_bytes": 1, "device": "x", "data": True}),
            "bad_message",
        ),
        (
            "grant with a bad proto",
            frame_of({"data": True, "device": "x", "free_bytes": 1, "op": "lease_granted", "proto": "seven"}),
            "bad_message",
        ),
        (
            "grant with negative memory",
            frame_of({"data": True, "device": "x", "free_bytes": -1, "op": "lease_granted", "proto": "7.0.0"}),
            "bad_message",
        ),
        (
            "grant with data as an integer",
            frame_of({"data": 1, "device": "x", "free_bytes": 1, "op": "lease_granted", "proto": "7.0.0"}),
            "bad_message",
        ),
        (
            "offer with a short ticket",
            frame_of({"op": "data_offer", "port": 1, "ticket": b"ab", "secret": bytes(32)}),
            "bad_message",
        ),
        (
            "offer with port 0",
            frame_of({"op": "data_offer", "port": 0, "ticket": bytes(16), "secret": bytes(32)}),
            "bad_message",
        ),
        (
            "offer with a hex ticket (the old JSON line)",
            frame_of({"op": "data_offer", "port": 1, "ticket": "a0" * 16, "secret": bytes(32)}),
            "bad_message",
        ),
        ("path neither data nor link", frame_of({"op": "path", "via": "carrier pigeon"}), "bad_message"),
        ("old JSON lease line", b'{"proto": "7.0.0"}\n'.hex(), "too_large"),
        ("nested value", frame_of({"op": "path", "via": ["link"]}), "too_deep"),
        (
            "tag in a control frame",
            frame_of_raw(cbor2.dumps({"op": "path", "via": cbor2.CBORTag(35, "link")}, canonical=True)),
            "tag",
        ),
        ("frame above the control limit", (MAX_CONTROL_FRAME_BYTES + 1).to_bytes(4, "big").hex(), "too_large"),
    ]
    invalid = []
    for name, hexdata, expected in invalid_msgs:

        def run(data: bytes = bytes.fromhex(hexdata)) -> None:
            d = ControlDecoder()
            d.receive_data(data)
            d.next_event()

        got = _codec_error(run)
        assert got == expected, (name, got, expected)
        invalid.append({"name": name, "hex": hexdata, "error": got})

    raw = bytes([14]) + (24).to_bytes(8, "little") + bytes(24)  # the runner's ggml RPC HELLO
    stories = [
        {
            "name": "lease stream",
            "steps": [
                {
                    "from": "worker_node",
                    "hex": encode_control(grant).hex(),
                    "expect": ["LeaseGranted"],
                    "event": event_json(grant),
                    "rest": "",
                }
            ],
        },
        {
            "name": "connect over a data connection",
            "steps": [
                {
                    "from": "worker_node",
                    "hex": encode_control(offer).hex(),
                    "expect": ["DataOffer", "NoDataOffer"],
                    "event": event_json(offer),
                    "rest": "",
                },
                {
                    "from": "coordinator",
                    "hex": encode_control(PathChoice("data")).hex(),
                    "expect": ["PathChoice"],
                    "event": event_json(PathChoice("data")),
                    "rest": "",
                },
            ],
        },
        {
            "name": "connect over the link stream, RPC bytes in the same chunk",
            "steps": [
                {
                    "from": "worker_node",
                    "hex": encode_control(NoDataOffer()).hex(),
                    "expect": ["DataOffer", "NoDataOffer"],
                    "event": event_json(NoDataOffer()),
                    "rest": "",
                },
                {
                    "from": "coordinator",
                    "hex": (encode_control(PathChoice("link")) + raw).hex(),
                    "expect": ["PathChoice"],
                    "event": event_json(PathChoice("link")),
                    "rest": raw.hex(),
                },
            ],
        },
        {
            "name": "a path choice where an offer is due",
            "steps": [
                {
                    "from": "worker_node",
                    "hex": encode_control(PathChoice("link")).hex(),
                    "expect": ["DataOffer", "NoDataOffer"],
                    "error": "unexpected",
                }
            ],
        },
    ]
    for story in stories:  # each step must hold against the code
        for step in story["steps"]:
            d = ControlDecoder()
            d.receive_data(bytes.fromhex(step["hex"]))
            kinds = {
                "LeaseGranted": LeaseGranted,
                "DataOffer": DataOffer,
                "NoDataOffer": NoDataOffer,
                "PathChoice": PathChoice,
            }
            expected = tuple(kinds[k] for k in step["expect"])
            if "error" in step:
                assert _codec_error(lambda d=d, e=expected: d.next_event(*e)) == step["error"]
            else:
                assert event_json(d.next_event(*expected)) == step["event"]
                assert d.take_unconsumed().hex() == step["rest"]
    return {
        "description": "RPC tunnel control messages (protocol/README.md section 11.6): length-prefixed "
        "canonical CBOR maps on tunnel/rpc streams; 'expect' lists the events the receiver "
        "accepts at that step, 'rest' the bytes that follow the message",
        "limit": MAX_CONTROL_FRAME_BYTES,
        "valid": valid,
        "invalid": invalid,
        "stories": stories,
    }


def manifest_vectors() -> dict[str, Any]:
    """Signed artifact manifests (protocol/placement.md): wire form, signed body, signing input, JSON form."""
    from hydra_node.mesh.wire.envelope import signing_input
    from hydra_node.runtime.artifacts.errors import ArtifactError
    from hydra_node.runtime.artifacts.manifest import (
        MANIFEST_CONTEXT,
        ArtifactFile,
        Manifest,
    )

    key = SigningKey(SEED_A)
    empty_sha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    weights = Manifest(
        "model_weights",
        "smollm2-135m",
        (ArtifactFile("model.gguf", 1234567, "5e" * 32), ArtifactFile("tokenizer/vocab.json", 0, empty_sha256)),
        {},
        "posix:/vast/global/hydra",
        NOW,
    ).sign(key)
    kv_identity = {
        "model_sha256": "cd" * 32,
        "n_ctx": 4096,
        "rope_freq_base": 10000.0,
        "tokens": bytes([1, 0, 0, 0, 2, 0, 0, 0]),
    }
    kv = Manifest(
        "kv_state", "prefix-7f3a", (ArtifactFile("seq0.state", 4096, "ab" * 32),), kv_identity, "s3://bucket/hydra", NOW
    ).sign(key)
    valid = [
        {
            "name": name,
            "hex": m.to_cbor().hex(),
            "decoded": to_json(m.to_wire()),
            "body_hex": m.body_bytes().hex(),
            "signing_input_hex": signing_input(MANIFEST_CONTEXT, m.body_bytes()).hex(),
            "manifest_id": m.manifest_id,
            "size": m.size,
            "json": m.to_json(),
        }
        for name, m in (("model weights, two files", weights), ("kv state", kv))
    ]

    def code(wire: dict[str, Any]) -> str:
        try:
            Manifest.from_cbor(cbor.encode(wire)).verify()
        except ArtifactError as exc:
            return exc.code
        raise AssertionError("an invalid manifest vector was accepted")

    base = weights.to_wire()
    cases = [
        ("identity changed after signing", {**base, "identity": {"q": 1}}),
        ("location changed after signing", {**base, "location": "posix:/elsewhere"}),
        ("signed by another node", {**base, "node": node_id_from_public_key(bytes(SigningKey(SEED_B).verify_key))}),
        ("schema version 2", {**base, "v": 2}),
        ("unknown key", {**base, "ttl": 60}),
        ("no signature", {k: v for k, v in base.items() if k != "sig"}),
        ("files out of order", {**base, "files": list(reversed(base["files"]))}),
        ("a path with ..", {**base, "files": [{**base["files"][0], "path": "../model.gguf"}]}),
        ("unknown kind", {**base, "kind": "weights"}),
        ("upper-case sha256", {**base, "files": [{**base["files"][0], "sha256": "5E" * 32}]}),
    ]
    invalid = [{"name": name, "hex": cbor.encode(wire).hex(), "error": code(wire)} for name, wire in cases]
    non_canonical = bytes.fromhex(valid[0]["hex"])
    invalid.append(
        {
            "name": "non-canonical: a size with a non-shortest head",
            "hex": _non_shortest(non_canonical).hex(),
            "error": "manifest_invalid",
        }
    )
    return {
        "description": "Signed artifact manifests (protocol/placement.md): 'hex' is the wire form (canonical "
        "CBOR), 'body_hex' the signed body, 'signing_input_hex' the exact bytes the Ed25519 key of "
        "'node' signed, 'json' the JSON form; invalid manifests with the error code a reader gives; "
        "'fetch_headers': artifact_fetch OPEN headers (placement.md section 4) a holder accepts "
        "(with the request they decode to) or answers with bad_request",
        "context": MANIFEST_CONTEXT,
        "signer_seed": SEED_A.hex(),
        "valid": valid,
        "invalid": invalid,
        "fetch_headers": fetch_header_vectors(),
    }


def fetch_header_vectors() -> dict[str, Any]:
    """``artifact_fetch`` OPEN headers: accepted (and the offset they resume at) or refused."""
    from hydra_node.runtime.artifacts.peer_wire import ArtifactRequest, WireError

    model = "sha256:" + "5e" * 32
    base = {"kind": "artifact_fetch", "artifact": "model_weights", "name": model}
    valid = [
        ("whole artifact (no offset)", base),
        ("resume a single file at byte 1048576", {**base, "offset": 1048576}),
        ("a placement artifact", {"kind": "artifact_fetch", "artifact": "layer_package", "name": "stage-0"}),
        ("the largest offset (1 TiB)", {**base, "offset": 1 << 40}),
    ]
    invalid = [
        ("negative offset", {**base, "offset": -1}),
        ("offset 0 is sent as no offset", {**base, "offset": 0}),
        ("offset past 1 TiB", {**base, "offset": (1 << 40) + 1}),
        ("offset as text", {**base, "offset": "10"}),
        ("offset as a bool", {**base, "offset": True}),
        ("an unknown key", {**base, "path": "/etc/passwd"}),
        ("a name with a slash", {**base, "name": "../w"}),
    ]
    for _, header in invalid:
        try:
            ArtifactRequest.from_header(header)
        except WireError:
            continue
        raise AssertionError(f"an invalid header vector was accepted: {header}")
    return {
        "valid": [
            {
                "name": name,
                "header": h,
                "hex": cbor.encode(h).hex(),
                "offset": ArtifactRequest.from_header(h).offset,
            }
            for name, h in valid
        ],
        "invalid": [
            {"name": name, "header": h, "hex": cbor.encode(h).hex(), "error": "bad_request"} for name, h in invalid
        ],
    }


def _non_shortest(data: bytes) -> bytes:
    """``data`` with ``created_at`` (a 4-byte integer head) re-encoded with an 8-byte head."""
    head = cbor.encode(NOW)
    at = data.index(head)
    return data[:at] + bytes([0x1B]) + NOW.to_bytes(8, "big") + data[at + len(head) :]


def build_all() -> dict[str, Any]:
    return {
        "cbor.json": cbor_vectors(),
        "envelope.json": envelope_vectors(),
        "token.json": token_vectors(),
        "frames.json": frame_vectors(),
        "channel.json": channel_vectors(),
        "handshake.json": handshake_vectors(),
        "announce.json": announcement_vectors(),
        "generate.json": generate_stream_vectors(),
        "tunnel_data.json": tunnel_data_vectors(),
        "framing.json": framing_vectors(),
        "lease.json": lease_vectors(),
        "invites.json": invite_vectors(),
        "manifests.json": manifest_vectors(),
        "relay.json": relay_vectors(to_json),
        "membership.json": membership_vectors(to_json),
        "caps.json": caps_vectors(to_json),
    }


def render(doc: Any) -> str:
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def main() -> int:
    check = "--check" in sys.argv
    stale = []
    VECTORS.mkdir(parents=True, exist_ok=True)
    for name, doc in build_all().items():
        path = VECTORS / name
        text = render(doc)
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print("stale vectors:", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
