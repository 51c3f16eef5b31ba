"""A same-vocabulary (target, draft) pair from one bundled model file.

The draft is the bundled Q4_1 GGUF; the target is its F16 (or F32) conversion made
with ``llama_model_quantize``: slower, slightly different logits, identical vocabulary.
"""

from __future__ import annotations

import os
from pathlib import Path

import llama_cpp

#: Target conversions we know how to make: name -> llama ftype.
FTYPES = {"f16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16, "f32": llama_cpp.LLAMA_FTYPE_ALL_F32}


class ConversionFailed(Exception):
    """llama_model_quantize refused to convert the source file."""


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "hydra-node" / "models"


def ensure_converted_target(src: Path, cache_dir: Path | None = None, kind: str = "f16", n_threads: int = 2) -> Path:
    """Return the cached ``kind`` conversion of ``src``, making it once (atomically) if needed."""
    if kind not in FTYPES:
        raise ValueError(f"unknown target kind {kind!r}; choose one of {sorted(FTYPES)}")
    src = Path(src)
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache_dir.mkdir(parents=True, exist_ok=True)
    stat = src.stat()
    out = cache_dir / f"{src.stem}.{kind.upper()}-{stat.st_size}.gguf"
    if out.is_file() and out.stat().st_size > 0:
        return out
    tmp = cache_dir / f".{out.name}.{os.getpid()}.tmp"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[kind]
    params.allow_requantize = True
    params.nthread = n_threads
    try:
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
        if rc != 0 or not tmp.is_file():
            raise ConversionFailed(f"llama_model_quantize({src} -> {kind}) returned {rc}")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def ensure_f16_target(src: Path, cache_dir: Path | None = None) -> Path:
    """The F16 conversion of ``src`` in ``cache_dir`` (default ``~/.cache/hydra-node/models``)."""
    return ensure_converted_target(src, cache_dir, "f16")
