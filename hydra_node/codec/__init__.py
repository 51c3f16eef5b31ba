"""The one strict codec: every byte that comes from a peer or a child is decoded here.

* :mod:`.cbor` — canonical CBOR of a restricted data model (no tags, depth and size
  limits, canonical form enforced): ``encode``, ``decode``.
* :mod:`.framing` — length-prefixed frames of CBOR maps with an ``op``:
  ``encode_message``, ``MessageDecoder``.
* :mod:`.jsonline` — one JSON object per line (children's readiness lines):
  ``decode_object_line``.
* :mod:`.errors` — ``DecodeError`` (the sender's fault, with a stable ``code``),
  ``FrameError``, ``EncodeError`` (our bug).

Pure and sans-IO: no trio, no sockets, no clock. The wire rules are written in
``protocol/README.md`` section 2 and pinned by ``protocol/vectors/cbor.json``.
"""

from __future__ import annotations

from hydra_node.codec import cbor
from hydra_node.codec.errors import CodecError, DecodeError, EncodeError, FrameError
from hydra_node.codec.framing import MessageDecoder, encode_message
from hydra_node.codec.jsonline import decode_object_line

__all__ = [
    "CodecError",
    "DecodeError",
    "EncodeError",
    "FrameError",
    "MessageDecoder",
    "cbor",
    "decode_object_line",
    "encode_message",
]
