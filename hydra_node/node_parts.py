"""Small parts of the composition root that need none of its state: host memory, the RPC build
check, the local runners as a route-target source, and runner settings from the file config."""

from __future__ import annotations

from collections.abc import Mapping

from hydra_node.config import FileConfig
from hydra_node.routing.router import RouteTarget
from hydra_node.runtime.runner.records import RunnerSettings, RunnerState
from hydra_node.runtime.runner.supervisor import RunnerSupervisor


def _meminfo() -> tuple[int, int]:
    """(total, available) bytes; MemAvailable counts reclaimable page cache, unlike free pages."""
    total = avail = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name == "MemTotal":
                    total = int(rest.split()[0]) * 1024
                elif name == "MemAvailable":
                    avail = int(rest.split()[0]) * 1024
                if total and avail:  # both near the top: skip the rest of the file
                    break
    except (OSError, ValueError, IndexError):
        pass
    return total, avail


class NodeAlreadyRunning(Exception):
    pass


def check_rpc_support() -> None:
    """Refuse to start with a llama-cpp-python that was built without RPC.

    Looks for ggml's RPC library beside llama-cpp-python's without importing it: loading
    llama.cpp in the node process would initialise every GPU backend here too (on a CUDA
    build about 550 MiB of RSS and a GPU context, measured on an H200); only runners load it
    (and check ``llama_supports_rpc()`` again)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("llama_cpp")
    libdir = Path(spec.origin).parent / "lib" if spec is not None and spec.origin else None
    if libdir is None or not any(libdir.glob("libggml-rpc.so*")):
        raise RuntimeError("this llama-cpp-python was built without RPC support; run `make install`, which "
                           "builds llama-cpp-python 0.3.36 with CMAKE_ARGS=-DGGML_RPC=on")


class LocalRunners:
    """Target source for the models this node hosts (``runners``: model id → its supervisor,
    filled by the model runtime)."""

    def __init__(self, node_id: str, runners: Mapping[str, RunnerSupervisor]):
        self.node_id = node_id
        self.runners = runners

    def targets(self) -> list[RouteTarget]:
        # a restarting runner is listed as loading: it is coming back, the router waits or goes elsewhere
        return [RouteTarget(model=r.model.id, node_id=self.node_id, local=True, open=r.generate,
                            embed=r.embeddings.embed, queue_depth=r.queue_depth + r.in_flight, slots=r.slots,
                            free_slots=r.free_slots,
                            state=RunnerState.LOADING if r.state == RunnerState.RESTARTING else r.state)
                for r in self.runners.values()]


def runner_settings_from(f: FileConfig, extra_argv: tuple[str, ...] = ()) -> RunnerSettings:
    """A runner's settings from the file config (``serve``, and ``benchmark tune``'s candidates)."""
    mf, tp, hw, rn = f.defaults.model_fit, f.defaults.throughput, f.defaults.hardware, f.runner
    return RunnerSettings(n_ctx=mf.ctx_size, n_batch=mf.batch, parallel=tp.parallel,
                          continuous_batching=tp.continuous_batching, threads=tp.threads, threads_batch=tp.threads_batch,
                          n_ubatch=mf.ubatch, flash_attention=mf.flash_attention, type_k=mf.cache_type_k,
                          type_v=mf.cache_type_v, mmap=hw.mmap, n_gpu_layers=hw.n_gpu_layers,
                          mlock=hw.mlock, prompt_cache=mf.prompt_cache, share_prefixes=mf.prefix_cache.enabled,
                          min_shared_tokens=mf.prefix_cache.min_tokens,
                          max_cached_prefixes=mf.prefix_cache.max_entries, warmup=hw.warmup, queue_size=tp.queue_size, load_timeout_s=rn.load_timeout_s,
                          backoff_initial_s=rn.restart_backoff_initial_s, backoff_max_s=rn.restart_backoff_max_s,
                          crash_loop_restarts=rn.crash_loop_restarts, crash_loop_window_s=rn.crash_loop_window_s,
                          failed_retry_s=rn.failed_retry_s,
                          inject_token_delay_ms=rn.inject_token_delay_ms,
                          extra_argv=tuple(extra_argv))
