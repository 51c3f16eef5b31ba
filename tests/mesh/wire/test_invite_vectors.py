"""protocol/vectors/invites.json holds against the code (tests/mesh/wire/test_vectors.py checks the file is fresh)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from nacl.signing import SigningKey

from hydra_node.mesh.invites import InviteBook, RevocationTable, check_invite
from hydra_node.mesh.wire import cbor
from hydra_node.mesh.wire.errors import MeshError
from hydra_node.mesh.wire.ids import node_id_from_public_key
from hydra_node.mesh.wire.revocations import RevocationRejected, open_revocations
from hydra_node.mesh.wire.token import parse_invite
from vector_json import from_json

DOC = json.loads((Path(__file__).resolve().parents[3] / "protocol" / "vectors" / "invites.json").read_text())


def _id(seed_hex: str) -> str:
    return node_id_from_public_key(bytes(SigningKey(bytes.fromhex(seed_hex)).verify_key))


@pytest.mark.parametrize("case", DOC["tokens"], ids=lambda c: c["name"])
def test_tokens_with_uses(case):
    if "error" in case:
        with pytest.raises(MeshError) as info:
            parse_invite(case["token"], case["now"])
        assert info.value.code == case["error"]
    else:
        tok = parse_invite(case["token"], case["now"])
        assert case["parsed"] == {"id": tok.token_id, "uses": tok.uses, "expires_at": tok.expires_at}


def test_the_valid_list_decodes_to_its_body():
    raw = bytes.fromhex(DOC["list"]["hex"])
    lst = open_revocations(raw, expected_mesh_id=DOC["mesh_id"])
    assert lst.issuer_id == DOC["list"]["issuer_id"] == _id(DOC["issuer_seed"])
    body = from_json(DOC["list"]["body"])
    assert cbor.decode(cbor.decode(raw)["body"]) == body and lst.version == body["ver"]
    assert [e.to_wire() for e in lst.entries] == body["revoked"]


@pytest.mark.parametrize("case", DOC["lists_invalid"], ids=lambda c: c["name"])
def test_invalid_lists_are_rejected_with_their_code(case):
    with pytest.raises(RevocationRejected) as info:
        open_revocations(bytes.fromhex(case["hex"]), expected_mesh_id=DOC["mesh_id"])
    assert info.value.code == case["error"]


def test_table_story():
    members = {_id(DOC["issuer_seed"]), _id(DOC["member_seed"])}
    table = RevocationTable(DOC["mesh_id"])
    for step in DOC["table_story"]:
        try:
            outcome = (
                "accepted" if table.offer(bytes.fromhex(step["hex"]), is_member=members.__contains__) else "duplicate"
            )
        except RevocationRejected as exc:
            outcome = exc.code
        assert outcome == step["outcome"], step["name"]


@pytest.mark.parametrize("case", DOC["at_member"], ids=lambda c: c["name"])
def test_admission_at_a_member_that_did_not_issue(case):
    table = RevocationTable(DOC["mesh_id"])
    table.offer(bytes.fromhex(DOC["list"]["hex"]), is_member=lambda _pid: True)
    tok = parse_invite(case["token"], case["now"])
    try:
        check_invite(tok, own_id=_id(DOC["member_seed"]), book=None, table=table, now=case["now"])
        result = "admitted"
    except MeshError as exc:
        result = exc.code
    assert result == case["result"]


def test_issuer_story(tmp_path):
    story = DOC["issuer_story"]
    book = InviteBook(tmp_path / "invites.json", SigningKey(bytes.fromhex(DOC["issuer_seed"])))
    tok = parse_invite(story["token"], story["steps"][0]["now"])
    book.record(tok, story["steps"][0]["now"])
    for step in story["steps"]:
        try:
            check_invite(tok, own_id=tok.issuer_id, book=book, table=None, now=step["now"])
            result = "admitted"
        except MeshError as exc:
            result = exc.code
        assert result == step["result"]
    after = open_revocations(
        book.revocation_list(DOC["mesh_id"], story["steps"][-1]["now"]), expected_mesh_id=DOC["mesh_id"]
    )
    assert [e.to_wire() for e in after.entries] == from_json(story["list_after"])
