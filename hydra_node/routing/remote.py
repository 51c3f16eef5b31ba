"""Remote generation over mesh links, both ways: ``generate`` streams.

* Requester: :meth:`RemoteGeneration.targets` lists what members announce as router targets, and
  :meth:`RemoteGeneration.open_remote` runs a request on a peer — events stream back; leaving
  early resets the stream (cancelling it there).
* Host: :meth:`RemoteGeneration.serve` answers a peer's ``generate`` stream with a local runner
  (``local_open(model_id)``). The root declares it: ``mesh.handle_stream("generate", remote.serve)``.

Every byte from the peer goes through the strict decoders in :mod:`hydra_node.inference`
(:class:`EventStreamDecoder`): a malformed frame or event becomes a typed remote error (502), never
a relayed success.
"""

from __future__ import annotations

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
    event_frame,
)
from hydra_node.mesh.wire import cbor
from hydra_node.mesh.wire.constants import MAX_OPEN_HEADER_BYTES
from hydra_node.mesh.wire.errors import LinkClosed, MeshError, StreamReset
from hydra_node.models import RESERVED_MODEL_IDS
from hydra_node.mesh.link.peer_link import PeerLink
from hydra_node.mesh.membership import Announcement
from hydra_node.mesh.link.stream import LinkStream
from hydra_node.routing.target import OpenGeneration, RouteTarget, TargetState
from hydra_node.routing.serving import serve_while_requester_stays

__all__ = ["LocalOpen", "MeshMembers", "RemoteGeneration", "RemoteGenerationStatistics"]

log = logging.getLogger("hydra.routing.remote")

#: Bound on closing a generation stream (reset, or reading the host's final end of stream).
STREAM_CLOSE_TIMEOUT_S = 2.0
#: RTT assumed for a peer we have no open link to (so it ranks behind measured ones).
UNLINKED_RTT_MS = 1000.0

#: ``local_open(model_id)``: how to run a generation on a model this node hosts, None if it hosts none.
LocalOpen = Callable[[str], "OpenGeneration | None"]
#: ``embed_remote(peer_id, req)``: embed on a peer (``RemoteEmbeddings.embed_remote``, remote_embed.py).
EmbedRemote = Callable[[str, EmbeddingRequest], Awaitable[EmbeddingResult]]


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

    def counters(self) -> dict[str, int]:
        """The names ``/api/status`` has always shown under ``mesh.counters``."""
        return {
            "remote_generations_served": self.served,
            "remote_generations_opened": self.opened,
            "remote_generation_errors": self.errors,
            "bad_generate_requests": self.bad_requests,
            "reserved_models_ignored": self.reserved_models_ignored,
        }


class RemoteGeneration:
    """A router target source for members' models, and the host side of their requests to us."""

    def __init__(
        self, mesh: MeshMembers, *, node_id: str, local_open: LocalOpen, embed_remote: EmbedRemote | None = None
    ) -> None:
        """``embed_remote(peer_id, EmbeddingRequest)``: the ``embed`` of our remote targets (remote_embed.py)."""
        self._mesh = mesh
        self.node_id = node_id
        self._local_open = local_open
        self._embed_remote = embed_remote
        self._opened = self._served = self._errors = self._bad_requests = 0
        self._reserved_seen: dict[str, tuple[int, int]] = {}  # peer -> announcement that named a reserved id
        self._reserved_ignored = 0

    def statistics(self) -> RemoteGenerationStatistics:
        return RemoteGenerationStatistics(
            self._opened, self._served, self._errors, self._bad_requests, self._reserved_ignored
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
    def targets(self) -> list[RouteTarget]:
        states = self._mesh.member_states(trio.current_time())
        out: list[RouteTarget] = []
        members = self._mesh.members()
        for gone in [p for p in self._reserved_seen if p not in members]:
            del self._reserved_seen[gone]
        for peer_id, ann in members.items():
            if ann.role == "client":
                continue
            link = self._mesh.link(peer_id)
            rtt = link.rtt_ms if link is not None and link.rtt_ms is not None else UNLINKED_RTT_MS
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
                    )
                )
        return out

    @asynccontextmanager
    async def open_remote(self, peer_id: str, req: GenerationRequest) -> AsyncIterator[AsyncIterator[GenerationEvent]]:
        """Run ``req`` on ``peer_id``: events stream back; leaving early resets the stream (cancels it there)."""
        header = {"kind": "generate", "req": req.to_wire()}
        size = len(cbor.encode(header))
        if size > MAX_OPEN_HEADER_BYTES:  # a long prompt, or a continuation of a long answer
            raise GenerationError(
                f"the request is too large to forward to a peer ({size} bytes of at most {MAX_OPEN_HEADER_BYTES})",
                code="request_too_large",
                status=413,
            )
        try:
            link = await self._mesh.link_to(peer_id)
        except MeshError as exc:
            raise ModelUnavailable(f"peer {peer_id[:16]} is unreachable: {exc}") from None
        self._opened += 1
        finished = False
        try:
            async with link.open_stream(header) as stream:

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
                        while (ev := decoder.next_event()) is not None:  # RemoteError for anything bad
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
    async def serve(self, link: PeerLink, header: Mapping[str, Any], stream: LinkStream) -> None:
        """Answer a peer's ``generate`` stream with a local runner (errors go back as an error event)."""

        async def send_error(err: GenerationError) -> None:
            await stream.send(event_frame(err))
            await stream.send_eof()

        try:
            req = GenerationRequest.from_wire(header.get("req"))
        except InvalidRequest as exc:
            self._bad_requests += 1
            await send_error(GenerationError(f"invalid request: {exc.message}", code="invalid_request", status=400))
            return
        open_local = self._local_open(req.model)
        if open_local is None:
            await send_error(ModelUnavailable(f"peer {self.node_id[:16]} does not host {req.model!r}"))
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
