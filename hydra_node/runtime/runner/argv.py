"""The command line a model runner child is started with, from its settings (pure)."""

from __future__ import annotations

import sys
from pathlib import Path

from hydra_node.models import ModelRef
from hydra_node.runtime.runner.records import RunnerSettings, safe_file_part

__all__ = ["prompt_cache_dir", "runner_argv"]


def prompt_cache_dir(home: Path, model_id: str) -> Path:
    """Where a hosted model's prompt cache keeps its disk tier (docs/prompt-cache.md)."""
    return home / "prompt-cache" / safe_file_part(model_id)


def runner_argv(s: RunnerSettings, model: ModelRef, fd: int, home: Path | None = None) -> list[str]:
    """``python -m hydra_node.runtime.child.main`` with every knob of ``s`` (``fd``: the channel;
    ``home``: the node home, where the prompt cache's disk tier lives; None: no disk tier).
    ``--mmproj PATH`` when the model is served with a projector (``ModelRef.mmproj``, docs/vision.md)."""
    argv = [
        sys.executable,
        "-m",
        "hydra_node.runtime.child.main",
        "--fd",
        str(fd),
        "--model",
        str(model.path),
        "--model-id",
        model.id,
        *(("--mmproj", str(model.mmproj)) if model.mmproj is not None else ()),
        "--n-ctx",
        str(s.n_ctx),
        "--n-batch",
        str(s.n_batch),
        "--threads",
        str(s.threads),
        "--threads-batch",
        str(s.threads_batch),
        "--n-ubatch",
        str(s.n_ubatch),
        "--flash-attn",
        s.flash_attention,
        "--type-k",
        s.type_k,
        "--type-v",
        s.type_v,
        "--mmap",
        s.mmap,
        "--reasoning-format",
        s.reasoning_format,
    ]
    argv += ["--parallel", str(s.parallel)]
    if not s.continuous_batching:
        argv.append("--no-continuous-batching")
    if s.mlock:
        argv.append("--mlock")
    if not s.prompt_cache:
        argv.append("--no-prompt-cache")
    argv += ["--prefix-min-tokens", str(s.min_shared_tokens), "--prefix-max-entries", str(s.max_cached_prefixes)]
    if not s.share_prefixes:
        argv.append("--no-prefix-sharing")
    disk_gb = s.prompt_cache_disk_gb if home is not None else 0.0
    argv += ["--prompt-cache-ram-mb", str(s.prompt_cache_ram_mb), "--prompt-cache-disk-gb", repr(float(disk_gb))]
    if home is not None and disk_gb > 0:  # docs/prompt-cache.md: one directory per hosted model
        argv += ["--prompt-cache-dir", str(prompt_cache_dir(home, model.id))]
        argv += ["--model-digests", str(home / "kv" / "digests.json")]
    if not s.warmup:
        argv.append("--no-warmup")
    for ep in s.rpc_endpoints:
        argv += ["--rpc", ep]
    if s.n_gpu_layers is not None:
        argv += ["--n-gpu-layers", str(s.n_gpu_layers)]
    if s.tensor_split:
        argv += ["--tensor-split", ",".join(f"{x:.4f}" for x in s.tensor_split)]
    if s.output_on_host:
        argv.append("--output-on-host")
    if s.inject_token_delay_ms > 0:
        argv += ["--inject-token-delay-ms", f"{s.inject_token_delay_ms:g}"]
    argv += ["--grammar-token-budget-ms", repr(float(s.grammar_token_budget_ms))]
    argv += ["--grammar-request-budget-s", repr(float(s.grammar_request_budget_s))]
    return argv + list(s.extra_argv)
