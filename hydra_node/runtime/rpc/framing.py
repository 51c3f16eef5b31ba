"""Where a tunnel pump cuts a ggml RPC byte stream into link frames (sans-IO).

Every chunk a pump hands to its mesh stream costs a link frame: encryption, websocket
framing and a wake-up in two node processes, a few hundred microseconds in Python.
llama.cpp writes each request as three ``send()`` calls (command byte, size, payload),
and sends the requests that get no reply (``SET_TENSOR``, ``GRAPH_COMPUTE``, ...) without
waiting, so a pump that forwards every TCP read as it comes pays that cost several times
per request and up to a dozen times per decoded token.

:class:`RpcFramer` follows the framing (``_proto``: request ``| cmd u8 | size u64 | data |``,
response ``| size u64 | data |``) and tells the pump when to send:

* at the end of a request that expects a reply (its client now waits for it), and at the
  end of every response;
* whenever ``max_chunk`` bytes are waiting (a large tensor upload streams through);
* otherwise it holds the bytes: the rest of a message being written (the writer is in the
  middle of it; the worker could not act on a part anyway), or finished requests without
  a reply, which then cross the link together with the request that follows them.  The
  pump sends those finished requests anyway after :data:`HOLD_S` without new input
  (:meth:`RpcFramer.flush`), so a client that goes quiet after one is never left waiting
  on us, and part of a message after :data:`PARTIAL_HOLD_S`, so that even a stream the
  framer misreads only slows down.

Holding no-reply requests is invisible to the client: the worker executes requests in
order, and their effects are only observable through a later request's reply, which
always flushes what is held before it.  Bytes are never changed or reordered: the framer
only chooses the cuts.  An unknown command byte switches it to pass-through (every read is
sent as it comes), so a newer protocol degrades to the plain pump, never to a stall.
"""

from __future__ import annotations

from typing import Literal

#: Longest time finished no-reply requests wait for more input before the pump sends them.
HOLD_S = 0.002
#: Longest time part of a message waits for its rest (a writer finishes a message at once;
#: this only bounds the damage of a stream the framer misreads).
PARTIAL_HOLD_S = 0.02

# ggml RPC commands (``enum rpc_cmd``, protocol 7) the worker answers with no reply.
CMD_FREE_BUFFER = 4
CMD_BUFFER_CLEAR = 5
CMD_SET_TENSOR = 6
CMD_GRAPH_COMPUTE = 10
CMD_INIT_TENSOR = 12
CMD_GRAPH_RECOMPUTE = 16
CMD_MEMSET_TENSOR = 17
NO_REPLY_COMMANDS = frozenset(
    {
        CMD_FREE_BUFFER,
        CMD_BUFFER_CLEAR,
        CMD_SET_TENSOR,
        CMD_GRAPH_COMPUTE,
        CMD_INIT_TENSOR,
        CMD_GRAPH_RECOMPUTE,
        CMD_MEMSET_TENSOR,
    }
)
#: ``RPC_CMD_COUNT``: command bytes at or above it are unknown to us (pass-through).
CMD_COUNT = 19

Direction = Literal["request", "response"]


class RpcFramer:
    """Decide the cuts in one direction of a ggml RPC connection.

    ``feed(data)`` returns the bytes to send now (possibly ``b""``); ``held`` is the number
    of bytes kept back; ``flush()`` returns them (the pump calls it when the hold times
    out or the connection ends).
    """

    def __init__(self, direction: Direction, max_chunk: int) -> None:
        if direction not in ("request", "response") or max_chunk < 1:
            raise ValueError("direction must be 'request' or 'response' and max_chunk >= 1")
        self.direction = direction
        self.max_chunk = max_chunk
        self.passthrough = False
        self._buf = bytearray()
        self._ready = 0  # bytes at the start of _buf that may be sent now
        self._header = bytearray()  # bytes of the current message's header read so far
        self._header_len = 9 if direction == "request" else 8
        self._remaining = 0  # payload bytes of the current message still to come
        self._in_payload = False
        self._cmd: int | None = None

    @property
    def held(self) -> int:
        return len(self._buf)

    @property
    def between_messages(self) -> bool:
        """True when the held bytes are whole messages (no message is half read)."""
        return not self._in_payload and not self._header

    @property
    def wanted(self) -> int:
        """Bytes that would complete the header or payload being read (at least 1).

        The pump sets it as the socket's receive low-water mark: the kernel then wakes the
        pump once per message part instead of once per ``send()`` of the writer.
        """
        if self.passthrough:
            return 1
        if self._in_payload:
            return max(1, min(self._remaining, self.max_chunk - len(self._buf)))
        return self._header_len - len(self._header)

    def flush(self) -> bytes:
        out = bytes(self._buf)
        self._buf.clear()
        self._ready = 0
        return out

    def feed(self, data: bytes) -> bytes:
        if self.passthrough:
            return self.flush() + bytes(data)
        view = memoryview(data)
        while True:
            if not self._in_payload:
                if not view:
                    break
                take = min(len(view), self._header_len - len(self._header))
                self._header += view[:take]
                self._buf += view[:take]
                view = view[take:]
                if len(self._header) < self._header_len:
                    break
                if not self._start_message():
                    return self.flush() + bytes(view)
            take = min(len(view), self._remaining)
            self._buf += view[:take]
            view = view[take:]
            self._remaining -= take
            if self._remaining == 0:
                self._end_message()
                continue
            break  # input used up in the middle of a payload
        if len(self._buf) >= self.max_chunk:
            return self.flush()
        if not self._ready:
            return b""
        out = bytes(self._buf[: self._ready])
        del self._buf[: self._ready]
        self._ready = 0
        return out

    def _start_message(self) -> bool:
        """A header is complete; False (and pass-through from now on) if it is not ggml RPC."""
        if self.direction == "request":
            self._cmd = self._header[0]
            if self._cmd >= CMD_COUNT:
                self.passthrough = True
                return False
            size_bytes = self._header[1:]
        else:
            self._cmd = None
            size_bytes = self._header
        self._remaining = int.from_bytes(size_bytes, "little")
        self._in_payload = True
        return True

    def _end_message(self) -> None:
        self._header.clear()
        self._in_payload = False
        if self._cmd not in NO_REPLY_COMMANDS:  # a reply is awaited, or this is a reply
            self._ready = len(self._buf)
