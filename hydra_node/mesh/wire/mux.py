"""Stream multiplexing with credit-based flow control (sans-IO).

One link carries many streams plus a priority lane. The writer asks
`next_frame()` repeatedly: every queued control frame (messages, OPEN, RESET,
WINDOW, PING/PONG, GOAWAY) goes first, then the streams with data and credit
take turns one DATA chunk (at most DATA_CHUNK_BYTES) at a time, so a bulk
transfer never holds up gossip for more than one chunk. Each side grants
STREAM_WINDOW_BYTES of credit per stream and tops it up with WINDOW frames as
the application consumes data (``grow_window`` widens one stream's window, up to
BULK_WINDOW_BYTES, for a bulk download); a peer that sends beyond its credit
breaks the link (FlowControlError).

Stream state machine (`STREAM_TRANSITIONS`), per stream::

    state          send_eof       recv_eof       send_data      recv_data      reset
    open           local_closed   remote_closed  open           open           closed
    local_closed   -              closed         -              local_closed   closed
    remote_closed  closed         -              remote_closed  -              closed

A move not in the table (`STREAM_MACHINE`, hydra_node.statemachine) raises
LocalProtocolError (our side) or FlowControlError (the peer's side) naming the state. Closed streams are forgotten.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hydra_node.mesh.wire.constants import (
    BULK_WINDOW_BYTES,
    DATA_CHUNK_BYTES,
    MAX_PENDING_CONTROL_FRAMES,
    MAX_STREAMS_PER_LINK,
    STREAM_WINDOW_BYTES,
)
from hydra_node.mesh.wire.errors import FlowControlError, LocalProtocolError
from hydra_node.mesh.wire.frames import (
    MAX_STREAM_ID,
    MAX_WINDOW,
    Close,
    Data,
    Frame,
    GoAway,
    Message,
    Open,
    LinkPing,
    LinkPong,
    Reset,
    Window,
    decode_frame,
    encode_frame,
)
from hydra_node.statemachine import InvalidTransition, StateTable


class StreamState(enum.Enum):
    """Where one stream is; the values appear in error messages."""

    OPEN = "open"
    LOCAL_CLOSED = "local_closed"  # we sent our end of stream
    REMOTE_CLOSED = "remote_closed"  # the peer sent its end of stream
    CLOSED = "closed"


class StreamEvent(enum.Enum):
    """What moves a stream between states (ours: send_*; the peer's: recv_*)."""

    SEND_EOF = "send_eof"
    RECV_EOF = "recv_eof"
    SEND_DATA = "send_data"
    RECV_DATA = "recv_data"
    RESET = "reset"


_S, _E = StreamState, StreamEvent
STREAM_TRANSITIONS: dict[StreamState, dict[StreamEvent, StreamState]] = {
    _S.OPEN: {
        _E.SEND_EOF: _S.LOCAL_CLOSED,
        _E.RECV_EOF: _S.REMOTE_CLOSED,
        _E.SEND_DATA: _S.OPEN,
        _E.RECV_DATA: _S.OPEN,
        _E.RESET: _S.CLOSED,
    },
    _S.LOCAL_CLOSED: {_E.RECV_EOF: _S.CLOSED, _E.RECV_DATA: _S.LOCAL_CLOSED, _E.RESET: _S.CLOSED},
    _S.REMOTE_CLOSED: {_E.SEND_EOF: _S.CLOSED, _E.SEND_DATA: _S.REMOTE_CLOSED, _E.RESET: _S.CLOSED},
}
STREAM_MACHINE = StateTable("mux stream", STREAM_TRANSITIONS)

MAX_PEER_INDUCED_CONTROL_FRAMES = 4 * MAX_PENDING_CONTROL_FRAMES
"""PONG/WINDOW/RESET replies we queue for the peer; a peer that outruns this is flooding."""


# --- events for the driver --------------------------------------------------------------


@dataclass(frozen=True)
class StreamOpened:
    stream_id: int
    header: dict[str, Any]


@dataclass(frozen=True)
class DataReceived:
    stream_id: int
    data: bytes


@dataclass(frozen=True)
class StreamEnded:
    stream_id: int


@dataclass(frozen=True)
class StreamWasReset:
    stream_id: int
    code: str
    message: str


@dataclass(frozen=True)
class WindowOpened:
    stream_id: int


@dataclass(frozen=True)
class MessageReceived:
    body: dict[str, Any]


@dataclass(frozen=True)
class PongReceived:
    opaque: bytes


@dataclass(frozen=True)
class GoAwayReceived:
    code: str
    message: str


MuxEvent = (
    StreamOpened
    | DataReceived
    | StreamEnded
    | StreamWasReset
    | WindowOpened
    | MessageReceived
    | PongReceived
    | GoAwayReceived
)


@dataclass
class _Stream:
    stream_id: int
    state: StreamState = StreamState.OPEN
    send_credit: int = STREAM_WINDOW_BYTES
    send_buffer: bytearray = field(default_factory=bytearray)
    eof_pending: bool = False
    receive_allowance: int = STREAM_WINDOW_BYTES
    consumed_unacked: int = 0
    window: int = STREAM_WINDOW_BYTES  # what this side lets the peer have in flight on the stream


class Multiplexer:
    """The stream and priority-lane state of one link side."""

    def __init__(self, *, is_initiator: bool) -> None:
        self._streams: dict[int, _Stream] = {}
        self._next_local_id = 1 if is_initiator else 2
        self._peer_parity = 0 if is_initiator else 1
        self._last_peer_id = 0
        self._control: deque[bytes] = deque()
        self._rotation: deque[int] = deque()
        self.late_frames = 0

    # -- local actions --

    @property
    def control_backlog(self) -> int:
        return len(self._control)

    def open_stream(self, header: dict[str, Any]) -> int:
        if self._next_local_id > MAX_STREAM_ID:
            raise LocalProtocolError("stream ids exhausted; open a new link")
        stream_id = self._next_local_id
        frame = encode_frame(Open(stream_id, header))
        self._next_local_id += 2
        self._streams[stream_id] = _Stream(stream_id)
        self._rotation.append(stream_id)
        self._control.append(frame)
        return stream_id

    def send_data(self, stream_id: int, data: bytes) -> None:
        stream = self._local_move(stream_id, StreamEvent.SEND_DATA)
        stream.send_buffer += data

    def send_eof(self, stream_id: int) -> None:
        stream = self._local_move(stream_id, StreamEvent.SEND_EOF)
        stream.eof_pending = True

    def reset_stream(self, stream_id: int, code: str, message: str = "") -> None:
        """Abort a stream at once (drops unsent data); no-op if it is already gone."""
        if stream_id in self._streams:
            self._forget(stream_id)
            self._control.append(encode_frame(Reset(stream_id, code, message[:1024])))

    def send_message(self, body: dict[str, Any]) -> None:
        self._control.append(encode_frame(Message(body)))

    def send_ping(self, opaque: bytes) -> None:
        self._control.append(encode_frame(LinkPing(opaque)))

    def send_goaway(self, code: str, message: str = "") -> None:
        self._control.append(encode_frame(GoAway(code, message[:1024])))

    def consumed(self, stream_id: int, n: int) -> None:
        """The application took `n` bytes of the stream; grant credit back when worthwhile."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.state in (StreamState.REMOTE_CLOSED, StreamState.CLOSED):
            return
        stream.consumed_unacked += n
        if stream.consumed_unacked >= stream.window // 2:
            stream.receive_allowance += stream.consumed_unacked
            self._control.append(encode_frame(Window(stream_id, stream.consumed_unacked)))
            stream.consumed_unacked = 0

    def grow_window(self, stream_id: int, window: int) -> None:
        """Let the peer have up to ``window`` bytes in flight on this stream (never less than it has
        now, at most BULK_WINDOW_BYTES): the extra credit goes out at once in a WINDOW frame. For a
        stream the application reads as fast as data arrives; the receive buffer may then hold
        ``window`` bytes instead of STREAM_WINDOW_BYTES."""
        if not STREAM_WINDOW_BYTES <= window <= BULK_WINDOW_BYTES:
            raise LocalProtocolError(f"a stream window must be {STREAM_WINDOW_BYTES}..{BULK_WINDOW_BYTES} bytes")
        stream = self._streams.get(stream_id)
        if stream is None or stream.state in (StreamState.REMOTE_CLOSED, StreamState.CLOSED) or window <= stream.window:
            return
        extra = window - stream.window
        stream.window = window
        stream.receive_allowance += extra
        self._control.append(encode_frame(Window(stream_id, extra)))

    def buffered(self, stream_id: int) -> int:
        """Bytes (and a pending EOF, counted as 1) not yet handed to the writer."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return 0
        return len(stream.send_buffer) + (1 if stream.eof_pending else 0)

    def is_open(self, stream_id: int) -> bool:
        return stream_id in self._streams

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def next_frame(self) -> bytes | None:
        """The next plaintext frame to send (priority lane first), or None if idle."""
        if self._control:
            return self._control.popleft()
        for _ in range(len(self._rotation)):
            stream_id = self._rotation[0]
            self._rotation.rotate(-1)
            stream = self._streams[stream_id]
            if stream.send_buffer and stream.send_credit > 0:
                size = min(DATA_CHUNK_BYTES, stream.send_credit, len(stream.send_buffer))
                chunk = bytes(stream.send_buffer[:size])
                del stream.send_buffer[:size]
                stream.send_credit -= size
                return encode_frame(Data(stream_id, chunk))
            if stream.eof_pending and not stream.send_buffer:
                stream.eof_pending = False
                if stream.state is StreamState.CLOSED:
                    self._forget(stream_id)
                return encode_frame(Close(stream_id))
        return None

    # -- peer input --

    def receive_frame(self, plaintext: bytes) -> list[MuxEvent]:
        """Apply one decrypted frame; FrameRejected / FlowControlError if the peer misbehaves."""
        frame = decode_frame(plaintext)
        events = self._apply(frame)
        if len(self._control) > MAX_PEER_INDUCED_CONTROL_FRAMES:
            raise FlowControlError("peer induces control frames faster than we can send them", code="control_flood")
        return events

    def _apply(self, frame: Frame) -> list[MuxEvent]:
        if isinstance(frame, Message):
            return [MessageReceived(frame.body)]
        if isinstance(frame, LinkPing):
            self._control.append(encode_frame(LinkPong(frame.opaque)))
            return []
        if isinstance(frame, LinkPong):
            return [PongReceived(frame.opaque)]
        if isinstance(frame, GoAway):
            return [GoAwayReceived(frame.code, frame.message)]
        if isinstance(frame, Open):
            return self._peer_open(frame)
        stream = self._streams.get(frame.stream_id)
        if stream is None:
            if self._was_used(frame.stream_id):
                self.late_frames += 1  # raced with a reset or close; harmless
                return []
            raise FlowControlError(
                f"{type(frame).__name__.upper()} for stream {frame.stream_id}, which was never opened",
                code="stream_state",
            )
        if isinstance(frame, Data):
            self._remote_move(stream, StreamEvent.RECV_DATA)
            if len(frame.data) > stream.receive_allowance:
                raise FlowControlError(
                    f"peer sent {len(frame.data)} bytes on stream {stream.stream_id} with {stream.receive_allowance} of credit",
                    code="flow_control",
                )
            stream.receive_allowance -= len(frame.data)
            return [DataReceived(stream.stream_id, frame.data)]
        if isinstance(frame, Close):
            self._remote_move(stream, StreamEvent.RECV_EOF)
            if stream.state is StreamState.CLOSED and not stream.send_buffer and not stream.eof_pending:
                self._forget(stream.stream_id)
            return [StreamEnded(stream.stream_id)]
        if isinstance(frame, Reset):
            self._forget(stream.stream_id)
            return [StreamWasReset(stream.stream_id, frame.code, frame.message)]
        if isinstance(frame, Window):
            if stream.send_credit + frame.increment > MAX_WINDOW:
                raise FlowControlError(
                    f"window of stream {stream.stream_id} would exceed {MAX_WINDOW}", code="flow_control"
                )
            stream.send_credit += frame.increment
            return [WindowOpened(stream.stream_id)]
        raise FlowControlError(f"unexpected frame {frame!r}", code="stream_state")  # pragma: no cover

    def _peer_open(self, frame: Open) -> list[MuxEvent]:
        stream_id = frame.stream_id
        if stream_id % 2 != self._peer_parity or stream_id <= self._last_peer_id:
            raise FlowControlError(
                f"peer may not open stream {stream_id} (last was {self._last_peer_id})", code="stream_state"
            )
        self._last_peer_id = stream_id
        peer_streams = sum(1 for s in self._streams if s % 2 == self._peer_parity)
        if peer_streams >= MAX_STREAMS_PER_LINK:
            self._control.append(
                encode_frame(Reset(stream_id, "refused", f"more than {MAX_STREAMS_PER_LINK} open streams"))
            )
            return []
        self._streams[stream_id] = _Stream(stream_id)
        self._rotation.append(stream_id)
        return [StreamOpened(stream_id, frame.header)]

    # -- helpers --

    def _was_used(self, stream_id: int) -> bool:
        if stream_id % 2 == self._peer_parity:
            return 0 < stream_id <= self._last_peer_id
        return 0 < stream_id < self._next_local_id

    def _local_move(self, stream_id: int, event: StreamEvent) -> _Stream:
        stream = self._streams.get(stream_id)
        if stream is None:
            raise LocalProtocolError(f"{event.value} on stream {stream_id}, which is closed or was never opened")
        try:
            stream.state = STREAM_MACHINE.next(stream.state, event)
        except InvalidTransition as exc:
            raise LocalProtocolError(
                f"{event.value} not allowed on stream {stream_id} in state {stream.state.value}"
            ) from exc
        return stream

    def _remote_move(self, stream: _Stream, event: StreamEvent) -> None:
        try:
            stream.state = STREAM_MACHINE.next(stream.state, event)
        except InvalidTransition as exc:
            raise FlowControlError(
                f"peer sent {event.value} on stream {stream.stream_id} in state {stream.state.value}",
                code="stream_state",
            ) from exc

    def _forget(self, stream_id: int) -> None:
        self._streams.pop(stream_id, None)
        try:
            self._rotation.remove(stream_id)
        except ValueError:
            pass
