"""State machines as tables (sans-IO, like h11's): the node's one mechanism for "which move is legal".

A machine is an enum of states, the events that move it, and a table ``{state: {event: next state}}``
declared next to the enum. :meth:`StateTable.next` looks a move up; a move not in the table raises
:class:`InvalidTransition` naming the machine, the state and the event. Where the moves are "may go
to" rather than "on event" (a record whose owner sets its state), :meth:`StateTable.between` builds
the table from ``{state: allowed next states}`` and the event is the state moved to.

    STREAM = StateTable("mux stream", {OPEN: {SEND_EOF: LOCAL_CLOSED, ...}, ...})
    stream.state = STREAM.next(stream.state, SEND_EOF)   # or InvalidTransition

The table holds no current state and calls nothing: the machine keeps its state where it likes
(a field, a frozen record) and decides guards and side effects itself. A machine whose callers
catch an error of its own raises that one, from the InvalidTransition.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Generic, TypeVar

__all__ = ["InvalidTransition", "StateTable"]

S = TypeVar("S", bound=Hashable)
E = TypeVar("E", bound=Hashable)


def _name(x: object) -> object:
    """How a state or event appears in a message: an enum's value, a class's name, else itself."""
    value = getattr(x, "value", None)
    if value is not None:
        return value
    return x.__name__ if isinstance(x, type) else x


class InvalidTransition(Exception):
    """A move the machine's table does not have (the code driving the machine is wrong)."""

    def __init__(self, machine: str, state: object, event: object) -> None:
        super().__init__(f"{machine}: no move {_name(event)!r} from state {_name(state)!r}")
        self.machine = machine
        self.state = state
        self.event = event


class StateTable(Generic[S, E]):
    """One machine's legal moves: ``moves[state][event]`` is the next state."""

    __slots__ = ("machine", "moves")

    def __init__(self, machine: str, moves: Mapping[S, Mapping[E, S]]) -> None:
        self.machine = machine
        self.moves = moves

    @classmethod
    def between(cls, machine: str, allowed: Mapping[S, Iterable[S]]) -> StateTable[S, S]:
        """The table of a machine given as ``{state: states it may move to}`` (event = target)."""
        return StateTable(machine, {state: {to: to for to in targets} for state, targets in allowed.items()})

    def next(self, state: S, event: E) -> S:
        """The state ``event`` moves ``state`` to; :class:`InvalidTransition` if the table has no such move."""
        try:
            return self.moves[state][event]
        except KeyError:
            raise InvalidTransition(self.machine, state, event) from None

    def allows(self, state: S, event: E) -> bool:
        return event in self.moves.get(state, {})

    def __repr__(self) -> str:
        return f"StateTable({self.machine!r}, {len(self.moves)} states)"
