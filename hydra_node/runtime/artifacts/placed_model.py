"""``serve --model placement:NAME``: host the ``model_weights`` artifact NAME (docs/placement.md).

At start (``Node.run``, once the placement service runs and before the models load) the artifact is
materialised into the local cache — from the cache or the configured namespaces — verified, and
leased for the life of the process, so the cache never evicts a model that is being served. When
it is in neither and the node joins a mesh (``--join``), the node asks again once it has joined:
then peers that announce it are asked too (``Node._start_placed_from_peers``, a bounded wait for
their announcements first), and the model loads after the node's other models.  The artifact must hold exactly one
model ``.gguf`` file, and may hold one multimodal projector GGUF (``general.architecture`` ``clip``) that is then
served beside it (``ModelRef.mmproj``, docs/vision.md); the model's id is NAME.
"""

from __future__ import annotations

from hydra_node.models import PROJECTOR_ARCHITECTURE, InvalidModelId, ModelNotFound, ModelRef, check_model_id
from hydra_node.models import gguf_architecture
from hydra_node.runtime.artifacts.errors import ArtifactError

__all__ = ["KIND", "PREFIX", "placed_model", "placed_name"]

PREFIX = "placement:"
KIND = "model_weights"


def placed_name(ref: str | None) -> str | None:
    """NAME of a ``placement:NAME`` reference, else None."""
    return ref[len(PREFIX) :] if isinstance(ref, str) and ref.startswith(PREFIX) else None


async def placed_model(service, name: str) -> ModelRef:
    """The model of the ``model_weights`` artifact ``name``, materialised and leased;
    :class:`ModelNotFound` (with the reason) when it cannot be."""
    try:
        check_model_id(name)
        manifest, folder = await service.materialise(KIND, name)
    except (ArtifactError, InvalidModelId) as exc:
        raise ModelNotFound(f"--model {PREFIX}{name}: {getattr(exc, 'message', exc)}") from None
    ggufs = [f.path for f in manifest.files if f.path.endswith(".gguf")]
    projectors = [p for p in ggufs if _is_projector(folder / p)]
    models = [p for p in ggufs if p not in projectors]
    if len(models) != 1 or len(projectors) > 1:
        raise ModelNotFound(
            f"--model {PREFIX}{name}: the artifact holds {len(ggufs)} .gguf files ({len(projectors)} of them "
            f"projectors); exactly one model file is needed, and at most one projector beside it"
        )
    service.cache.acquire((KIND, name))  # held while the process lives: never evicted while served
    return ModelRef(name, folder / models[0], folder / projectors[0] if projectors else None)


def _is_projector(path) -> bool:
    """True for a multimodal projector GGUF (``general.architecture`` ``clip``): served beside the model."""
    try:
        return gguf_architecture(path) == PROJECTOR_ARCHITECTURE
    except (OSError, ValueError):
        return False  # not readable as GGUF: counted as a model file, which the runner then refuses
