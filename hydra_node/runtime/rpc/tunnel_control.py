"""The tunnel's stream protocol: service name, bounds, and reading one control message.

Every tunnel stream is opened with a header ``{"kind": "tunnel", "service": TUNNEL_SERVICE,
"op": "lease" | "connect", "tag": ...}``; the control messages that follow (lease grant,
data-connection offer, path choice) are encoded and decoded by :mod:`.lease_wire`.
"""

from __future__ import annotations

from typing import Any, TypeVar, overload

from hydra_node.runtime.rpc.lease_wire import ControlDecoder, ControlEvent

__all__ = ["MAX_TAG_CHARS", "PATH_CHOICE_TIMEOUT_S", "TUNNEL_SERVICE", "read_control"]

TUNNEL_SERVICE = "rpc"
#: Longest lease tag (coordinators use the model id: one lease per coordinating runner).
MAX_TAG_CHARS = 128
#: How long each side waits for the other's data-connection offer or path choice.
PATH_CHOICE_TIMEOUT_S = 15.0

E1 = TypeVar("E1", bound=ControlEvent)
E2 = TypeVar("E2", bound=ControlEvent)


@overload
async def read_control(stream: Any, expected: type[E1], /) -> tuple[E1, bytes]: ...
@overload
async def read_control(stream: Any, expected: type[E1], or_else: type[E2], /) -> tuple[E1 | E2, bytes]: ...


async def read_control(stream: Any, *expected: type[Any]) -> tuple[ControlEvent, bytes]:
    """One control message (one of `expected`) from a stream, and the bytes that followed it
    in the same chunks; :class:`ControlError` if the stream carries anything else or ends."""
    decoder = ControlDecoder()
    while (event := decoder.next_event(*expected)) is None:
        chunk = await stream.receive()
        if not chunk:
            decoder.end_of_stream()
        decoder.receive_data(chunk)
    return event, decoder.take_unconsumed()
