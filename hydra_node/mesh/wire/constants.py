"""Protocol constants and named bounds of the mesh wire protocol (see protocol/README.md)."""

from __future__ import annotations

PROTOCOL_GENERATION = 1
"""Carried in handshake messages and signed envelopes; peers of another generation are refused."""

MAX_LINK_FRAME_BYTES = 8 * 1024 * 1024
"""Largest websocket message (one frame) on a link, ciphertext and counter included."""

FRAME_OVERHEAD_BYTES = 8 + 16
"""Counter (u64) plus Poly1305 tag around each encrypted frame."""

MAX_PLAINTEXT_BYTES = MAX_LINK_FRAME_BYTES - FRAME_OVERHEAD_BYTES

MAX_HANDSHAKE_MESSAGE_BYTES = 16 * 1024
"""Handshake messages are small; an invite token is at most MAX_TOKEN_CHARS."""

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""Largest priority-lane message body (a full gossip frame of a big mesh fits)."""

MAX_OPEN_HEADER_BYTES = 16 * 1024
"""Largest CBOR header of a stream OPEN frame."""

STREAM_WINDOW_BYTES = 256 * 1024
"""Credit each side grants per stream; the receiver's buffer per stream never exceeds it, unless the
receiver widens that stream's window (up to BULK_WINDOW_BYTES)."""

BULK_WINDOW_BYTES = 4 * 1024 * 1024
"""Receive window a side may grant (with WINDOW) to a stream it reads as fast as data comes, such as
a model or artifact download it asked for: with 256 KiB a loopback model fetch ran at 94 MB/s, with
4 MiB at 167 MB/s (bench/model_fetch.py)."""

DATA_CHUNK_BYTES = 64 * 1024
"""Largest DATA frame payload; streams take turns one chunk at a time."""

MAX_STREAMS_PER_LINK = 256
"""Concurrently open streams a peer may have opened towards us."""

MAX_PENDING_CONTROL_FRAMES = 256
"""Priority-lane frames (messages, opens, resets, window updates, pings) waiting to be sent."""

MAX_TOKEN_CHARS = 2048
MAX_INVITE_ADDRS = 16
MAX_ADDR_CHARS = 256
DEFAULT_INVITE_TTL_S = 24 * 60 * 60
