"""A model entry's optional ``ident`` (protocol/README.md section 11.2): omitted when unknown, so an
entry without it reads as before; strictly 16 lowercase hex characters when present."""

from __future__ import annotations

import pytest

from hydra_node.mesh.membership import ModelEntry
from hydra_node.mesh.membership.announcement import InvalidMessage


def test_an_entry_with_an_ident_round_trips_and_one_without_is_written_as_before():
    e = ModelEntry("m", "ready", 2, "0123456789abcdef")
    assert e.to_wire() == {"id": "m", "state": "ready", "free_slots": 2, "ident": "0123456789abcdef"}
    assert ModelEntry.from_wire(e.to_wire()) == e
    old = ModelEntry("m", "ready")
    assert old.to_wire() == {"id": "m", "state": "ready"} and ModelEntry.from_wire(old.to_wire()).ident is None


@pytest.mark.parametrize(
    "bad", ["0123456789ABCDEF", "0123456789abcde", "0123456789abcdef0", "", 5, b"0" * 16, "g" * 16]
)
def test_a_malformed_ident_is_refused(bad):
    with pytest.raises(InvalidMessage):
        ModelEntry.from_wire({"id": "m", "state": "ready", "ident": bad})
