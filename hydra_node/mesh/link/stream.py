"""`LinkStream`: one multiplexed byte stream of a `PeerLink` (trio side)."""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

import trio

from hydra_node.mesh.wire.errors import LinkClosed, LocalProtocolError, StreamReset
from hydra_node.mesh.wire.mux import Multiplexer

__all__ = ["FINISH_FLUSH_S", "SEND_BUFFER_BYTES", "LinkStream", "Signal", "StreamPort"]


#: Bytes a stream may have queued in the multiplexer before send() waits (backpressure bound).
SEND_BUFFER_BYTES = 256 * 1024
#: Bound on a finished stream's last bytes reaching the wire before it is reset (peer not done yet).
FINISH_FLUSH_S = 2.0


class Signal:
    """A re-armable wake-up: waiters re-check their condition after each fire()."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = trio.Event()

    async def wait(self) -> None:
        await self._event.wait()


class StreamPort(Protocol):
    """What a stream uses of its link (``PeerLink`` hands each stream one): the multiplexer, the
    writer's wake-up, the progress signal and the link's close error. Streams know nothing else
    of the link, so this module does not import ``link``."""

    @property
    def peer_id(self) -> str: ...
    @property
    def close_error(self) -> LinkClosed | None: ...
    @property
    def mux(self) -> Multiplexer: ...
    @property
    def progress(self) -> Signal: ...
    def wake_writer(self) -> None: ...
    def forget_stream(self, stream_id: int) -> None: ...


class LinkStream:
    """A bidirectional byte stream with half-close, reset and backpressure.

    `send` returns once its bytes are handed to the link's writer, which only
    sends as far as the peer has granted credit; `receive` returns the next
    chunk, b"" at the peer's end of stream, and raises StreamReset or LinkClosed.
    """

    def __init__(self, link: StreamPort, stream_id: int, header: dict[str, Any]) -> None:
        self._link = link
        self.stream_id = stream_id
        self.header = header
        self._incoming: deque[bytes] = deque()  # bounded by the stream's window through flow control
        self._remote_eof = False
        self._local_eof = False
        self._reset: StreamReset | None = None
        self._signal = Signal()
        self._send_lock = trio.Lock()
        self.bytes_sent = 0
        self.bytes_received = 0

    def __repr__(self) -> str:
        return f"<LinkStream {self.stream_id} peer={self._link.peer_id[:12]} header={self.header!r}>"

    # -- called by the link's reader --

    def _deliver(self, data: bytes) -> None:
        self._incoming.append(data)
        self._signal.fire()

    def _end(self) -> None:
        self._remote_eof = True
        self._signal.fire()

    def _was_reset(self, error: StreamReset) -> None:
        if self._reset is None:
            self._reset = error
        self._signal.fire()

    # -- application API --

    def _check_usable(self) -> None:
        if self._reset is not None:
            raise self._reset
        if self._link.close_error is not None:
            raise self._link.close_error

    async def send(self, data: bytes) -> None:
        """Send bytes; waits while the peer's credit is exhausted (backpressure)."""
        await trio.lowlevel.checkpoint()
        if not data:
            return
        async with self._send_lock:
            self._check_usable()
            mux = self._link.mux
            mux.send_data(self.stream_id, bytes(data))
            self._link.wake_writer()
            # Return once at most SEND_BUFFER_BYTES wait in the multiplexer for credit or the writer:
            # small writes (RPC commands, tokens) do not wait for a scheduling round trip, and a big
            # transfer still cannot grow the buffer without bound.
            while mux.buffered(self.stream_id) > SEND_BUFFER_BYTES:
                self._check_usable()
                await self._link.progress.wait()
            self._check_usable()
            self.bytes_sent += len(data)

    async def send_eof(self) -> None:
        """Half-close: the peer's receive() returns b"" after the data already sent."""
        await trio.lowlevel.checkpoint()
        if self._local_eof:
            return
        self._check_usable()
        self._local_eof = True
        self._link.mux.send_eof(self.stream_id)
        self._link.wake_writer()

    def grow_window(self, window: int) -> None:
        """Let the peer send up to ``window`` bytes ahead of what we have read (at most
        BULK_WINDOW_BYTES): for a download this side reads as fast as it arrives."""
        self._link.mux.grow_window(self.stream_id, window)
        self._link.wake_writer()

    async def receive(self) -> bytes:
        """The next chunk of data; b"" once the peer has half-closed."""
        await trio.lowlevel.checkpoint()
        while not self._incoming:
            if self._reset is not None:
                raise self._reset
            if self._remote_eof:
                return b""
            if self._link.close_error is not None:
                raise self._link.close_error
            await self._signal.wait()
        chunk = self._incoming.popleft()
        self.bytes_received += len(chunk)
        self._link.mux.consumed(self.stream_id, len(chunk))
        self._link.wake_writer()
        return chunk

    async def receive_all(self, limit: int) -> bytes:
        """Everything until the peer's end of stream; LocalProtocolError past `limit` bytes."""
        parts: list[bytes] = []
        size = 0
        while chunk := await self.receive():
            size += len(chunk)
            if size > limit:
                raise LocalProtocolError(f"stream {self.stream_id} carried more than {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)

    async def reset(self, code: str = "cancel", message: str = "") -> None:
        """Abort the stream in both directions."""
        await trio.lowlevel.checkpoint()
        self._reset_now(code, message)

    def _reset_now(self, code: str, message: str) -> None:
        if self._reset is None:
            self._reset = StreamReset(f"stream {self.stream_id} reset locally: {code} {message}".strip(), code=code)
            self._link.mux.reset_stream(self.stream_id, code, message)
            self._link.wake_writer()
        self._link.forget_stream(self.stream_id)
        self._signal.fire()

    async def _finish(self) -> None:
        """End of use: half-close if needed; reset if the peer has not finished sending — once what
        we sent is on the wire (a reset drops unsent data, e.g. a final error event and our EOF)."""
        if self._reset is not None or self._link.close_error is not None:
            self._link.forget_stream(self.stream_id)
            return
        if not self._local_eof:
            await self.send_eof()
        if self._remote_eof and not self._incoming:
            self._link.forget_stream(self.stream_id)
            return
        with trio.move_on_after(FINISH_FLUSH_S):
            while self._link.mux.buffered(self.stream_id) and self._reset is None and self._link.close_error is None:
                await self._link.progress.wait()
        self._reset_now("cancel", "stream closed before the peer finished sending")
