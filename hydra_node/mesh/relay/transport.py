"""`StreamTransport`: a link's message transport over a relayed mesh stream (``link/transport.py``).

The end-to-end handshake and secure channel of a `PeerLink` run over it exactly as over a
websocket: each message becomes one relayed frame (``messages.encode_relayed_frame``) on a stream of
our link to the relay, which splices it to the target's stream. The relay sees frame sizes and
ciphertext, nothing else.
"""

from __future__ import annotations

import trio
from trio_websocket import CloseReason, ConnectionClosed

from hydra_node.codec.errors import DecodeError
from hydra_node.mesh.link.stream import LinkStream
from hydra_node.mesh.relay.messages import MAX_RELAYED_FRAME_BYTES, encode_relayed_frame, relayed_frame_decoder
from hydra_node.mesh.wire.errors import LinkClosed, StreamReset

__all__ = ["StreamTransport"]

_NORMAL, _ABNORMAL, _TOO_BIG = 1000, 1006, 1009


class StreamTransport:
    """Whole messages over ``stream`` (``initial``: bytes already read after the relay's reply)."""

    def __init__(self, stream: LinkStream, *, relay: str, initial: bytes = b"") -> None:
        self._link_stream = stream
        self.relay = relay
        self._max_message_size = MAX_RELAYED_FRAME_BYTES
        self._decoder = relayed_frame_decoder()
        self._decoder.receive_data(initial)
        self._eof_sent = False

    async def send_message(self, message: bytes | str) -> None:
        data = message.encode() if isinstance(message, str) else bytes(message)
        try:
            await self._link_stream.send(encode_relayed_frame(data))
        except (StreamReset, LinkClosed) as exc:
            raise ConnectionClosed(CloseReason(_ABNORMAL, f"relayed stream lost: {exc}")) from None

    async def get_message(self) -> bytes:
        while True:
            self._decoder.limit = self._max_message_size
            try:
                frame = self._decoder.next_frame()
            except DecodeError as exc:
                raise ConnectionClosed(CloseReason(_TOO_BIG, str(exc))) from None
            if frame is not None:
                return frame
            try:
                chunk = await self._link_stream.receive()
            except (StreamReset, LinkClosed) as exc:
                raise ConnectionClosed(CloseReason(_ABNORMAL, f"relayed stream lost: {exc}")) from None
            if not chunk:
                raise ConnectionClosed(CloseReason(_NORMAL, "relayed stream ended"))
            self._decoder.receive_data(chunk)

    async def aclose(self) -> None:
        """Half-close our side (the stream's owner finishes or resets it when the link task ends)."""
        if self._eof_sent:
            await trio.lowlevel.checkpoint()
            return
        self._eof_sent = True
        try:
            await self._link_stream.send_eof()
        except (StreamReset, LinkClosed):
            pass
