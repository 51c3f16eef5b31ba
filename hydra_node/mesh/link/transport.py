"""What a `PeerLink` runs over: a message transport (a websocket, or a relayed stream).

The link needs whole messages in order, a bounded close and an adjustable size limit — the
subset of trio-websocket's ``WebSocketConnection`` it uses. A websocket is one; a relayed stream
(``mesh/relay/transport.py``) is another, so the same handshake and secure channel run end to end
over either. The contract, including errors: a closed transport raises
``trio_websocket.ConnectionClosed`` (reason code 1009 when a message is over the limit) from
``get_message``/``send_message``; ``_max_message_size`` is the largest message accepted from now on
(``websocket.set_message_limit`` lowers it during the handshake).
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["MessageTransport"]


class MessageTransport(Protocol):
    _max_message_size: int

    async def send_message(self, message: bytes) -> None: ...
    async def get_message(self) -> bytes | str: ...
    async def aclose(self) -> None: ...
