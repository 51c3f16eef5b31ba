"""Remote embeddings over mesh links, both ways: ``embed`` streams (protocol/README.md section 11.3).

* Requester: :meth:`RemoteEmbeddings.embed_remote` runs an :class:`EmbeddingRequest` on a peer that
  hosts the model (the router's remote targets carry it as their ``embed``).
* Host: :meth:`RemoteEmbeddings.serve` answers a peer's ``embed`` stream with the local runner
  (``local_embed(model_id)``); the root declares it: ``mesh.handle_stream("embed", embeddings.serve)``.

The OPEN header is only ``{"kind": "embed"}`` (a header is at most 16 KiB; a request may hold 2048
inputs): the requester sends one frame ``{"op": "embed", "req": EmbeddingRequest}`` (at most
MAX_EMBED_REQUEST_BYTES) and half-closes once the reply has ended; the host answers with the messages of
:mod:`hydra_node.inference.embeddings` (``vectors`` frames of at most 1 MiB, then ``embedded``, or
one ``error``) and half-closes. Every byte from the peer goes through the strict decoders there: a
bad frame or a malformed reply is a 502, the peer's error a 502 or 503 (429/503) with its message,
as for ``generate``. The requester resets the stream to cancel; the host then abandons the request.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from hydra_node.codec.errors import DecodeError, EncodeError
from hydra_node.codec.framing import MessageDecoder, encode_message
from hydra_node.inference import (
    MAX_EMBED_FRAME_BYTES,
    EmbeddingAssembler,
    EmbeddingRequest,
    EmbeddingResult,
    GenerationError,
    InvalidRequest,
    MalformedRemoteEvent,
    ModelUnavailable,
    error_message,
    reply_messages,
)
from hydra_node.mesh.link.peer_link import PeerLink
from hydra_node.mesh.link.stream import LinkStream
from hydra_node.mesh.wire.errors import LinkClosed, MeshError, StreamReset
from hydra_node.routing.serving import serve_while_requester_stays

__all__ = ["MAX_EMBED_REQUEST_BYTES", "LocalEmbed", "RemoteEmbeddings"]

log = logging.getLogger("hydra.routing.embed")

#: Largest request frame (the API's 8 MiB JSON body is smaller as CBOR; below the runner channel's 16 MiB).
MAX_EMBED_REQUEST_BYTES = 12 * 1024 * 1024
#: How long a host waits for the request frame after the stream opened.
REQUEST_READ_TIMEOUT_S = 30.0
#: Bound on closing a stream (reset, or reading the other side's end of stream).
STREAM_CLOSE_TIMEOUT_S = 2.0

Embed = Callable[[EmbeddingRequest], Awaitable[EmbeddingResult]]
#: ``local_embed(model_id)``: how to embed with a model this node hosts, None if it hosts none.
LocalEmbed = Callable[[str], "Embed | None"]


class RemoteEmbeddings:
    def __init__(self, mesh, *, node_id: str, local_embed: LocalEmbed) -> None:
        """``mesh``: what :class:`~hydra_node.routing.remote.MeshMembers` offers (``link_to``)."""
        self._mesh = mesh
        self.node_id = node_id
        self._local_embed = local_embed
        self.opened = self.served = self.errors = self.bad_requests = 0

    # ---- requester ----------------------------------------------------------------------
    async def embed_remote(self, peer_id: str, req: EmbeddingRequest) -> EmbeddingResult:
        try:
            frame = encode_message({"op": "embed", "req": req.to_wire()}, limit=MAX_EMBED_REQUEST_BYTES)
        except EncodeError as exc:
            raise GenerationError(
                f"the embedding request is too large to forward: {exc}", code="request_too_large", status=413
            ) from None
        try:
            link = await self._mesh.link_to(peer_id)
        except MeshError as exc:
            raise ModelUnavailable(f"peer {peer_id[:16]} is unreachable: {exc}") from None
        self.opened += 1
        started = False
        result: EmbeddingResult | None = None
        try:
            async with link.open_stream({"kind": "embed"}) as stream:
                await stream.send(frame)  # our side stays open until the reply ends: a reset cancels
                decoder = MessageDecoder(MAX_EMBED_FRAME_BYTES)
                reply = EmbeddingAssembler(len(req.inputs))
                while True:
                    data = await stream.receive()
                    if not data:
                        raise GenerationError(
                            f"peer {peer_id[:16]} ended the embed stream early",
                            code="peer_lost",
                            status=502,
                            retryable=not started,
                        )
                    decoder.receive_data(data)
                    while True:
                        try:
                            msg = decoder.next_message()
                        except DecodeError as exc:
                            raise MalformedRemoteEvent(f"bad frame ({exc.code}): {exc}", code="bad_frame") from None
                        if msg is None:
                            break
                        started = True
                        result = reply.feed(msg)  # RemoteError for the peer's error or anything malformed
                        if result is not None:
                            await drain_reply(stream)
                            return result
        except MeshError as exc:  # reset, link closed, too many streams
            if result is not None:
                return result  # complete: a late close (the host's reset as it finished) is no failure
            self.errors += 1
            raise GenerationError(
                f"peer {peer_id[:16]} lost: {exc}", code="peer_lost", status=502, retryable=not started
            ) from None
        except GenerationError:
            self.errors += 1
            raise

    # ---- host -----------------------------------------------------------------------------
    async def serve(self, link: PeerLink, header: Mapping[str, Any], stream: LinkStream) -> None:
        """Answer a peer's ``embed`` stream with the local runner (errors go back as an error message)."""
        try:
            req = await self._read_request(stream)
        except (StreamReset, LinkClosed):
            return
        except InvalidRequest as exc:
            self.bad_requests += 1
            await self._send_error(
                stream, GenerationError(f"invalid embedding request: {exc.message}", code="invalid_request", status=400)
            )
            return
        if req is None:
            return
        embed = self._local_embed(req.model)
        if embed is None:
            await self._send_error(stream, ModelUnavailable(f"peer {self.node_id[:16]} does not host {req.model!r}"))
            return
        self.served += 1

        async def answer() -> None:
            try:
                result = await embed(req)
                for msg in reply_messages(result):
                    await stream.send(encode_message(msg, limit=MAX_EMBED_FRAME_BYTES))
                await stream.send_eof()
            except GenerationError as exc:
                await self._send_error(stream, exc)

        if await serve_while_requester_stays(stream, answer):
            log.info("event=remote_embedding_cancelled peer=%s model=%s", link.peer_id[:16], req.model)

    async def _read_request(self, stream: LinkStream) -> EmbeddingRequest | None:
        """The request frame; InvalidRequest for a malformed one; None when the peer sent none in time."""
        wire = await read_request(stream, "embed", MAX_EMBED_REQUEST_BYTES)
        return None if wire is None else EmbeddingRequest.from_wire(wire)

    async def _send_error(self, stream: LinkStream, err: GenerationError) -> None:
        await send_error(stream, err, MAX_EMBED_FRAME_BYTES)


async def read_request(stream: LinkStream, op: str, limit: int) -> Any:
    """A side stream's one request frame (``{"op": op, "req": ...}``, at most ``limit`` bytes): its
    ``req``, unchecked; InvalidRequest for a malformed frame; None (the stream reset) when the peer
    sent none within REQUEST_READ_TIMEOUT_S."""
    decoder = MessageDecoder(limit)
    with trio.move_on_after(REQUEST_READ_TIMEOUT_S):
        while True:
            data = await stream.receive()
            if not data:
                raise InvalidRequest(f"the {op} stream ended before its request")
            decoder.receive_data(data)
            try:
                msg = decoder.next_message()
            except DecodeError as exc:
                raise InvalidRequest(f"bad request frame ({exc.code}): {exc}") from None
            if msg is not None:
                if msg["op"] != op:
                    raise InvalidRequest(f"unexpected {msg['op']!r:.40} on the {op} stream")
                return msg.get("req")
    await stream.reset("timeout", f"no {op} request")
    return None


async def send_error(stream: LinkStream, err: GenerationError, limit: int) -> None:
    """``err`` as a side stream's last frame (a stream the requester already reset: nothing)."""
    try:
        await stream.send(encode_message(error_message(err), limit=limit))
        await stream.send_eof()
    except (StreamReset, LinkClosed):
        pass


async def drain_reply(stream: LinkStream) -> None:
    """Read the host's end of stream after a complete reply, for a clean close (bounded); a reset or a
    closed link now changes nothing: the answer is complete."""
    with trio.CancelScope(shield=True), trio.move_on_after(STREAM_CLOSE_TIMEOUT_S):
        try:
            while await stream.receive():
                pass
        except (StreamReset, LinkClosed):
            pass
