"""The model-capabilities key of a mesh announcement's ``extra`` (protocol/README.md section 11.9),
parsed defensively: a peer's malformed value or entry is dropped and counted, never raised.

* ``model_caps``: ``{model id: ModelCaps wire, ...}``: what each model this node has loaded can do
  (:class:`~hydra_node.inference.capabilities.ModelCaps`: ``reasoning``, ``thinks``, ``switch``,
  ``fim``, ``vision``, ``audio``, each only when set, so a model with none is ``{}``). At most MAX_CAPS_MODELS models.
  A model the node announces without an entry here (an older node, a runner not ready yet) has
  unknown capabilities: the router sends it no request that needs one (routing/capable.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hydra_node.inference import MalformedRemoteEvent, ModelCaps

__all__ = ["CAPS_KEY", "MAX_CAPS_MODELS", "PeerCaps", "caps_extra", "parse_caps_extra"]

CAPS_KEY = "model_caps"
#: Most models one announcement describes (each takes at most 7 of the 256 ``extra`` items).
MAX_CAPS_MODELS = 8
_MAX_ID = 256


@dataclass(frozen=True)
class PeerCaps:
    """What one announcement says about its models' capabilities (the malformed entries dropped,
    counted in ``malformed``)."""

    models: Mapping[str, ModelCaps] = field(default_factory=dict)
    malformed: int = 0


def caps_extra(models: Iterable[tuple[str, ModelCaps | None]]) -> dict[str, Any]:
    """Our ``extra`` key for the models whose capabilities are known (``{}`` when none is)."""
    known = {model: caps.to_wire() for model, caps in models if caps is not None}
    if not known:
        return {}
    return {CAPS_KEY: dict(list(known.items())[:MAX_CAPS_MODELS])}


def parse_caps_extra(extra: Mapping[str, Any]) -> PeerCaps:
    """The ``model_caps`` of a peer's ``extra`` (absent: nothing known)."""
    value = extra.get(CAPS_KEY)
    if value is None:
        return PeerCaps()
    if not isinstance(value, Mapping):
        return PeerCaps(malformed=1)
    out: dict[str, ModelCaps] = {}
    malformed = 0
    for model, wire in list(value.items())[:MAX_CAPS_MODELS]:
        if not isinstance(model, str) or not 0 < len(model) <= _MAX_ID:
            malformed += 1
            continue
        try:
            out[model] = ModelCaps.from_wire(wire)
        except MalformedRemoteEvent:
            malformed += 1
    return PeerCaps(out, malformed + max(0, len(value) - MAX_CAPS_MODELS))
