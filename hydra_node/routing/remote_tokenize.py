"""Remote tokenizer ops over mesh links, both ways: ``tokenize`` streams (protocol/README.md section 11.3).

* Requester: :meth:`RemoteTokenizer.tokenize_remote` runs a :class:`TokenizeRequest` on a peer
  that hosts the model (the router's remote targets carry it as their ``tokenize``).
* Host: :meth:`RemoteTokenizer.serve` answers a peer's ``tokenize`` stream with the local runner
  (``local_tokenize(model_id)``); the root declares it: ``mesh.handle_stream("tokenize", ...)``.

As ``embed`` (routing/remote_embed.py): the OPEN header is only ``{"kind": "tokenize"}``; the
requester sends one frame ``{"op": "tokenize", "req": TokenizeRequest}`` (at most
MAX_TOKENIZE_REQUEST_BYTES) and keeps its side open until the reply has ended (a reset cancels);
the host answers one frame, ``{"op": "tokenized", "tokens", "pieces", "content", "served_by"}``
(at most MAX_TOKENIZE_REPLY_BYTES) or one ``error``, and half-closes. Every byte from the peer
goes through the strict decoders: a bad frame or a malformed reply is a 502, the peer's error a
502 or 503 (it said 429/503) with its message, as for ``generate``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any


from hydra_node.codec.errors import DecodeError, EncodeError
from hydra_node.codec.framing import MessageDecoder, encode_message
from hydra_node.inference import (
    GenerationError,
    InvalidRequest,
    MalformedRemoteEvent,
    ModelUnavailable,
    TokenizeRequest,
    TokenizeResult,
    remote_error_from_wire,
)
from hydra_node.mesh.link.peer_link import PeerLink
from hydra_node.mesh.link.stream import LinkStream
from hydra_node.mesh.wire.errors import LinkClosed, MeshError, StreamReset
from hydra_node.routing.serving import serve_while_requester_stays
from hydra_node.routing.remote_embed import drain_reply, read_request, send_error

__all__ = [
    "MAX_TOKENIZE_REPLY_BYTES",
    "MAX_TOKENIZE_REQUEST_BYTES",
    "TOKENIZE_KIND",
    "LocalTokenize",
    "RemoteTokenizer",
    "reply_from_frame",
]

log = logging.getLogger("hydra.routing.tokenize")

TOKENIZE_KIND = "tokenize"
#: Largest request frame (the API's 8 MiB JSON body is no larger as CBOR): as ``embed``'s.
MAX_TOKENIZE_REQUEST_BYTES = 12 * 1024 * 1024
#: Largest reply frame: a runner-channel frame (16 MiB) and a margin for the host's ``served_by``.
MAX_TOKENIZE_REPLY_BYTES = 16 * 1024 * 1024 + 4096

Tokenize = Callable[[TokenizeRequest], Awaitable[TokenizeResult]]
#: ``local_tokenize(model_id)``: how to tokenize with a model this node hosts, None if it hosts none.
LocalTokenize = Callable[[str], "Tokenize | None"]


def reply_from_frame(msg: dict[str, Any]) -> TokenizeResult:
    """A host's reply message, strictly: its result, or its error raised (a RemoteError: 502/503);
    anything else is a :class:`MalformedRemoteEvent` (502)."""
    op = msg.get("op")
    if op == "error":
        raise remote_error_from_wire(msg)
    if op != "tokenized":
        raise MalformedRemoteEvent(f"unexpected {op!r:.40} on a tokenize stream")
    return TokenizeResult.from_wire(msg)


class RemoteTokenizer:
    def __init__(self, mesh, *, node_id: str, local_tokenize: LocalTokenize) -> None:
        """``mesh``: what :class:`~hydra_node.routing.remote.MeshMembers` offers (``link_to``)."""
        self._mesh = mesh
        self.node_id = node_id
        self._local_tokenize = local_tokenize
        self.opened = self.served = self.errors = self.bad_requests = 0

    # ---- requester ----------------------------------------------------------------------
    async def tokenize_remote(self, peer_id: str, req: TokenizeRequest) -> TokenizeResult:
        try:
            frame = encode_message({"op": "tokenize", "req": req.to_wire()}, limit=MAX_TOKENIZE_REQUEST_BYTES)
        except EncodeError as exc:
            raise GenerationError(
                f"the tokenize request is too large to forward: {exc}", code="request_too_large", status=413
            ) from None
        try:
            link = await self._mesh.link_to(peer_id)
        except MeshError as exc:
            raise ModelUnavailable(f"peer {peer_id[:16]} is unreachable: {exc}") from None
        self.opened += 1
        result: TokenizeResult | None = None
        try:
            async with link.open_stream({"kind": TOKENIZE_KIND}) as stream:
                await stream.send(frame)  # our side stays open until the reply ends: a reset cancels
                decoder = MessageDecoder(MAX_TOKENIZE_REPLY_BYTES)
                while True:
                    data = await stream.receive()
                    if not data:
                        raise GenerationError(
                            f"peer {peer_id[:16]} ended the tokenize stream early",
                            code="peer_lost",
                            status=502,
                            retryable=True,
                        )
                    decoder.receive_data(data)
                    try:
                        msg = decoder.next_message()
                    except DecodeError as exc:
                        raise MalformedRemoteEvent(f"bad frame ({exc.code}): {exc}", code="bad_frame") from None
                    if msg is not None:
                        result = reply_from_frame(msg)
                        await drain_reply(stream)
                        return result
        except MeshError as exc:  # reset, link closed, too many streams
            if result is not None:
                return result  # complete: a late close is no failure
            self.errors += 1
            raise GenerationError(
                f"peer {peer_id[:16]} lost: {exc}", code="peer_lost", status=502, retryable=True
            ) from None
        except GenerationError:
            self.errors += 1
            raise

    # ---- host -----------------------------------------------------------------------------
    async def serve(self, link: PeerLink, header: Mapping[str, Any], stream: LinkStream) -> None:
        """Answer a peer's ``tokenize`` stream with the local runner (errors go back as an error message)."""
        try:
            req = await self._read_request(stream)
        except (StreamReset, LinkClosed):
            return
        except InvalidRequest as exc:
            self.bad_requests += 1
            await self._send_error(
                stream, GenerationError(f"invalid tokenize request: {exc.message}", code="invalid_request", status=400)
            )
            return
        if req is None:
            return
        tokenize = self._local_tokenize(req.model)
        if tokenize is None:
            await self._send_error(stream, ModelUnavailable(f"peer {self.node_id[:16]} does not host {req.model!r}"))
            return
        self.served += 1

        async def answer() -> None:
            try:
                result = await tokenize(req)
                reply = {"op": "tokenized", **result.to_wire()}
                await stream.send(encode_message(reply, limit=MAX_TOKENIZE_REPLY_BYTES))
                await stream.send_eof()
            except GenerationError as exc:
                await self._send_error(stream, exc)

        if await serve_while_requester_stays(stream, answer):
            log.info("event=remote_tokenize_cancelled peer=%s model=%s", link.peer_id[:16], req.model)

    async def _read_request(self, stream: LinkStream) -> TokenizeRequest | None:
        """The request frame; InvalidRequest for a malformed one; None when the peer sent none in time."""
        wire = await read_request(stream, "tokenize", MAX_TOKENIZE_REQUEST_BYTES)
        return None if wire is None else TokenizeRequest.from_wire(wire)

    async def _send_error(self, stream: LinkStream, err: GenerationError) -> None:
        await send_error(stream, err, MAX_TOKENIZE_REPLY_BYTES)
