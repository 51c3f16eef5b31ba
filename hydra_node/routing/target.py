"""What the router ranks: one place a model can run (:class:`RouteTarget`), its state, its sources.

A target is a local runner (:mod:`hydra_node.routing.local`) or a peer's model as announced
(:mod:`hydra_node.routing.remote`); the router (:mod:`hydra_node.routing.router`) and the live
scheduler (:mod:`hydra_node.routing.live`) both take them, so they live apart from either.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

from hydra_node.inference import (
    EmbeddingRequest,
    EmbeddingResult,
    GenerationEvent,
    GenerationRequest,
    ModelCaps,
    TokenizeRequest,
    TokenizeResult,
)

__all__ = ["EmbedFn", "OpenGeneration", "RouteTarget", "TargetSource", "TargetState", "TokenizeFn"]

#: ``open(req)``: how a target runs a generation — an async context manager whose value is its events
#: (leaving it early cancels the generation where it runs).
OpenGeneration = Callable[[GenerationRequest], AbstractAsyncContextManager[AsyncIterator[GenerationEvent]]]
#: ``await embed(req)``: how a target embeds.
EmbedFn = Callable[[EmbeddingRequest], Awaitable[EmbeddingResult]]
#: ``await tokenize(req)``: how a target tokenizes or detokenizes with its model.
TokenizeFn = Callable[[TokenizeRequest], Awaitable[TokenizeResult]]


class TargetState(enum.StrEnum):
    """A target's state as the router lists it (``/v1/models`` ``states``); only READY is routed to.

    The runner states (:class:`hydra_node.runtime.runner.records.RunnerState`, same values: a local
    restarting runner is listed as loading, a peer announces its own), ``suspect`` for a peer that
    is not alive, ``stopping`` for a host handing its generations over before it stops, and
    ``unknown`` for a state a peer announced that this version does not know
    (:meth:`of`: a newer peer's state never breaks routing, it is just not routed to)."""

    STARTING = "starting"
    PLACING = "placing"
    LOADING = "loading"
    READY = "ready"
    RESTARTING = "restarting"
    FAILED = "failed"
    STOPPED = "stopped"
    STOPPING = "stopping"  # its node is stopping and hands its generations over (routing/handover.py)
    SUSPECT = "suspect"
    UNKNOWN = "unknown"

    @classmethod
    def of(cls, state: str) -> TargetState:
        """``state`` (a runner's, or as a peer announced it) as a target state; UNKNOWN if it is none."""
        try:
            return cls(state)
        except ValueError:
            return cls.UNKNOWN


@dataclass
class RouteTarget:
    """One place a model can run (a local runner or a peer), as the router ranks it."""

    model: str
    node_id: str
    local: bool
    open: OpenGeneration
    queue_depth: int = 0  # requests waiting or being served there (local: live; remote: as announced)
    rtt_ms: float = 0.0
    state: TargetState = TargetState.READY
    slots: int = 1  # sequences the target serves at once (its runner's parallel; remote: estimated)
    free_slots: int | None = None  # sequences it could start now (local: live; remote: as announced)
    embed: EmbedFn | None = None  # None: cannot embed
    #: The model's identity (:mod:`hydra_node.routing.identity`: its GGUF file's digest, and a host
    #: that resumes generations): a continuation goes only to a target of the same one. None:
    #: unknown (not hashed yet, an older peer) — such a target never takes a continuation.
    identity: str | None = None
    #: What the model can do there (its runner's ready message; a peer's announced ``model_caps``).
    #: None: unknown (an older peer, a runner not ready yet): it takes no request that needs one
    #: (:mod:`hydra_node.routing.capable`).
    caps: ModelCaps | None = None
    tokenize: TokenizeFn | None = None  # None: cannot tokenize (an older peer)
    #: A link to the peer is up now (local: always). A request that could not reach an unlinked
    #: peer may try it again once it is linked (a relayed link coming up a moment later).
    linked: bool = True

    @property
    def busy(self) -> bool:
        """True when a request sent now would wait for a slot there."""
        if self.free_slots is not None:
            return self.free_slots <= 0
        return self.queue_depth >= self.slots

    @property
    def key(self) -> str:
        return f"{'local' if self.local else self.node_id}/{self.model}"


class TargetSource(Protocol):
    """Where the router gets targets from (local runners, the mesh's members)."""

    def targets(self) -> list[RouteTarget]: ...
