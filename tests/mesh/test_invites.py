"""Invite tokens with ``uses``, revocation lists (codec, signature, merge) and the issuer's book: pure, clock injected."""

from __future__ import annotations

import json
import stat

import pytest
from hypothesis import given, settings, strategies as st
from nacl.signing import SigningKey

from hydra_node.mesh.invites import MAX_INVITE_RECORDS, InviteBook, InviteBookError, RevocationTable, check_invite
from hydra_node.mesh.wire.errors import LocalProtocolError, TokenMalformed
from hydra_node.mesh.wire.ids import MeshSecret, node_id_from_public_key
from hydra_node.mesh.wire.revocations import (
    MAX_REVOCATION_ENTRIES,
    MAX_REVOCATION_LIST_BYTES,
    Revocation,
    RevocationRejected,
    open_revocations,
    seal_revocations,
)
from hydra_node.mesh.wire.token import (
    MAX_INVITE_USES,
    TokenIssuerOnly,
    TokenRevoked,
    TokenUnknown,
    TokenUsedUp,
    issue_invite,
    parse_invite,
)

NOW = 1_790_000_000
MESH = MeshSecret(bytes([7]) * 32).mesh_id
ADDRS = ["127.0.0.1:7300"]


def _id(key: SigningKey) -> str:
    return node_id_from_public_key(bytes(key.verify_key))


# ---- tokens -----------------------------------------------------------------------------------
def test_a_token_carries_its_uses_and_an_id_and_old_tokens_have_none():
    key = SigningKey.generate()
    limited = parse_invite(issue_invite(key, MESH, ADDRS, 600, NOW, uses=3), NOW)
    plain = parse_invite(issue_invite(key, MESH, ADDRS, 600, NOW), NOW)
    assert limited.uses == 3 and plain.uses is None
    assert len(limited.token_id) == 32 and limited.token_id == limited.nonce.hex() != plain.token_id


@pytest.mark.parametrize("uses", [0, -1, MAX_INVITE_USES + 1, True, 1.0, "1"])
def test_issue_refuses_a_bad_uses(uses):
    with pytest.raises(LocalProtocolError):
        issue_invite(SigningKey.generate(), MESH, ADDRS, 600, NOW, uses=uses)


# ---- lists: codec and signature -----------------------------------------------------------------
def _entries(n: int, reason: str = "revoked") -> list[Revocation]:
    return [Revocation(i.to_bytes(16, "big"), NOW + 600, reason) for i in range(n)]


def test_a_list_round_trips_sorted_and_only_for_its_mesh():
    key = SigningKey.generate()
    raw = seal_revocations(key, MESH, 5, list(reversed(_entries(3))))
    lst = open_revocations(raw, expected_mesh_id=MESH)
    assert lst.issuer_id == _id(key) and lst.version == 5 and lst.entries == tuple(_entries(3))
    assert lst.reason_for(_entries(3)[1].token_id, NOW) == "revoked"
    assert lst.reason_for(_entries(3)[1].token_id, NOW + 600) is None  # the token expired: moot
    with pytest.raises(RevocationRejected) as info:
        open_revocations(raw, expected_mesh_id=MeshSecret(bytes([8]) * 32).mesh_id)
    assert info.value.code == "foreign_mesh"


def test_a_full_list_fits_its_byte_bound_and_one_more_entry_is_refused():
    raw = seal_revocations(SigningKey.generate(), MESH, 2**63 - 1, _entries(MAX_REVOCATION_ENTRIES))
    assert len(raw) <= MAX_REVOCATION_LIST_BYTES
    with pytest.raises(LocalProtocolError):
        seal_revocations(SigningKey.generate(), MESH, 1, _entries(MAX_REVOCATION_ENTRIES + 1))
    with pytest.raises(LocalProtocolError):
        seal_revocations(SigningKey.generate(), MESH, 0, [])


@given(st.binary(max_size=600))
@settings(max_examples=300, deadline=None)
def test_untrusted_bytes_give_a_list_or_a_typed_rejection(data):
    try:
        open_revocations(data, expected_mesh_id=MESH)
    except RevocationRejected as exc:
        assert exc.code in ("malformed", "forged", "foreign_mesh")


def test_flipping_any_byte_of_a_list_never_verifies_as_another_list():
    raw = seal_revocations(SigningKey.generate(), MESH, 3, _entries(2))
    for i in range(len(raw)):
        bad = raw[:i] + bytes([raw[i] ^ 0x01]) + raw[i + 1 :]
        with pytest.raises(RevocationRejected):
            open_revocations(bad, expected_mesh_id=MESH)


# ---- lists: merging ------------------------------------------------------------------------------
def test_the_table_keeps_the_newest_list_and_refuses_replays_equivocation_and_strangers():
    issuer, stranger = SigningKey.generate(), SigningKey.generate()
    member = {_id(issuer)}.__contains__
    table = RevocationTable(MESH)
    v1, v2 = seal_revocations(issuer, MESH, 1, _entries(1)), seal_revocations(issuer, MESH, 2, _entries(2))
    assert table.offer(v1, is_member=member) is not None and table.offer(v2, is_member=member) is not None
    assert table.offer(v2, is_member=member) is None  # a duplicate: nothing to relay
    for raw, code in [
        (v1, "stale"),
        (seal_revocations(issuer, MESH, 2, []), "equivocation"),
        (seal_revocations(stranger, MESH, 9, []), "not_member"),
    ]:
        with pytest.raises(RevocationRejected) as info:
            table.offer(raw, is_member=member)
        assert info.value.code == code
    assert table.reason(_id(issuer), _entries(2)[1].token_id, NOW) == "revoked"
    assert table.offer(seal_revocations(issuer, MESH, 1, []), is_member=member, own_id=_id(issuer)) is None


def test_the_table_is_bounded_and_evicts_issuers_that_left_first():
    keys = [SigningKey.generate() for _ in range(3)]
    members = {_id(k) for k in keys}
    table = RevocationTable(MESH, max_issuers=2)
    for k in keys[:2]:
        table.offer(seal_revocations(k, MESH, 1, []), is_member=members.__contains__)
    with pytest.raises(RevocationRejected) as info:
        table.offer(seal_revocations(keys[2], MESH, 1, []), is_member=members.__contains__)
    assert info.value.code == "table_full"
    members.discard(_id(keys[0]))  # it left the mesh: its list goes first
    table.offer(seal_revocations(keys[2], MESH, 1, []), is_member=members.__contains__)
    assert {lst.issuer_id for lst in table.lists()} == {_id(keys[1]), _id(keys[2])}


# ---- the issuer's book ---------------------------------------------------------------------------
def test_the_book_counts_uses_persists_0600_and_survives_a_restart(tmp_path):
    key = SigningKey.generate()
    path = tmp_path / "mesh" / "invites.json"
    book = InviteBook(path, key)
    tok = parse_invite(book.issue(MESH, ADDRS, 600, NOW, uses=1), NOW)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert book.revocation_list(MESH, NOW) is None  # nothing revoked or used up yet
    assert check_invite(tok, own_id=_id(key), book=book, table=None, now=NOW + 1) is True  # list changed
    first = open_revocations(book.revocation_list(MESH, NOW + 1), expected_mesh_id=MESH)
    restarted = InviteBook(path, key)
    with pytest.raises(TokenUsedUp):
        check_invite(tok, own_id=_id(key), book=restarted, table=None, now=NOW + 2)
    [rec] = restarted.records(NOW + 2)
    assert (rec.id, rec.used, rec.uses, rec.state(NOW + 2)) == (tok.token_id, 1, 1, "used_up")
    lst = open_revocations(restarted.revocation_list(MESH, NOW + 3), expected_mesh_id=MESH)
    assert [(e.token_id, e.reason) for e in lst.entries] == [(tok.nonce, "used")]
    assert lst.version > first.version == book.list_version >= 1  # a restart moves the version on


def test_revoking_by_id_prefix_or_whole_token_and_refusals(tmp_path):
    key = SigningKey.generate()
    book = InviteBook(tmp_path / "invites.json", key)
    a = parse_invite(book.issue(MESH, ADDRS, 600, NOW), NOW)
    b_text = book.issue(MESH, ADDRS, 600, NOW)
    assert book.revoke(a.token_id[:8].upper(), NOW).revoked
    with pytest.raises(TokenRevoked):
        check_invite(a, own_id=_id(key), book=book, table=None, now=NOW)
    assert book.revoke(b_text, NOW).state(NOW) == "revoked"
    old = issue_invite(key, MESH, ADDRS, 600, NOW)  # issued before the book existed: revocable whole
    assert book.revoke(old, NOW).revoked
    for target, code in [
        ("0123", "not_found"),
        ("ffffffffffffffff", "not_found"),
        (issue_invite(SigningKey.generate(), MESH, ADDRS, 600, NOW), "not_ours"),
        ("x" * 40, "bad_token"),
    ]:
        with pytest.raises(InviteBookError) as info:
            book.revoke(target, NOW)
        assert info.value.code == code
    ids = {e.token_id.hex() for e in open_revocations(book.revocation_list(MESH, NOW), expected_mesh_id=MESH).entries}
    assert ids == {a.token_id, parse_invite(b_text, NOW).token_id, parse_invite(old, NOW).token_id}


def test_a_limited_token_the_issuer_has_no_record_of_is_refused_an_unlimited_one_admitted(tmp_path):
    key = SigningKey.generate()
    book = InviteBook(tmp_path / "invites.json", key)
    with pytest.raises(TokenUnknown):
        check_invite(
            parse_invite(issue_invite(key, MESH, ADDRS, 600, NOW, uses=1), NOW),
            own_id=_id(key),
            book=book,
            table=None,
            now=NOW,
        )
    assert (
        check_invite(
            parse_invite(issue_invite(key, MESH, ADDRS, 600, NOW), NOW), own_id=_id(key), book=book, table=None, now=NOW
        )
        is False
    )


def test_a_member_refuses_another_issuers_limited_token_and_listed_tokens(tmp_path):
    issuer, member = SigningKey.generate(), SigningKey.generate()
    limited = parse_invite(issue_invite(issuer, MESH, ADDRS, 600, NOW, uses=5), NOW)
    plain = parse_invite(issue_invite(issuer, MESH, ADDRS, 600, NOW), NOW)
    with pytest.raises(TokenIssuerOnly):
        check_invite(limited, own_id=_id(member), book=None, table=None, now=NOW)
    table = RevocationTable(MESH)
    assert check_invite(plain, own_id=_id(member), book=None, table=table, now=NOW) is False
    table.offer(
        seal_revocations(issuer, MESH, 1, [Revocation(plain.nonce, plain.expires_at, "revoked")]),
        is_member=lambda _pid: True,
    )
    with pytest.raises(TokenRevoked):
        check_invite(plain, own_id=_id(member), book=None, table=table, now=NOW)


def test_expired_records_are_dropped_and_the_record_bound_holds(tmp_path):
    key = SigningKey.generate()
    assert MAX_INVITE_RECORDS == 1024  # the production bound; the same code path with a small one here
    book = InviteBook(tmp_path / "invites.json", key, max_records=16)
    book.issue(MESH, ADDRS, 60, NOW)
    assert len(book.records(NOW)) == 1 and book.records(NOW + 60) == []
    for _ in range(16):
        book.issue(MESH, ADDRS, 600, NOW + 61)  # the expired one is pruned, making room
    with pytest.raises(InviteBookError) as info:
        book.issue(MESH, ADDRS, 600, NOW + 61)
    assert info.value.code == "too_many"


def test_a_corrupt_records_file_is_a_clear_error(tmp_path):
    path = tmp_path / "invites.json"
    path.write_text(json.dumps({"invites": [{"id": 1}]}))
    with pytest.raises(InviteBookError) as info:
        InviteBook(path, SigningKey.generate()).records(NOW)
    assert info.value.code == "unreadable" and "remove it" in str(info.value)


def test_token_malformed_is_still_what_a_bad_uses_gets_on_parse():
    key = SigningKey.generate()
    text = issue_invite(key, MESH, ADDRS, 600, NOW, uses=1)
    with pytest.raises(TokenMalformed):
        parse_invite(text[:-4], NOW)


_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**64), 2**64 - 1), st.text(max_size=20), st.binary(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)


@given(field=st.sampled_from(["mesh", "revoked", "ver", "extra", "entry.exp", "entry.id", "entry.why"]), value=_values)
@settings(max_examples=300, deadline=None)
def test_a_member_signing_any_body_gets_a_list_or_a_typed_rejection(field, value):
    """The signature is valid (a member signed it), so the fuzz reaches every check behind it."""
    from hydra_node.mesh.wire.envelope import seal

    key = SigningKey.generate()
    body = {"mesh": MESH, "revoked": [e.to_wire() for e in _entries(2)], "ver": 3}
    if field.startswith("entry."):
        body["revoked"][0][field[6:]] = value
    else:
        body[field] = value
    table = RevocationTable(MESH)
    try:
        lst = table.offer(seal(key, "invite-revocations", body), is_member=lambda _pid: True)
    except RevocationRejected as exc:
        assert exc.code in ("malformed", "foreign_mesh")
    else:
        assert lst is not None and lst.version == body["ver"] and len(lst.entries) == len(body["revoked"])
