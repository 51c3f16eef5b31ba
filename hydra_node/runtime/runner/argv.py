"""The command line a model runner child is started with, from its settings (pure)."""

from __future__ import annotations

import sys

from hydra_node.models import ModelRef
from hydra_node.runtime.runner.records import RunnerSettings

__all__ = ["runner_argv"]


def runner_argv(s: RunnerSettings, model: ModelRef, fd: int) -> list[str]:
    """``python -m hydra_node.runtime.child.main`` with every knob of ``s`` (``fd``: the channel)."""
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
