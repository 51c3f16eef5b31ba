"""Join planning (pure): which invite admits us, which nodes are dialled, what conflicts."""

from __future__ import annotations

import time

import pytest
from nacl.signing import SigningKey

from hydra_node.mesh.wire.errors import TokenError
from hydra_node.mesh.wire.ids import MeshSecret, node_id_from_public_key
from hydra_node.mesh.joining import DialCandidate, JoinPlan, plan_join
from hydra_node.mesh.wire.token import issue_invite, parse_invite

NOW = time.time()
MESH_A = MeshSecret(bytes([1]) * 32).mesh_id
MESH_B = MeshSecret(bytes([2]) * 32).mesh_id


def invite(mesh_id: str, addr: str = "127.0.0.1:9338", key: SigningKey | None = None):
    key = key or SigningKey.generate()
    return parse_invite(issue_invite(key, mesh_id, [addr], 3600, NOW), NOW)


def test_empty_plan_resumes_the_held_mesh_or_creates_one():
    resume = plan_join(JoinPlan(), current_mesh_id=None, held_mesh_id=MESH_A)
    assert (resume.admit_with, resume.mesh_id, resume.dials, resume.must_reach) == (None, MESH_A, (), False)
    create = plan_join(JoinPlan(), current_mesh_id=None, held_mesh_id=None)
    assert create.mesh_id is None and create.admit_with is None and not create.must_reach


def test_an_invite_for_another_mesh_admits_us_and_its_issuer_is_dialled():
    tok = invite(MESH_B)
    steps = plan_join(JoinPlan(invites=(tok,)), current_mesh_id=None, held_mesh_id=MESH_A)
    assert steps.admit_with is tok and steps.mesh_id == MESH_B and steps.must_reach
    assert steps.dials == (DialCandidate(tok.urls, tok.issuer_id),)


def test_an_invite_for_the_held_mesh_needs_no_admission():
    tok = invite(MESH_A)
    steps = plan_join(JoinPlan(invites=(tok,)), current_mesh_id=None, held_mesh_id=MESH_A)
    assert steps.admit_with is None and steps.mesh_id == MESH_A
    assert steps.dials == (DialCandidate(tok.urls, tok.issuer_id),) and steps.must_reach


def test_only_the_first_invite_decides_the_mesh_and_foreign_ones_are_not_dialled():
    first, foreign, same = invite(MESH_B), invite(MESH_A), invite(MESH_B, "10.0.0.2:9338")
    steps = plan_join(JoinPlan(invites=(first, foreign, same)), current_mesh_id=None, held_mesh_id=None)
    assert steps.mesh_id == MESH_B
    assert [d.peer_id for d in steps.dials] == [first.issuer_id, same.issuer_id]


def test_duplicate_issuers_and_members_are_dialled_once():
    key = SigningKey.generate()
    a, b = invite(MESH_A, key=key), invite(MESH_A, "10.0.0.9:1", key=key)
    member = DialCandidate(("ws://10.0.0.3:9338",), node_id_from_public_key(bytes(key.verify_key)))
    anonymous = DialCandidate(("ws://10.0.0.4:9338",))
    steps = plan_join(
        JoinPlan(invites=(a, b), members=(member, anonymous, anonymous)), current_mesh_id=MESH_A, held_mesh_id=MESH_A
    )
    assert steps.dials == (DialCandidate(a.urls, a.issuer_id), anonymous, anonymous)


def test_members_only_plan_must_not_reach_anyone():
    cand = DialCandidate(("ws://10.0.0.3:9338",), "ab" * 32)
    steps = plan_join(JoinPlan(members=(cand,)), current_mesh_id=None, held_mesh_id=MESH_A)
    assert steps.dials == (cand,) and not steps.must_reach and steps.admit_with is None


def test_an_invite_for_another_mesh_while_in_one_is_a_conflict():
    steps = plan_join(JoinPlan(invites=(invite(MESH_B),)), current_mesh_id=MESH_A, held_mesh_id=MESH_A)
    assert steps.conflict is not None and MESH_A in steps.conflict and MESH_B in steps.conflict
    assert steps.dials == () and steps.admit_with is None


def test_in_a_mesh_an_invite_of_it_is_just_a_dial():
    tok = invite(MESH_A)
    steps = plan_join(JoinPlan(invites=(tok,)), current_mesh_id=MESH_A, held_mesh_id=MESH_A)
    assert steps.conflict is None and steps.admit_with is None and steps.dials[0].peer_id == tok.issuer_id


def test_from_tokens_parses_and_refuses_bad_tokens():
    tok = invite(MESH_A)
    plan = JoinPlan.from_tokens([tok.text], NOW, admission_timeout_s=2.0)
    assert plan.invites == (tok,) and plan.admission_timeout_s == 2.0
    with pytest.raises(TokenError):
        JoinPlan.from_tokens(["not a token"], NOW)
    with pytest.raises(TokenError):  # expired
        JoinPlan.from_tokens([tok.text], NOW + 7200)


def test_a_dial_candidate_needs_an_address():
    with pytest.raises(ValueError):
        DialCandidate(())
