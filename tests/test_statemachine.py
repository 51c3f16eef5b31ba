"""The one state-table helper (hydra_node/statemachine.py): lookups, the typed error, the "may go to" form."""

from __future__ import annotations

import enum

import pytest

from hydra_node.statemachine import InvalidTransition, StateTable


class Door(enum.Enum):
    OPEN = "open"
    SHUT = "shut"
    LOCKED = "locked"


class Push(enum.Enum):
    CLOSE = "close"
    OPEN = "open"
    LOCK = "lock"
    UNLOCK = "unlock"


DOOR = StateTable(
    "door",
    {
        Door.OPEN: {Push.CLOSE: Door.SHUT},
        Door.SHUT: {Push.OPEN: Door.OPEN, Push.LOCK: Door.LOCKED},
        Door.LOCKED: {Push.UNLOCK: Door.SHUT},
    },
)


def test_a_move_in_the_table_gives_the_next_state() -> None:
    state = Door.OPEN
    for event in (Push.CLOSE, Push.LOCK, Push.UNLOCK, Push.OPEN):
        state = DOOR.next(state, event)
    assert state is Door.OPEN
    assert DOOR.allows(Door.SHUT, Push.LOCK) and not DOOR.allows(Door.OPEN, Push.LOCK)


def test_a_move_not_in_the_table_names_the_machine_the_state_and_the_event() -> None:
    with pytest.raises(InvalidTransition) as info:
        DOOR.next(Door.LOCKED, Push.OPEN)
    err = info.value
    assert (err.machine, err.state, err.event) == ("door", Door.LOCKED, Push.OPEN)
    assert str(err) == "door: no move 'open' from state 'locked'"


def test_a_state_with_no_row_has_no_moves() -> None:
    table: StateTable[str, str] = StateTable("job", {"queued": {"start": "running"}, "done": {}})
    for state in ("running", "done", "nowhere"):
        assert not table.allows(state, "start")
        with pytest.raises(InvalidTransition, match=f"job: no move 'start' from state '{state}'"):
            table.next(state, "start")


def test_between_takes_the_target_state_as_the_event() -> None:
    runs = StateTable.between(
        "run", {"queued": {"running", "failed"}, "running": ("done", "failed"), "failed": ["queued"]}
    )
    assert runs.next("queued", "running") == "running" and runs.next("failed", "queued") == "queued"
    assert not runs.allows("done", "queued") and not runs.allows("running", "queued")
    with pytest.raises(InvalidTransition, match="run: no move 'queued' from state 'running'"):
        runs.next("running", "queued")


def test_classes_as_events_appear_by_name() -> None:
    class Hello:
        pass

    table: StateTable[str, type] = StateTable("greeting", {"wait": {Hello: "done"}})
    assert table.next("wait", Hello) == "done"
    with pytest.raises(InvalidTransition, match="greeting: no move 'Hello' from state 'done'"):
        table.next("done", Hello)
