"""Invite tokens: issue/parse, and one typed error per way a token can be bad."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.signing import SigningKey

from hydra_node.mesh.wire import cbor
from hydra_node.mesh.wire.errors import (
    LocalProtocolError,
    TokenError,
    TokenExpired,
    TokenForeignMesh,
    TokenForged,
    TokenMalformed,
)
from hydra_node.mesh.wire.ids import MeshSecret, node_id_from_public_key
from hydra_node.mesh.wire.token import InviteToken, issue_invite, parse_invite

NOW = 1_800_000_000
KEY = SigningKey(bytes([9]) * 32)
MESH = MeshSecret(bytes([5]) * 32)


def test_issue_and_parse() -> None:
    text = issue_invite(KEY, MESH.mesh_id, ["ws://10.0.0.1:7300", "[::1]:7300"], 3600, NOW)
    assert "=" not in text and "+" not in text and "/" not in text
    token = parse_invite(text, NOW + 1, expected_mesh_id=MESH.mesh_id)
    assert token.mesh_id == MESH.mesh_id
    assert token.issuer_id == node_id_from_public_key(bytes(KEY.verify_key))
    assert token.addrs == ("ws://10.0.0.1:7300", "[::1]:7300")
    assert token.urls == ("ws://10.0.0.1:7300", "ws://[::1]:7300")
    assert token.expires_at == NOW + 3600 and token.text == text
    assert parse_invite(f"  {text}\n", NOW).text == text  # pasted with whitespace


def test_tokens_are_unique() -> None:
    assert issue_invite(KEY, MESH.mesh_id, ["h:1"], 60, NOW) != issue_invite(KEY, MESH.mesh_id, ["h:1"], 60, NOW)


def test_expired() -> None:
    text = issue_invite(KEY, MESH.mesh_id, ["h:1"], 60, NOW)
    with pytest.raises(TokenExpired, match="expired at 2027"):
        parse_invite(text, NOW + 60)


def test_foreign_mesh() -> None:
    text = issue_invite(KEY, MESH.mesh_id, ["h:1"], 60, NOW)
    other = MeshSecret(bytes([6]) * 32).mesh_id
    with pytest.raises(TokenForeignMesh, match=other):
        parse_invite(text, NOW, expected_mesh_id=other)


def _resign_body(text: str, change: dict) -> str:
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    outer = cbor.decode(raw)
    body = {**cbor.decode(outer["body"]), **change}
    return base64.urlsafe_b64encode(cbor.encode({**outer, "body": cbor.encode(body)})).rstrip(b"=").decode()


def test_forged() -> None:
    text = issue_invite(KEY, MESH.mesh_id, ["h:1"], 60, NOW)
    with pytest.raises(TokenForged, match="signature"):
        parse_invite(_resign_body(text, {"exp": NOW + 10**6}), NOW)
    with pytest.raises(TokenForged):
        parse_invite(_resign_body(text, {"addrs": ["evil:1"]}), NOW)


@pytest.mark.parametrize(
    "text", ["", "!!!", "abc=", "A", "a" * 5000, base64.urlsafe_b64encode(b"\xa0").decode().rstrip("=")]
)
def test_malformed(text: str) -> None:
    with pytest.raises(TokenMalformed):
        parse_invite(text, NOW)


def test_malformed_body_signed_correctly() -> None:
    from hydra_node.mesh.wire.envelope import seal

    raw = seal(KEY, "invite", {"mesh": MESH.mesh_id, "exp": NOW + 5})
    text = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    with pytest.raises(TokenMalformed, match="exactly"):
        parse_invite(text, NOW)


@settings(max_examples=300)
@given(st.text(max_size=120) | st.binary(max_size=120).map(lambda b: base64.urlsafe_b64encode(b).decode().rstrip("=")))
def test_garbage_only_raises_token_errors(text: str) -> None:
    with pytest.raises(TokenError):
        parse_invite(text, NOW)


def test_issue_refuses_bad_arguments() -> None:
    with pytest.raises(LocalProtocolError):
        issue_invite(KEY, "not-a-mesh-id", ["h:1"], 60, NOW)
    with pytest.raises(LocalProtocolError):
        issue_invite(KEY, MESH.mesh_id, [], 60, NOW)
    with pytest.raises(LocalProtocolError):
        issue_invite(KEY, MESH.mesh_id, ["no port or scheme"], 60, NOW)
    with pytest.raises(LocalProtocolError):
        issue_invite(KEY, MESH.mesh_id, ["h:1"], 0, NOW)


def test_invite_token_validates_on_construction() -> None:
    with pytest.raises(TokenMalformed):
        InviteToken(
            mesh_id=MESH.mesh_id, issuer_public_key=b"short", addrs=("h:1",), expires_at=1, nonce=bytes(16), text="x"
        )
