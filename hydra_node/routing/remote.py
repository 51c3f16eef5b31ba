"""Remote generation over mesh links, both ways: ``generate`` streams.

* Requester: :meth:`RemoteGeneration.targets` lists what members announce as router targets, and
  :meth:`RemoteGeneration.open_remote` runs a request on a peer — events stream back; leaving
  early resets the stream (cancelling it there).
* Host: :meth:`RemoteGeneration.serve` answers a peer's ``generate`` stream with a local runner
  (``local_open(model_id)``). The root declares it: ``mesh.handle_stream("generate", remote.serve)``.

Every byte from the peer goes through the strict decoders in :mod:`hydra_node.inference`
(:class:`EventStreamDecoder`): a malformed frame or event becomes a typed remote error (502), never
a relayed success.

A request whose header ``{"kind": "generate", "req": ...}`` would pass MAX_OPEN_HEADER_BYTES (16 KiB:
an agent's system prompt and tools, a continuation of a long answer) travels as a body instead
(protocol/README.md section 11.3): the header is ``{"kind": "generate", "body": N}`` and the first N
bytes of the stream's data are the request's canonical CBOR (at most MAX_GENERATE_BODY_BYTES). The host
reads them, with a deadline and a bound on the bodies it reads at once, before it answers. A node
older than the body form answers it with an ``invalid_request`` error (no ``req``): the requester
reports that as a 502 ``peer_too_old``, tried once more on another host — never a success, never the
client's 400.

A chat's images (``images``: :class:`~hydra_node.inference.images.ImageBlob` maps) travel once per
peer (routing/image_cache.py): the requester leaves out the bytes of an image it sent that peer
recently; the host fills them from its :class:`ImageCache`, or answers 409 ``images_missing``
(retryable) before anything runs, and the requester sends the request once more with every image's
bytes, on a new stream, before the caller sees any event.
"""

from __future__ import annotations

import dataclasses
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol

import trio

from hydra_node.inference import (
    EmbeddingRequest,
    EmbeddingResult,
    EventStreamDecoder,
    GenerationError,
    GenerationEvent,
    GenerationRequest,
    InvalidRequest,
    ModelUnavailable,
    TokenizeRequest,
    TokenizeResult,
    event_frame,
)
from hydra_node.codec import cbor as codec_cbor
from hydra_node.codec.errors import DecodeError
from hydra_node.inference.errors import RemoteError
from hydra_node.inference.images import ImageBlob, ImageInput
from hydra_node.mesh.wire import cbor
from hydra_node.mesh.wire.constants import DATA_CHUNK_BYTES, MAX_OPEN_HEADER_BYTES
from hydra_node.mesh.wire.errors import LinkClosed, MeshError, StreamReset
from hydra_node.models import RESERVED_MODEL_IDS
from hydra_node.mesh.link.peer_link import PeerLink
from hydra_node.mesh.membership import Announcement
from hydra_node.mesh.link.stream import LinkStream
from hydra_node.routing.image_cache import ImageCache, ImageCacheStatistics, ImagesMissing, SentImages
from hydra_node.routing.target import OpenGeneration, RouteTarget, TargetState
from hydra_node.routing.serving import serve_while_requester_stays
from hydra_node.routing.target_wait import MeshView
from hydra_node.runtime.hosting.caps_wire import PeerCaps, parse_caps_extra

__all__ = [
    "MAX_GENERATE_BODY_BYTES",
    "MAX_BODY_BYTES_READING",
    "IMAGES_MISSING",
    "images_missing_error",
    "REQUEST_BODY_TIMEOUT_S",
    "LocalOpen",
    "MeshMembers",
    "RemoteGeneration",
    "RemoteGenerationStatistics",
    "body_length",
    "generate_header",
    "request_from_body",
]

log = logging.getLogger("hydra.routing.remote")

#: Bound on closing a generation stream (reset, or reading the host's final end of stream).
STREAM_CLOSE_TIMEOUT_S = 2.0
#: RTT assumed for a peer we have no open link to (so it ranks behind measured ones).
UNLINKED_RTT_MS = 1000.0
#: Largest request body of a ``generate`` stream (the request's CBOR when it does not fit the header):
#: a chat's images (at most MAX_REQUEST_IMAGE_BYTES, 12 MiB) with the rest of the request; 64 KiB
#: under the 16 MiB frame of the host's runner channel (runtime/child/channel.py), so the frame that
#: hands the runner an accepted request (the request and a few keys) always fits it.
MAX_GENERATE_BODY_BYTES = 16 * 1024 * 1024 - 64 * 1024
#: How long a host waits for all of a request body after the stream opened (then: 408 request_timeout).
REQUEST_BODY_TIMEOUT_S = 30.0
#: Request body bytes a host reads at once, over all its generate streams (a member could otherwise
#: open MAX_STREAMS_PER_LINK streams announcing 16 MiB each): past it, 503 ``busy``, retryable. Four
#: requests with their full images at once (about 64 MiB of buffers), the image cache apart.
MAX_BODY_BYTES_READING = 4 * MAX_GENERATE_BODY_BYTES
#: The host's answer to elided images it does not hold (the requester sends them again, once).
IMAGES_MISSING = "images_missing"


#: Bytes ``{"kind": "generate", "req": R}`` takes besides R's own encoding.
_GENERATE_HEADER_OVERHEAD = len(cbor.encode({"kind": "generate", "req": None})) - len(cbor.encode(None))


def generate_header(req: GenerationRequest) -> tuple[dict[str, Any], bytes | None]:
    """The OPEN header for ``req`` and the body to send after it: ``({"kind": "generate", "req": ...},
    None)`` when that header fits MAX_OPEN_HEADER_BYTES (as every node has always sent it), else
    ``({"kind": "generate", "body": N}, the request's N bytes of CBOR)``. A request past
    MAX_GENERATE_BODY_BYTES is a GenerationError 413 ``request_too_large``."""
    wire = req.to_wire()
    body = cbor.encode(wire)  # encoded once: the header is this plus a fixed overhead
    if len(body) + _GENERATE_HEADER_OVERHEAD <= MAX_OPEN_HEADER_BYTES:
        return {"kind": "generate", "req": wire}, None
    if len(body) > MAX_GENERATE_BODY_BYTES:
        raise GenerationError(
            f"the request is too large to forward to a peer ({len(body)} bytes of at most {MAX_GENERATE_BODY_BYTES})",
            code="request_too_large",
            status=413,
        )
    return {"kind": "generate", "body": len(body)}, body


def body_length(header: Mapping[str, Any]) -> int | None:
    """N of a ``{"kind": "generate", "body": N}`` header; None for one that carries ``req``;
    InvalidRequest for a header with both, or an N that is not an integer 1 … MAX_GENERATE_BODY_BYTES."""
    if "body" not in header:
        return None
    n = header["body"]
    if "req" in header:
        raise InvalidRequest("a generate header carries 'req' or 'body', not both", "body")
    if type(n) is not int or not 1 <= n <= MAX_GENERATE_BODY_BYTES:
        raise InvalidRequest(f"'body' must be a byte count from 1 to {MAX_GENERATE_BODY_BYTES}, not {n!r:.40}", "body")
    return n


def request_from_body(data: bytes, length: int) -> GenerationRequest:
    """The request in a body that must be exactly ``length`` bytes of canonical CBOR (the strict
    decoder and :meth:`GenerationRequest.from_wire`); InvalidRequest for anything else."""
    if len(data) != length:
        raise InvalidRequest(f"the request body is {len(data)} bytes, its header announced {length}", "body")
    try:
        wire = codec_cbor.decode(data, max_size=MAX_GENERATE_BODY_BYTES)
    except DecodeError as exc:
        raise InvalidRequest(f"the request body is not canonical CBOR ({exc.code}): {exc.message}", "body") from None
    return GenerationRequest.from_wire(wire)


#: ``local_open(model_id)``: how to run a generation on a model this node hosts, None if it hosts none.
LocalOpen = Callable[[str], "OpenGeneration | None"]
#: ``embed_remote(peer_id, req)``: embed on a peer (``RemoteEmbeddings.embed_remote``, remote_embed.py).
EmbedRemote = Callable[[str, EmbeddingRequest], Awaitable[EmbeddingResult]]
#: ``tokenize_remote(peer_id, req)``: tokenize on a peer (``RemoteTokenizer.tokenize_remote``, remote_tokenize.py).
TokenizeRemote = Callable[[str, TokenizeRequest], Awaitable[TokenizeResult]]


class MeshMembers(Protocol):
    """What remote generation needs of the mesh service."""

    async def link_to(self, peer_id: str) -> PeerLink: ...
    def link(self, peer_id: str) -> PeerLink | None: ...
    def members(self) -> Mapping[str, Announcement]: ...
    def member_states(self, now: float) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class RemoteGenerationStatistics:
    opened: int
    served: int
    errors: int
    bad_requests: int
    reserved_models_ignored: int = 0
    #: requester: images sent with their bytes, sent without them (the peer held them), the image
    #: bytes sent, and the requests sent again with every image's bytes after ``images_missing``
    images_sent: int = 0
    images_elided: int = 0
    image_bytes_sent: int = 0
    images_missing_retries: int = 0
    #: host: its image cache (routing/image_cache.py) and the ``images_missing`` answers it gave
    image_cache: ImageCacheStatistics = ImageCacheStatistics(0, 0, 0, 0, 0, 0)
    images_missing_answers: int = 0

    def counters(self) -> dict[str, int]:
        """The names ``/api/status`` shows under ``mesh.counters`` (the first five since always)."""
        cache = self.image_cache
        return {
            "remote_generations_served": self.served,
            "remote_generations_opened": self.opened,
            "remote_generation_errors": self.errors,
            "bad_generate_requests": self.bad_requests,
            "reserved_models_ignored": self.reserved_models_ignored,
            "images_sent": self.images_sent,
            "images_elided": self.images_elided,
            "image_bytes_sent": self.image_bytes_sent,
            "images_missing_retries": self.images_missing_retries,
            "images_missing_answers": self.images_missing_answers,
            "image_cache_entries": cache.entries,
            "image_cache_bytes": cache.bytes,
            "image_cache_stored": cache.stored,
            "image_cache_filled": cache.filled,
            "image_cache_evicted": cache.evicted,
        }


class RemoteGeneration:
    """A router target source for members' models, and the host side of their requests to us."""

    def __init__(
        self,
        mesh: MeshMembers,
        *,
        node_id: str,
        local_open: LocalOpen,
        embed_remote: EmbedRemote | None = None,
        tokenize_remote: TokenizeRemote | None = None,
        body_timeout_s: float = REQUEST_BODY_TIMEOUT_S,
        body_bytes_reading: int = MAX_BODY_BYTES_READING,
        image_cache: ImageCache | None = None,
        sent_images: SentImages | None = None,
    ) -> None:
        """``embed_remote(peer_id, EmbeddingRequest)``: the ``embed`` of our remote targets (remote_embed.py);
        ``tokenize_remote(peer_id, TokenizeRequest)``: the ``tokenize`` of our remote targets (remote_tokenize.py);
        ``body_timeout_s``: how long a host waits for a request body (REQUEST_BODY_TIMEOUT_S);
        ``body_bytes_reading``: the body bytes it reads at once over all streams (MAX_BODY_BYTES_READING);
        ``image_cache``: the host's images by requester (IMAGE_CACHE_BYTES; ``ImageCache(0)``: none kept);
        ``sent_images``: which images the requester sent each peer (``SentImages(0)``: always send the bytes)."""
        self._mesh = mesh
        self._images = image_cache if image_cache is not None else ImageCache()
        self._sent = sent_images if sent_images is not None else SentImages()
        self._images_sent = self._images_elided = self._image_bytes_sent = 0
        self._missing_retries = self._missing_answers = 0
        self._body_timeout_s = body_timeout_s
        self._body_budget = body_bytes_reading
        self._body_reading = 0  # bytes announced by the bodies being read now
        self.node_id = node_id
        self._local_open = local_open
        self._embed_remote = embed_remote
        self._tokenize_remote = tokenize_remote
        #: announced ``model_caps`` entries dropped as malformed (``/api/status`` routing, runtime/hosting/caps_wire.py)
        self.malformed_caps = 0
        #: peer -> (the announcement's version, its parsed caps): parsed (and malformed entries
        #: counted) once per announcement, not at every listing
        self._caps_seen: dict[str, tuple[tuple[int, int], PeerCaps]] = {}
        self._opened = self._served = self._errors = self._bad_requests = 0
        self._reserved_seen: dict[str, tuple[int, int]] = {}  # peer -> announcement that named a reserved id
        self._reserved_ignored = 0

    def statistics(self) -> RemoteGenerationStatistics:
        return RemoteGenerationStatistics(
            self._opened,
            self._served,
            self._errors,
            self._bad_requests,
            self._reserved_ignored,
            images_sent=self._images_sent,
            images_elided=self._images_elided,
            image_bytes_sent=self._image_bytes_sent,
            images_missing_retries=self._missing_retries,
            image_cache=self._images.statistics(),
            images_missing_answers=self._missing_answers,
        )

    def _ignore_reserved(self, peer_id: str, ann: Announcement, model: str) -> None:
        """A peer announcing ``mesh`` (or another reserved id) would take the API's own name: never
        routed to; logged and counted once per announcement."""
        if self._reserved_seen.get(peer_id) == ann.version_key():
            return
        self._reserved_seen[peer_id] = ann.version_key()
        self._reserved_ignored += 1
        log.warning("event=reserved_model_ignored peer=%s model=%r", peer_id[:16], model)

    # ---- requester ----------------------------------------------------------------------
    def mesh_view(self) -> MeshView:
        """The alive members' announcement extras (their re-host claims and wishes: routing/target_wait.py)
        and the peers that left cleanly."""
        states = self._mesh.member_states(trio.current_time())
        extras = tuple(ann.extra for pid, ann in self._mesh.members().items() if states.get(pid) == "alive")
        return MeshView(extras, frozenset(pid for pid, st in states.items() if st == "left"))

    def targets(self) -> list[RouteTarget]:
        states = self._mesh.member_states(trio.current_time())
        out: list[RouteTarget] = []
        members = self._mesh.members()
        for gone in [p for p in self._reserved_seen if p not in members]:
            del self._reserved_seen[gone]
        for gone in [p for p in self._caps_seen if p not in members]:
            del self._caps_seen[gone]
        for gone in [p for p in self._sent.known_peers() if p not in members]:
            self._sent.forget(gone)  # a peer that comes back has a new process: an empty cache
        for peer_id, ann in members.items():
            if ann.role == "client":
                continue
            link = self._mesh.link(peer_id)
            rtt = link.rtt_ms if link is not None and link.rtt_ms is not None else UNLINKED_RTT_MS
            seen = self._caps_seen.get(peer_id)
            if seen is not None and seen[0] == ann.version_key():
                caps = seen[1]
            else:
                caps = parse_caps_extra(ann.extra)
                self._caps_seen[peer_id] = (ann.version_key(), caps)
                self.malformed_caps += caps.malformed
            for m in ann.models:
                if m.id in RESERVED_MODEL_IDS:
                    self._ignore_reserved(peer_id, ann, m.id)
                    continue
                # a state this version does not know (a newer peer's) is listed, never routed to
                state = TargetState.of(m.state) if states.get(peer_id) == "alive" else TargetState.SUSPECT
                # capacity as announced: what it serves (its queue) plus what it could still start
                slots = max(1, ann.queue_depth + m.free_slots) if m.free_slots is not None else 1
                out.append(
                    RouteTarget(
                        model=m.id,
                        node_id=peer_id,
                        local=False,
                        open=partial(self.open_remote, peer_id),
                        queue_depth=ann.queue_depth,
                        rtt_ms=rtt,
                        state=state,
                        slots=slots,
                        free_slots=m.free_slots,
                        embed=None if self._embed_remote is None else partial(self._embed_remote, peer_id),
                        identity=m.ident,
                        linked=link is not None,
                        caps=caps.models.get(m.id),
                        # a peer that announces capabilities knows the tokenize stream (an older one neither)
                        tokenize=(
                            None
                            if self._tokenize_remote is None or m.id not in caps.models
                            else partial(self._tokenize_remote, peer_id)
                        ),
                    )
                )
        return out

    @asynccontextmanager
    async def open_remote(self, peer_id: str, req: GenerationRequest) -> AsyncIterator[AsyncIterator[GenerationEvent]]:
        """Run ``req`` on ``peer_id``: events stream back; leaving early resets the stream (cancels it there).
        A chat's images go without the bytes of those the peer was sent recently; when it no longer
        holds one (409 ``images_missing``), the request goes once more with every image's bytes."""
        elided = self._elided(peer_id, req)
        if elided is not req:
            _check_full_size(elided, req)  # the 413 of the full request, whatever the peer holds
        header, body = generate_header(elided)  # a body: a long prompt, images, a continuation
        try:
            link = await self._mesh.link_to(peer_id)
        except MeshError as exc:
            raise ModelUnavailable(f"peer {peer_id[:16]} is unreachable: {exc}") from None
        self._count_images(elided.images)
        if elided is not req:
            # the peer's first event says whether it held the images: read it before the caller does
            async with self._attempt(peer_id, link, elided, header, body) as events:
                try:
                    first = await events.__anext__()
                except RemoteError as exc:
                    if exc.code != IMAGES_MISSING:
                        raise
                    log.info("event=images_missing peer=%s %s", peer_id[:16], exc.message[:200])
                else:
                    self._sent.sent(peer_id, req.images)
                    yield _Pushed(first, events)
                    return
            self._sent.forget(peer_id, [im.sha256 for im in elided.images if isinstance(im, ImageBlob) and im.elided])
            self._missing_retries += 1
            elided = dataclasses.replace(req, images=SentImages.once(req.images))
            self._count_images(elided.images)
            header, body = generate_header(elided)
        async with self._attempt(peer_id, link, elided, header, body) as events:
            if not req.images:
                yield events
            else:
                yield _Pushed(None, events, lambda: self._sent.sent(peer_id, req.images))

    def _elided(self, peer_id: str, req: GenerationRequest) -> GenerationRequest:
        """``req`` as it goes to ``peer_id`` first: its images' bytes left out where the peer holds
        them (``req`` itself when no byte is left out)."""
        if not req.images or not req.images_resolved:
            return req  # (an unresolved image: to_wire refuses it)
        images = self._sent.elide(peer_id, req.images)
        if not any(im.elided for im in images):
            return req
        return dataclasses.replace(req, images=images)

    def _count_images(self, images: tuple[ImageBlob | ImageInput, ...]) -> None:
        for im in images:
            if im.data:
                self._images_sent += 1
                self._image_bytes_sent += len(im.data)
            else:
                self._images_elided += 1

    @asynccontextmanager
    async def _attempt(
        self, peer_id: str, link: PeerLink, req: GenerationRequest, header: dict[str, Any], body: bytes | None
    ) -> AsyncIterator[AsyncIterator[GenerationEvent]]:
        """One generate stream to ``peer_id`` for ``req`` (``header`` and ``body``: :func:`generate_header`'s)."""
        self._opened += 1
        finished = False
        try:
            async with link.open_stream(header) as stream:
                if body is not None:
                    try:
                        for at in range(0, len(body), DATA_CHUNK_BYTES):
                            await stream.send(body[at : at + DATA_CHUNK_BYTES])
                    except (StreamReset, LinkClosed):
                        pass  # a host that answered before reading it all (an older one): read below

                async def events() -> AsyncIterator[GenerationEvent]:
                    nonlocal finished
                    decoder = EventStreamDecoder()
                    started = False
                    while True:
                        try:
                            data = await stream.receive()
                        except (StreamReset, LinkClosed) as exc:
                            raise GenerationError(
                                f"peer {peer_id[:16]} lost: {exc}", code="peer_lost", status=502, retryable=not started
                            ) from None
                        if not data:
                            raise GenerationError(
                                f"peer {peer_id[:16]} ended the stream early",
                                code="peer_lost",
                                status=502,
                                retryable=not started,
                            )
                        decoder.receive_data(data)
                        while True:
                            try:
                                ev = decoder.next_event()  # RemoteError for anything bad
                            except RemoteError as exc:
                                if body is not None and not started and exc.code == "invalid_request":
                                    raise _too_old(peer_id, exc) from None
                                raise
                            if ev is None:
                                break
                            started = True
                            yield ev
                            if getattr(ev, "type", "") == "finished":
                                finished = True
                                return

                try:
                    yield events()
                except GenerationError:
                    self._errors += 1
                    raise
                finally:
                    with trio.CancelScope(shield=True), trio.move_on_after(STREAM_CLOSE_TIMEOUT_S):
                        if not finished:
                            await stream.reset("cancel", "requester gone")
                        else:  # read the host's end-of-stream so the stream closes cleanly
                            try:
                                while await stream.receive():
                                    pass
                            except (StreamReset, LinkClosed):
                                pass
        except (StreamReset, LinkClosed) as exc:
            if finished:
                return  # the answer is complete; a late close is not the client's problem
            self._errors += 1
            raise GenerationError(
                f"peer {peer_id[:16]} lost: {exc}", code="peer_lost", status=502, retryable=True
            ) from None

    # ---- host -----------------------------------------------------------------------------
    #: ``admission()``: why a new ``generate`` stream is refused before its first event (None:
    #: admitted) — a stopping node's 503 ``draining`` (:meth:`hydra_node.routing.handover.Handover.refusal`).
    admission: Callable[[], GenerationError | None] | None = None

    async def _read_request(self, header: Mapping[str, Any], stream: LinkStream) -> GenerationRequest:
        """The request: in the header, or the body it announces (read with a deadline: GenerationError
        408 ``request_timeout``; past the bytes read at once: 503 ``busy``); InvalidRequest for a
        malformed one, a short or an over-long body."""
        length = body_length(header)
        if length is None:
            return GenerationRequest.from_wire(header.get("req"))
        if self._body_reading + length > self._body_budget:
            raise GenerationError(
                f"peer {self.node_id[:16]} is reading {self._body_reading} bytes of request bodies already "
                f"(at most {self._body_budget}); try another host or later",
                code="busy",
                status=503,
                retryable=True,
            )
        data = bytearray()
        self._body_reading += length
        try:
            with trio.move_on_after(self._body_timeout_s):
                while len(data) < length:
                    chunk = await stream.receive()
                    if not chunk:
                        raise InvalidRequest(f"the stream ended after {len(data)} of the body's {length} bytes", "body")
                    data += chunk
                if len(data) > length:  # the requester sends nothing after its request
                    raise InvalidRequest(
                        f"the request body is longer than the {length} bytes its header announced", "body"
                    )
                return request_from_body(bytes(data), length)
        finally:
            self._body_reading -= length
        raise GenerationError(
            f"the request body did not arrive within {self._body_timeout_s:g} s ({len(data)} of {length} bytes)",
            code="request_timeout",
            status=408,
        )

    async def serve(self, link: PeerLink, header: Mapping[str, Any], stream: LinkStream) -> None:
        """Answer a peer's ``generate`` stream with a local runner (errors go back as an error event)."""

        async def send_error(err: GenerationError) -> None:
            await stream.send(event_frame(err))
            await stream.send_eof()

        try:  # a body is read here, before serve_while_requester_stays ignores the requester's data
            req = await self._read_request(header, stream)
        except (StreamReset, LinkClosed):
            return  # the requester left while sending its body
        except (InvalidRequest, GenerationError) as exc:  # malformed, short, over-long, stalled (408), busy (503)
            if not (isinstance(exc, GenerationError) and exc.code == "busy"):
                self._bad_requests += 1
            log.info("event=generate_request_refused peer=%s error=%s", link.peer_id[:16], exc)
            if not isinstance(exc, GenerationError):
                exc = GenerationError(f"invalid request: {exc.message}", code="invalid_request", status=400)
            try:
                await send_error(exc)
            except (StreamReset, LinkClosed):
                pass
            return
        if self.admission is not None and (refusal := self.admission()) is not None:  # stopping (handover.py)
            await send_error(refusal)
            return
        open_local = self._local_open(req.model)
        if open_local is None:
            await send_error(ModelUnavailable(f"peer {self.node_id[:16]} does not host {req.model!r}"))
            return
        if req.images:
            try:  # the images with bytes are kept; the elided ones filled from what this peer sent before
                req = dataclasses.replace(req, images=self._images.fill(link.peer_id, req.images))
            except ImagesMissing as missing:
                self._missing_answers += 1
                await send_error(images_missing_error(self.node_id, missing.missing))
                return
            except InvalidRequest as exc:  # filled, the request breaks a limit (12 MiB of images in all)
                self._bad_requests += 1
                log.info("event=generate_request_refused peer=%s error=%s", link.peer_id[:16], exc)
                await send_error(GenerationError(f"invalid request: {exc.message}", code="invalid_request", status=400))
                return
        self._served += 1

        async def answer() -> None:
            try:
                async with open_local(req) as events:
                    async for ev in events:
                        await stream.send(event_frame(ev))
                await stream.send_eof()
            except GenerationError as exc:
                try:
                    await send_error(exc)
                except (StreamReset, LinkClosed):
                    pass

        if await serve_while_requester_stays(stream, answer):
            log.info("event=remote_generation_cancelled peer=%s model=%s", link.peer_id[:16], req.model)


class _Pushed:
    """``events`` with ``first`` (already read) in front of them; ``on_first()`` once an event came."""

    def __init__(
        self,
        first: GenerationEvent | None,
        events: AsyncIterator[GenerationEvent],
        on_first: Callable[[], None] | None = None,
    ) -> None:
        self._first, self._events, self._on_first = first, events, on_first

    def __aiter__(self) -> "_Pushed":
        return self

    async def __anext__(self) -> GenerationEvent:
        if self._first is not None:
            ev, self._first = self._first, None
            return ev
        ev = await self._events.__anext__()
        if self._on_first is not None:
            on_first, self._on_first = self._on_first, None
            on_first()
        return ev


def _cbor_bytes_size(n: int) -> int:
    """Bytes a CBOR byte string of ``n`` bytes takes (its head and the bytes)."""
    return n + (1 if n < 24 else 2 if n < 1 << 8 else 3 if n < 1 << 16 else 5 if n < 1 << 32 else 9)


def _check_full_size(elided: GenerationRequest, full: GenerationRequest) -> None:
    """413 ``request_too_large`` when ``full`` with its images' bytes (as it goes after
    ``images_missing``) would pass MAX_GENERATE_BODY_BYTES: the answer must not depend on what
    the peer holds. The size is ``elided``'s plus each byte string put back (and its ``data`` key)."""
    size = len(cbor.encode(elided.to_wire()))
    for a, b in zip(elided.images, SentImages.once(full.images)):
        if not a.data and b.data:
            size += len(cbor.encode("data")) + _cbor_bytes_size(len(b.data))
    if size > MAX_GENERATE_BODY_BYTES:
        raise GenerationError(
            f"the request is too large to forward to a peer ({size} bytes of at most {MAX_GENERATE_BODY_BYTES})",
            code="request_too_large",
            status=413,
        )


def images_missing_error(node_id: str, missing: tuple[str, ...]) -> GenerationError:
    """A host's answer to elided images it does not hold: 409, retryable (the requester sends the
    request again with every image's bytes); the message names each missing SHA-256."""
    return GenerationError(
        f"peer {node_id[:16]} does not hold {len(missing)} of the request's images (sent without their bytes); "
        f"send them again with their bytes: sha256 {', '.join(missing)}",
        code=IMAGES_MISSING,
        status=409,
        retryable=True,
    )


def _too_old(peer_id: str, exc: RemoteError) -> GenerationError:
    """A host's ``invalid_request`` answer to a request sent as a body: a node older than the body form
    (it found no ``req``) — a 502 tried once more on another host, never the client's 400."""
    return GenerationError(
        f"peer {peer_id[:16]} refused a request larger than {MAX_OPEN_HEADER_BYTES} bytes (sent as a body; "
        f"a node older than the body form cannot take it — upgrade it): {exc.message}",
        code="peer_too_old",
        status=502,
        retryable=True,
    )
