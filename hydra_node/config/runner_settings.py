"""A model runner's settings from the file config (``serve``, and ``benchmark tune``'s candidates)."""

from __future__ import annotations

from typing import cast

from hydra_node.config import FileConfig
from hydra_node.runtime.runner.records import RunnerSettings

__all__ = ["runner_settings_from"]


def runner_settings_from(f: FileConfig, extra_argv: tuple[str, ...] = ()) -> RunnerSettings:
    """A runner's settings from the file config (``serve``, and ``benchmark tune``'s candidates)."""
    mf, tp, hw, rn = f.defaults.model_fit, f.defaults.throughput, f.defaults.hardware, f.runner
    # flash_attention and mmap are strings once loaded (true/false become "on"/"off": _coerce)
    flash_attention, mmap = cast(str, mf.flash_attention), cast(str, hw.mmap)
    return RunnerSettings(
        n_ctx=mf.ctx_size,
        n_batch=mf.batch,
        parallel=tp.parallel,
        continuous_batching=tp.continuous_batching,
        threads=tp.threads,
        threads_batch=tp.threads_batch,
        n_ubatch=mf.ubatch,
        flash_attention=flash_attention,
        type_k=mf.cache_type_k,
        type_v=mf.cache_type_v,
        mmap=mmap,
        n_gpu_layers=hw.n_gpu_layers,
        mlock=hw.mlock,
        prompt_cache=mf.prompt_cache,
        share_prefixes=mf.prefix_cache.enabled,
        min_shared_tokens=mf.prefix_cache.min_tokens,
        max_cached_prefixes=mf.prefix_cache.max_entries,
        prompt_cache_ram_mb=mf.prefix_cache.ram_mb,
        prompt_cache_disk_gb=float(mf.prefix_cache.disk_gb),
        reasoning_format=mf.reasoning_format,
        warmup=hw.warmup,
        queue_size=tp.queue_size,
        load_timeout_s=rn.load_timeout_s,
        backoff_initial_s=rn.restart_backoff_initial_s,
        backoff_max_s=rn.restart_backoff_max_s,
        crash_loop_restarts=rn.crash_loop_restarts,
        crash_loop_window_s=rn.crash_loop_window_s,
        failed_retry_s=rn.failed_retry_s,
        inject_token_delay_ms=rn.inject_token_delay_ms,
        grammar_token_budget_ms=rn.grammar_token_budget_ms,
        grammar_request_budget_s=rn.grammar_request_budget_s,
        extra_argv=tuple(extra_argv),
    )
