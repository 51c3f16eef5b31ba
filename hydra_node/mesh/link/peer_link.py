"""`PeerLink`: the trio driver of an encrypted, multiplexed link over a message transport
(trio-websocket, or a relayed stream: ``link/transport.py``).

One reader task and one writer task per connection; the writer is the only
task that sends, so sends never interleave, and a failed send closes the link.
Rejected frames are logged (key=value, with the peer id) and counted; a frame
that fails authentication, skips ahead or breaks the stream rules closes the
link, a replayed frame is dropped. Garbage never escapes as anything but a
closed link and a counter.
"""

from __future__ import annotations

import collections
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection

from hydra_node.mesh.wire.secure_channel import SecureChannel
from hydra_node.mesh.wire.constants import MAX_PENDING_CONTROL_FRAMES, MAX_STREAMS_PER_LINK
from hydra_node.mesh.wire.errors import FrameRejected, LinkClosed, LocalProtocolError, RemoteProtocolError, StreamReset
from hydra_node.mesh.link.faults import FAULT_DELAY_QUEUE_FRAMES
from hydra_node.mesh.wire.handshake import HandshakeResult
from hydra_node.mesh.wire.ids import MeshSecret
from hydra_node.mesh.link.pings import PingTracker
from hydra_node.mesh.link.port import LinkPort
from hydra_node.mesh.link.settings import (
    CLOSE_TIMEOUT_S,
    HANDSHAKE_TIMEOUT_S,
    IDLE_TIMEOUT_S,
    MESSAGE_QUEUE_SIZE,
    PING_INTERVAL_S,
    LinkSettings,
    LinkStatistics,
    MessageHandler,
    StreamHandler,
)
from hydra_node.mesh.wire.mux import (
    DataReceived,
    GoAwayReceived,
    MessageReceived,
    Multiplexer,
    MuxEvent,
    PongReceived,
    StreamEnded,
    StreamOpened,
    StreamWasReset,
    WindowOpened,
)
from hydra_node.mesh.link.stream import LinkStream, Signal, StreamPort
from hydra_node.mesh.link.transport import MessageTransport
from hydra_node.mesh.link.websocket import close_websocket, log_event

__all__ = [
    "CLOSE_TIMEOUT_S",
    "HANDSHAKE_TIMEOUT_S",
    "IDLE_TIMEOUT_S",
    "PING_INTERVAL_S",
    "LinkSettings",
    "LinkStatistics",
    "MessageHandler",
    "PeerLink",
    "StreamHandler",
    "close_websocket",
    "log_event",
]


class PeerLink:
    """An authenticated, encrypted link to one peer. Run it with `await nursery.start(link.run)`."""

    def __init__(
        self,
        ws: WebSocketConnection | MessageTransport,
        result: HandshakeResult,
        settings: LinkSettings,
        *,
        punched: bool = False,
    ) -> None:
        self._ws = ws
        self._punched = punched  # a direct connection made by hole punching (mesh/relay/simopen.py)
        self._result = result
        self._settings = settings
        self._channel = SecureChannel(result.send_key, result.receive_key)
        self._mux = Multiplexer(is_initiator=result.is_initiator)
        self._streams: dict[int, LinkStream] = {}
        self._writer_wakeup = Signal()
        self._progress = Signal()
        self._nursery: trio.Nursery | None = None
        self.close_error: LinkClosed | None = None
        self._finished = trio.Event()
        self._rejected: collections.Counter[str] = collections.Counter()
        self._bytes_in = self._bytes_out = self._frames_in = self._frames_out = 0
        self._messages_in = self._messages_out = self._messages_dropped = 0
        self._pings = PingTracker()
        self._messages_send, self._messages_receive = trio.open_memory_channel[dict[str, Any]](MESSAGE_QUEUE_SIZE)
        self._fault = settings.fault
        self._delay_send, self._delay_receive = trio.open_memory_channel[tuple[float, bytes]](FAULT_DELAY_QUEUE_FRAMES)
        self._last_due = 0.0
        self._in_flight = 0  # frames taken from the multiplexer but not yet on the wire
        self._port: StreamPort = LinkPort(
            self, self._mux, self._progress, wake_writer=self._wake_writer, forget_stream=self._forget_stream
        )

    # -- identity --

    @property
    def peer_id(self) -> str:
        return self._result.peer_id

    @property
    def peer_public_key(self) -> bytes:
        return self._result.peer_public_key

    @property
    def mesh(self) -> MeshSecret:
        """The mesh this link belongs to (for a joiner: the key received on admission)."""
        return self._result.mesh

    @property
    def admitted_by(self) -> str:
        return self._result.admitted_by

    @property
    def is_initiator(self) -> bool:
        return self._result.is_initiator

    @property
    def session_id(self) -> bytes:
        return self._result.session_id

    @property
    def rtt_ms(self) -> float | None:
        return self._pings.rtt_ms

    @property
    def remote_host(self) -> str | None:
        """The peer's IP address as this connection sees it (None if unknown)."""
        try:
            remote: Any = getattr(self._ws, "remote")  # a websocket's Endpoint; a relayed stream has none
            return str(remote.address)
        except Exception:  # not a TCP connection, or already torn down
            return None

    @property
    def relay(self) -> str | None:
        """The node id of the relay this link runs through (None for a direct link)."""
        return getattr(self._ws, "relay", None)

    @property
    def path(self) -> str:
        """How the link runs: "direct" (dialled or accepted), "relayed", or "punched" (hole punching)."""
        return "relayed" if self.relay is not None else "punched" if self._punched else "direct"

    @property
    def closed(self) -> bool:
        return self.close_error is not None

    def statistics(self) -> LinkStatistics:
        return LinkStatistics(
            peer_id=self.peer_id,
            bytes_in=self._bytes_in,
            bytes_out=self._bytes_out,
            frames_in=self._frames_in,
            frames_out=self._frames_out,
            messages_in=self._messages_in,
            messages_out=self._messages_out,
            messages_dropped=self._messages_dropped,
            streams_open=len(self._streams),
            rtt_ms=self._pings.rtt_ms,
            rejected=dict(self._rejected),
            closed=self.close_error.code if self.close_error else None,
        )

    # -- lifecycle --

    async def run(self, *, task_status: trio.TaskStatus[PeerLink] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the link until it closes; `started(self)` once its tasks are up."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._reader)
                nursery.start_soon(self._writer)
                nursery.start_soon(self._pinger)
                if self._settings.on_message is not None:
                    nursery.start_soon(self._dispatch_messages)
                if self._fault is not None and self._fault.delays:
                    nursery.start_soon(self._delay_line)
                log_event(
                    logging.INFO,
                    "link_up",
                    peer=self.peer_id,
                    initiator=self.is_initiator,
                    admitted_by=self.admitted_by,
                )
                task_status.started(self)
        finally:
            self._mark_closed("finished", "link task ended")
            await close_websocket(self._ws)
            self._finished.set()

    async def aclose(self, code: str = "normal", message: str = "") -> None:
        """Tell the peer (GOAWAY, bounded wait) and close the link."""
        if self.close_error is None:
            self._mux.send_goaway(code, message)
            self._wake_writer()
            with trio.move_on_after(CLOSE_TIMEOUT_S):
                while (self._mux.control_backlog or self._in_flight) and self.close_error is None:
                    await self._progress.wait()
            self._close("local_close", f"{code} {message}".strip())
        await trio.lowlevel.checkpoint()

    async def wait_closed(self) -> None:
        await self._finished.wait()

    def _mark_closed(self, code: str, message: str) -> bool:
        if self.close_error is not None:
            return False
        self.close_error = LinkClosed(f"link to {self.peer_id[:12]} closed: {code} {message}".strip(), code=code)
        for stream in list(self._streams.values()):
            stream._signal.fire()
        self._progress.fire()
        self._writer_wakeup.fire()
        self._messages_send.close()
        return True

    def _close(self, code: str, message: str) -> None:
        if self._mark_closed(code, message):
            log_event(logging.INFO, "link_closed", peer=self.peer_id, reason=code, detail=message)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def _reject(self, code: str, detail: str, *, close: bool) -> None:
        self._rejected[code] += 1
        log_event(logging.WARNING, "frame_rejected", peer=self.peer_id, reason=code, detail=detail, closing=close)
        if close:
            self._close(code, detail)

    def _wake_writer(self) -> None:
        self._writer_wakeup.fire()

    def _forget_stream(self, stream_id: int) -> None:
        self._streams.pop(stream_id, None)

    def _check_open(self) -> None:
        if self.close_error is not None:
            raise self.close_error

    # -- application API --

    @asynccontextmanager
    async def open_stream(self, header: dict[str, Any]) -> AsyncIterator[LinkStream]:
        """Open a stream whose OPEN frame carries `header`; reset on error, half-close on exit."""
        self._check_open()
        while self._mux.control_backlog >= MAX_PENDING_CONTROL_FRAMES:
            await self._progress.wait()
            self._check_open()
        if len(self._streams) >= MAX_STREAMS_PER_LINK:
            raise LocalProtocolError(f"more than {MAX_STREAMS_PER_LINK} streams open on this link")
        stream_id = self._mux.open_stream(header)
        stream = LinkStream(self._port, stream_id, header)
        self._streams[stream_id] = stream
        self._wake_writer()
        try:
            yield stream
        except BaseException as exc:
            stream._reset_now("error", type(exc).__name__)
            raise
        await stream._finish()

    async def send_message(self, body: dict[str, Any]) -> None:
        """Queue a small message on the priority lane (waits only if that lane is full)."""
        self._check_open()
        if self._fault is not None and self._fault.drop_message():
            self._messages_dropped += 1
            await trio.lowlevel.checkpoint()
            return
        while self._mux.control_backlog >= MAX_PENDING_CONTROL_FRAMES:
            await self._progress.wait()
            self._check_open()
        self._mux.send_message(body)
        self._messages_out += 1
        self._wake_writer()
        await trio.lowlevel.checkpoint()

    async def receive_message(self) -> dict[str, Any]:
        """The next priority-lane message (only when no on_message handler is set)."""
        if self._settings.on_message is not None:
            raise LocalProtocolError("messages go to the on_message handler of this link")
        try:
            return await self._messages_receive.receive()
        except trio.EndOfChannel:
            raise self.close_error or LinkClosed("link closed") from None

    # -- tasks --

    async def _writer(self) -> None:
        while True:
            frame = self._mux.next_frame()
            if frame is None:
                self._progress.fire()
                await self._writer_wakeup.wait()
                continue
            wire = self._channel.seal(frame)
            self._frames_out += 1
            self._in_flight += 1
            if self._fault is not None and self._fault.drop_frame():
                self._rejected["dropped_by_fault"] += 1
                self._in_flight -= 1
            elif self._fault is not None and self._fault.delays:
                self._last_due = max(self._last_due, trio.current_time() + self._fault.delay())
                await self._delay_send.send((self._last_due, wire))
            else:
                await self._send_wire(wire)
            self._progress.fire()

    async def _delay_line(self) -> None:
        async for due, wire in self._delay_receive:
            await trio.sleep_until(due)
            await self._send_wire(wire)

    async def _send_wire(self, wire: bytes) -> None:
        try:
            await self._ws.send_message(wire)
        except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._close("send_failed", f"{type(exc).__name__}: {exc}")
            await trio.lowlevel.checkpoint()
            return
        self._bytes_out += len(wire)
        self._in_flight -= 1
        self._progress.fire()

    async def _reader(self) -> None:
        while True:
            with trio.move_on_after(self._settings.idle_timeout_s) as idle:
                try:
                    wire = await self._ws.get_message()
                except ConnectionClosed as exc:
                    reason = exc.reason
                    if getattr(reason, "code", None) == 1009:
                        self._reject("oversize", f"websocket message over the limit: {reason}", close=True)
                    else:
                        self._close("peer_closed", f"websocket closed: {reason}")
                    return
            if idle.cancelled_caught:
                self._close("idle_timeout", f"nothing received for {self._settings.idle_timeout_s} s")
                return
            self._frames_in += 1
            self._bytes_in += len(wire)
            if isinstance(wire, str):
                self._reject("bad_frame", "text websocket message on a binary link", close=True)
                return
            try:
                plaintext = self._channel.open(wire)
            except FrameRejected as exc:
                self._reject(exc.code, str(exc), close=exc.code != "replay")
                if exc.code == "replay":
                    continue
                return
            try:
                events = self._mux.receive_frame(plaintext)
            except RemoteProtocolError as exc:
                self._reject(exc.code, str(exc), close=True)
                return
            for event in events:
                self._dispatch(event)
            self._wake_writer()

    def _dispatch(self, event: MuxEvent) -> None:
        if isinstance(event, DataReceived):
            stream = self._streams.get(event.stream_id)
            if stream is not None:
                stream._deliver(event.data)
            else:
                self._mux.consumed(event.stream_id, len(event.data))
        elif isinstance(event, WindowOpened):
            self._progress.fire()
        elif isinstance(event, MessageReceived):
            self._messages_in += 1
            try:
                self._messages_send.send_nowait(event.body)
            except (trio.WouldBlock, trio.ClosedResourceError):
                self._messages_dropped += 1
        elif isinstance(event, PongReceived):
            self._pings.pong(event.opaque, trio.current_time())
        elif isinstance(event, StreamOpened):
            self._accept_stream(event)
        elif isinstance(event, StreamEnded):
            stream = self._streams.get(event.stream_id)
            if stream is not None:
                stream._end()
        elif isinstance(event, StreamWasReset):
            stream = self._streams.pop(event.stream_id, None)
            if stream is not None:
                stream._was_reset(
                    StreamReset(f"stream reset by peer: {event.code} {event.message}".strip(), code=event.code)
                )
        elif isinstance(event, GoAwayReceived):
            self._close("peer_goaway", f"{event.code} {event.message}".strip())

    def _accept_stream(self, event: StreamOpened) -> None:
        handler = self._settings.on_stream
        if handler is None or self._nursery is None:
            self._mux.reset_stream(event.stream_id, "refused", "this node accepts no streams")
            return
        stream = LinkStream(self._port, event.stream_id, event.header)
        self._streams[event.stream_id] = stream
        self._nursery.start_soon(self._serve_stream, handler, stream)

    async def _serve_stream(self, handler: StreamHandler, stream: LinkStream) -> None:
        try:
            await handler(self, stream.header, stream)
        except (StreamReset, LinkClosed):
            stream._reset_now("error", "handler ended by reset")
            return
        except Exception as exc:  # a handler bug must not take the link down
            log_event(
                logging.ERROR, "stream_handler_failed", peer=self.peer_id, stream=stream.stream_id, error=repr(exc)
            )
            stream._reset_now("error", type(exc).__name__)
            return
        try:
            await stream._finish()
        except (StreamReset, LinkClosed):
            pass  # the peer reset or the link closed as the handler returned: nothing left to finish

    async def _dispatch_messages(self) -> None:
        handler = self._settings.on_message
        assert handler is not None
        async for body in self._messages_receive:
            try:
                await handler(self, body)
            except Exception as exc:  # a handler bug must not take the link down
                log_event(logging.ERROR, "message_handler_failed", peer=self.peer_id, error=repr(exc))

    async def _pinger(self) -> None:
        while True:
            opaque = self._pings.ping(trio.current_time())
            if self._mux.control_backlog < MAX_PENDING_CONTROL_FRAMES:
                self._mux.send_ping(opaque)
                self._wake_writer()
            await trio.sleep(self._settings.ping_interval_s)
