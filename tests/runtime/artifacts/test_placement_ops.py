"""Placement operations (runtime/artifacts/operations.py): the state table, retry hints, files, restarts."""

from __future__ import annotations

import json

import pytest

from hydra_node.runtime.artifacts.operations import (
    MAX_OPERATIONS,
    TRANSITIONS,
    BadTransition,
    Operation,
    OpStore,
    interrupted,
    prune_plan,
)

MANIFEST = {"manifest_id": "ab" * 32, "name": "n"}


def op(state: str = "queued", action: str = "publish", i: int = 1, **kw) -> Operation:
    return Operation(
        id=f"op-{i:08x}-0000000{i % 10}",
        action=action,
        kind="layer_package",
        name="stage-0",
        state=state,
        created_at=float(i),
        updated_at=float(i),
        source="/src",
        namespace={"type": "posix", "root": "/ns", "location": "posix:/ns"},
        **kw,
    )


def test_a_publish_walks_the_table_to_triggered():
    o = op(vast={"endpoint": "http://v"})
    for state in ("staging", "committed", "triggered"):
        o = o.move(state, 10.0)
    assert o.state == "triggered" and o.terminal and [h[0] for h in o.history] == ["staging", "committed", "triggered"]


@pytest.mark.parametrize(("start", "to"), [(s, t) for s in TRANSITIONS for t in TRANSITIONS if t not in TRANSITIONS[s]])
def test_every_move_outside_the_table_is_refused_naming_the_state(start, to):
    with pytest.raises(BadTransition, match=repr(start)):
        op(start).move(to, 1.0)


def test_committed_rests_only_when_no_trigger_is_due():
    assert op("committed").terminal  # no VAST trigger
    due = op("committed", vast={"endpoint": "http://v"})
    assert not due.terminal and due.trigger_due
    assert not op("committed", vast={"endpoint": "http://v"}, trigger={"delivered": True}).trigger_due


def test_a_failed_trigger_keeps_the_manifest_and_says_how_to_retry():
    o = op("committed", vast={"endpoint": "http://v"}, manifest=MANIFEST).fail("trigger_failed", "503", 5.0)
    assert o.state == "failed" and o.manifest == MANIFEST and o.error == {"code": "trigger_failed", "message": "503"}
    assert "committed at posix:/ns" in o.retry_hint and f"hydra placement retry {o.id}" in o.retry_hint
    assert o.move("committed", 6.0).error is None  # the retry re-sends from the commit


def test_a_failure_before_the_commit_is_retried_from_queued_only():
    o = op("staging").fail("source_invalid", "no such file", 2.0)
    assert "publishes again" in o.retry_hint
    with pytest.raises(BadTransition):
        o.move("committed", 3.0)
    assert o.move("queued", 3.0).state == "queued"


def test_interrupted_operations_fail_at_start_and_finished_ones_stay():
    assert interrupted(op("queued"), 9.0).error["code"] == "interrupted"
    assert interrupted(op("staging", action="fetch"), 9.0).state == "failed"
    due = interrupted(op("committed", vast={"endpoint": "http://v"}, manifest=MANIFEST), 9.0)
    assert due.state == "failed" and due.manifest == MANIFEST and "re-sends the VAST trigger" in due.retry_hint
    for rest in (op("committed"), op("triggered"), op("failed")):
        assert interrupted(rest, 9.0) is None


def test_the_store_writes_one_file_per_operation_and_recovers_them(tmp_path):
    store = OpStore(tmp_path / "ops")
    running, done = op("staging", i=1), op("committed", i=2, manifest=MANIFEST)
    store.save(running)
    store.save(done)
    (tmp_path / "ops" / "op-zzzz-broken.json").write_text("{")  # not ours: reported, left alone
    ops, notes = store.recover(now=50.0)
    assert [o.id for o in ops] == [running.id, done.id]
    assert ops[0].state == "failed" and ops[0].error["code"] == "interrupted" and ops[1] == done
    assert any("broken" in n for n in notes) and any(running.id in n for n in notes)
    on_disk = json.loads((tmp_path / "ops" / f"{running.id}.json").read_text())
    assert Operation.from_json(on_disk) == ops[0]
    assert not list((tmp_path / "ops").glob(".*.tmp"))


def test_the_oldest_finished_operations_are_pruned_past_the_bound():
    ops = [op("failed", i=i) for i in range(MAX_OPERATIONS + 3)] + [op("staging", i=9999)]
    assert prune_plan(ops) == [o.id for o in ops[:4]]
    assert prune_plan(ops[:10]) == []


@pytest.mark.parametrize(
    "bad",
    [
        [],
        {"id": "x"},
        dict(op().to_json(), id="../../etc"),
        dict(op().to_json(), state="done"),
        dict(op().to_json(), action="copy"),
    ],
)
def test_a_malformed_operation_file_is_refused(bad):
    with pytest.raises(ValueError):
        Operation.from_json(bad)
