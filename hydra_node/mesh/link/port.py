"""`LinkPort`: the part of a `PeerLink` its streams may use (``stream.StreamPort``).

A stream gets its link's multiplexer, progress signal, writer wake-up and close error, and
nothing else, so `stream` never imports `link`. The port is built by the link from exactly
those parts instead of reaching into the link's private state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from hydra_node.mesh.wire.errors import LinkClosed
from hydra_node.mesh.wire.mux import Multiplexer
from hydra_node.mesh.link.stream import Signal

__all__ = ["LinkPort"]


class _LinkIdentity(Protocol):
    """What the port reads of its link when asked: who the peer is and whether it closed."""

    @property
    def peer_id(self) -> str: ...
    @property
    def close_error(self) -> LinkClosed | None: ...


class LinkPort:
    """A link's multiplexer, progress signal and writer wake-up, handed to each of its streams."""

    __slots__ = ("_link", "mux", "progress", "_wake_writer", "_forget_stream")

    def __init__(
        self,
        link: _LinkIdentity,
        mux: Multiplexer,
        progress: Signal,
        *,
        wake_writer: Callable[[], None],
        forget_stream: Callable[[int], None],
    ) -> None:
        self._link = link
        self.mux = mux
        self.progress = progress
        self._wake_writer = wake_writer
        self._forget_stream = forget_stream

    @property
    def peer_id(self) -> str:
        return self._link.peer_id

    @property
    def close_error(self) -> LinkClosed | None:
        return self._link.close_error

    def wake_writer(self) -> None:
        self._wake_writer()

    def forget_stream(self, stream_id: int) -> None:
        self._forget_stream(stream_id)
