"""LAN admission: fingerprints reveal nothing without the secret; proofs are bound to challenge and time."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from hydra_node.discovery.lan_admission import (
    CHALLENGE_BUCKET_S,
    AdmissionError,
    MeshSecret,
    fingerprint_matches,
    make_challenge,
    make_proof,
    may_join,
    mesh_secret_from_invite,
    token_fingerprint,
    verify_proof,
)

NONCE = bytes(range(16))


def parse_invite(token: str) -> tuple[str, bytes]:
    """Stand-in for the lead's invite parser: 'mesh_id.secret_hex'."""
    mesh_id, secret_hex = token.split(".")
    return mesh_id, bytes.fromhex(secret_hex)


def test_fingerprint_is_stable_keyed_and_short():
    fp = token_fingerprint(b"secret", "mesh-1")
    assert fp == token_fingerprint(b"secret", "mesh-1") and len(fp) == 32
    assert fp != token_fingerprint(b"other", "mesh-1")
    assert fp != token_fingerprint(b"secret", "mesh-2")
    assert fingerprint_matches(b"secret", "mesh-1", fp.upper())
    assert not fingerprint_matches(b"other", "mesh-1", fp)
    assert token_fingerprint(b"x" * 4096, "m")  # long secrets are fine


@given(st.binary(min_size=1, max_size=200), st.text(min_size=1, max_size=40))
def test_fingerprint_never_contains_the_secret(secret, mesh_id):
    fp = token_fingerprint(secret, mesh_id)
    assert len(fp) == 32 and (len(secret) < 4 or secret.hex() not in fp)


def test_may_join_only_own_mesh():
    mine = mesh_secret_from_invite("mesh-1." + b"k".hex(), parse_invite)
    assert may_join("mesh-1", token_fingerprint(b"k", "mesh-1"), mine)
    assert not may_join("mesh-2", token_fingerprint(b"k", "mesh-2"), mine)
    assert not may_join("mesh-1", token_fingerprint(b"stranger", "mesh-1"), mine)
    assert "secret=<1 bytes>" in repr(mine)


def test_unreadable_invite_is_a_typed_error():
    with pytest.raises(AdmissionError):
        mesh_secret_from_invite("garbage", parse_invite)
    with pytest.raises(AdmissionError):
        MeshSecret("m", b"")


def test_challenge_proof_round_trip_and_freshness():
    now = 1_800_000_000.0
    ch = make_challenge(NONCE, now)
    proof = make_proof(b"k", "m", ch)
    assert verify_proof(b"k", "m", ch, proof, now)
    assert verify_proof(b"k", "m", ch, proof, now + CHALLENGE_BUCKET_S)  # neighbour bucket (skew)
    assert not verify_proof(b"k", "m", ch, proof, now + 3 * CHALLENGE_BUCKET_S)  # stale
    assert not verify_proof(b"wrong", "m", ch, proof, now)
    assert not verify_proof(b"k", "other", ch, proof, now)
    other = make_challenge(bytes(16), now)
    assert not verify_proof(b"k", "m", other, proof, now)  # proof bound to its challenge
    assert not verify_proof(b"k", "m", "v1:junk", proof, now)
    with pytest.raises(AdmissionError):
        make_proof(b"k", "m", "not a challenge")
    with pytest.raises(AdmissionError):
        make_challenge(b"short", now)


@given(st.text(max_size=100), st.text(max_size=100))
def test_verify_proof_never_raises_on_untrusted_input(challenge, proof):
    assert verify_proof(b"k", "m", challenge, proof, 1_800_000_000.0) in (True, False)
