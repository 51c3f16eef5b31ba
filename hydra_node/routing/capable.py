"""Which targets may take a request that needs a model capability (pure).

A request that uses reasoning fields (``thinking``, ``thinking_budget``, ``reasoning_effort``) or
fill-in-the-middle (``suffix``) or images (``images``: a host with a projector) goes only to a target whose host reported the capability
(:class:`~hydra_node.inference.capabilities.ModelCaps`, from its runner's ready message or its
announcement's ``model_caps``): a node older than these fields would read the request and ignore
them, answering a plain completion as if it had honoured them. A target whose capabilities are
unknown (``caps`` None: an older node, a runner not ready yet) never takes such a request, nor
one using llama-server's sampling fields (``top_k``, ``min_p``, ``repeat_penalty``): every host
that reports capabilities honours those, an older one would sample without them.

When no target of the model can take it and none may still report (a runner loading),
:func:`capability_refusal` says why: a 400
``unsupported_parameter`` naming the model and the parameter when every host reported the
model's capabilities and none has this one, else a 503 (some host's capabilities are unknown:
it may be an older node, which would silently drop the field).
"""

from __future__ import annotations

from collections.abc import Sequence

from hydra_node.inference import GenerationError, GenerationRequest, ModelCaps
from hydra_node.routing.target import RouteTarget, TargetState

__all__ = ["capability_refusal", "needed", "serves"]


def needed(req: GenerationRequest) -> tuple[tuple[str, str], ...]:
    """The capabilities ``req`` needs, each with the request field that needs it:
    ``("reasoning", field)``, ``("fim", "suffix")``, ``("vision", "messages")`` (images);
    empty for a plain request."""
    out: list[tuple[str, str]] = []
    for name, used in (
        ("reasoning_effort", bool(req.reasoning_effort)),
        ("thinking", req.thinking is not None),
        ("thinking_budget", req.thinking_budget is not None),
    ):
        if used:
            out.append(("reasoning", name))
            break
    if req.suffix:
        out.append(("fim", "suffix"))
    if req.images:
        out.append(("vision", "messages"))
    for name, used in (
        ("top_k", req.top_k is not None),
        ("min_p", req.min_p != 0.0),
        ("repeat_penalty", req.repeat_penalty != 1.0),
    ):
        if used:  # llama-server's sampling fields: any host that reports capabilities honours them
            out.append(("sampling", name))
            break
    return tuple(out)


def _has(caps: ModelCaps, capability: str) -> bool:
    if capability == "sampling":
        return True  # a node new enough to report capabilities samples with them
    if capability == "vision":
        return caps.vision
    return caps.reasons if capability == "reasoning" else caps.fim


def serves(caps: ModelCaps | None, req: GenerationRequest) -> bool:
    """True when a target with ``caps`` may take ``req`` (any target, for a plain request)."""
    need = needed(req)
    if not need:
        return True
    return caps is not None and all(_has(caps, c) for c, _ in need)


_WHAT = {
    "reasoning": "a reasoning model (its chat template opens a reasoning block: docs/reasoning.md)",
    "fim": "a model with fill-in-the-middle tokens (a FIM prefix, suffix and middle token)",
    "vision": "a model served with an image projector (hydra-node serve --mmproj: docs/vision.md)",
    "sampling": "a host that samples with llama-server's extensions (one that reports model capabilities)",
}


def capability_refusal(req: GenerationRequest, listed: Sequence[RouteTarget]) -> GenerationError | None:
    """Why no target of ``listed`` (all of ``req.model``'s) may take ``req``; None when one may, or
    when none is listed (the router's own no-target answer applies)."""
    need = needed(req)
    if not need or not listed or any(serves(t.caps, req) for t in listed):
        return None
    if any(t.caps is None and t.state != TargetState.READY for t in listed):
        return None  # it may report once ready (a runner loading): the router waits for a capable target
    known = [t.caps for t in listed if t.caps is not None]
    missing = [(c, f) for c, f in need if not any(_has(k, c) for k in known)] or list(need)
    capability, param = missing[0]
    # what needs it: the field, or (images) what the field holds
    what, verb = ("images in 'messages'", "need") if capability == "vision" else (f"'{param}'", "needs")
    if len(known) == len(listed):
        return GenerationError(
            f"{what} {verb} {_WHAT[capability]}, and {req.model!r} is not one (as its hosts report it)",
            code="unsupported_parameter",
            status=400,
        )
    return GenerationError(
        f"no host of {req.model!r} reports the capability {what} {verb} ({_WHAT[capability]}); a host whose "
        "capabilities are unknown (loading, or an older hydra-node that would ignore the field) is not sent it: "
        "try again once it is ready, or upgrade it",
        code="capability_unknown",
        status=503,
        retryable=True,
    )
