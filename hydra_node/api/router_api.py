"""What the API dialects need from the router: the seam between ``api``-side code and ``routing``.

:class:`hydra_node.routing.router.Router` is the one implementation; a dialect takes a
:class:`RouterApi` so that it depends on these calls, not on the router's insides.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
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

__all__ = ["ModelEntry", "RouterApi"]


class ModelEntry(Protocol):
    """One model of ``/v1/models``: its id, the nodes hosting it and each host's state there
    (node id → a :class:`hydra_node.routing.target.TargetState`, which is a str)."""

    @property
    def id(self) -> str: ...
    @property
    def hosts(self) -> list[str]: ...
    @property
    def states(self) -> Mapping[str, str]: ...
    @property
    def caps(self) -> ModelCaps:
        """What the model can do (:meth:`RouterApi.capabilities`; ``NO_CAPS`` when no host reports any)."""
        ...


class RouterApi(Protocol):
    def generate(self, req: GenerationRequest) -> AbstractAsyncContextManager[AsyncIterator[GenerationEvent]]:
        """Open one generation on the best target; the context yields its events."""
        ...

    async def embed(self, req: EmbeddingRequest) -> EmbeddingResult:
        """Embed ``req`` on the best target that can."""
        ...

    def models(self) -> Sequence[ModelEntry]:
        """Every model some target serves now."""
        ...

    def recently_seen(self, model: str) -> bool:
        """True when a target for ``model`` existed a moment ago (a restart, not a typo)."""
        ...

    def capabilities(self, model: str) -> ModelCaps:
        """What ``model`` can do, as its hosts report it (``NO_CAPS`` when none reports any:
        an older node, or no such model)."""
        ...

    async def tokenize(self, req: TokenizeRequest) -> TokenizeResult:
        """Tokenize or detokenize on a host of ``req.model`` (this node's runner when it hosts it)."""
        ...
