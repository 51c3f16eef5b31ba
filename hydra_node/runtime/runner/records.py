"""The model runner's typed records: its state, settings, rolling request statistics and errors.

Pure data, no I/O: :mod:`hydra_node.runtime.runner.supervisor` drives them.
"""

from __future__ import annotations

import enum
import hashlib
import signal
from dataclasses import dataclass
from typing import Any, Mapping

from hydra_node.inference import Finished, GenerationError, ModelCaps
from hydra_node.runtime.child.stats import EngineStatistics
from hydra_node.statemachine import StateTable

__all__ = [
    "REASONING_FORMAT_SETTINGS",
    "RUNNER_MACHINE",
    "RUNNER_TRANSITIONS",
    "RequestStats",
    "RequestSummary",
    "RunnerCrashed",
    "RunnerKilled",
    "RunnerLoadError",
    "RunnerSettings",
    "RunnerStalled",
    "RunnerState",
    "RunnerStatus",
    "SplitWorkerLost",
    "WorkerLoss",
    "death_error",
    "exit_how",
    "safe_file_part",
]


class RunnerState(enum.StrEnum):
    STARTING = "starting"  # not spawned yet
    PLACING = "placing"  # a split model looking for workers (set by its host)
    LOADING = "loading"  # spawned, loading the model
    READY = "ready"
    RESTARTING = "restarting"  # exited; waiting out the back-off
    FAILED = "failed"  # crash loop, or the model cannot be loaded
    STOPPED = "stopped"


_R = RunnerState
#: Where a runner may go from each state (the supervisor, and its host: placing, failed). Every life
#: is [placing] -> loading -> [ready] -> restarting; a crash loop is failed, then loading again
#: after ``failed_retry_s``; stopped (run() ended) and failed are reachable from anywhere, and a
#: host may run a stopped runner again (a split retries its load) or mark it failed for good.
RUNNER_TRANSITIONS: Mapping[RunnerState, frozenset[RunnerState]] = {
    _R.STARTING: frozenset({_R.PLACING, _R.LOADING, _R.FAILED, _R.STOPPED}),
    _R.PLACING: frozenset({_R.LOADING, _R.FAILED, _R.STOPPED}),
    _R.LOADING: frozenset({_R.PLACING, _R.READY, _R.RESTARTING, _R.FAILED, _R.STOPPED}),
    _R.READY: frozenset({_R.RESTARTING, _R.FAILED, _R.STOPPED}),
    _R.RESTARTING: frozenset({_R.PLACING, _R.LOADING, _R.FAILED, _R.STOPPED}),
    _R.FAILED: frozenset({_R.LOADING, _R.STOPPED}),
    _R.STOPPED: frozenset({_R.PLACING, _R.LOADING, _R.FAILED}),
}
RUNNER_MACHINE = StateTable.between("model runner", RUNNER_TRANSITIONS)


class RunnerCrashed(GenerationError):
    def __init__(self, message: str):
        super().__init__(message, code="runner_crashed", status=502, retryable=True)


class RunnerKilled(GenerationError):
    """The runner was killed by a SIGKILL this node did not send (the machine's OOM killer, an
    operator's ``kill -9``): a lost head, not the request's fault, so unlike :class:`RunnerCrashed`
    (any other death: SIGSEGV, SIGABRT, a non-zero exit, which the request may have caused) it is
    not poisonous: the router may retry or continue the request on another target."""

    def __init__(self, message: str):
        super().__init__(message, code="runner_killed", status=502, retryable=True)


class RunnerStalled(GenerationError):
    def __init__(self, message: str):
        super().__init__(message, code="runner_stalled", status=504, retryable=False)


@dataclass(frozen=True)
class WorkerLoss:
    """A split's RPC worker this node lost while a runner used it: ``peer`` (its node id), ``reason``
    (what said so: its lease ended, its peer left the membership), ``at`` (unix seconds)."""

    peer: str
    reason: str
    at: float


class SplitWorkerLost(GenerationError):
    """A split runner died or stalled because one of its RPC workers was lost (its node died or left,
    its lease ended): a lost head, not the request's fault, so the router may continue the request on
    another target, or here once the split has replanned (docs/splits.md "When a worker dies")."""

    def __init__(self, model: str, loss: WorkerLoss, how: str = "died"):
        super().__init__(
            f"model runner for {model!r} {how}: it lost its RPC worker on peer {loss.peer[:16]} ({loss.reason}); "
            "the split is replanning",
            code="split_worker_lost",
            status=502,
            retryable=True,
        )
        self.model, self.loss = model, loss


def death_error(model: str, exit_code: int | None, *, we_killed: bool, loss: WorkerLoss | None) -> GenerationError:
    """What the requests of a runner child that died get (pure): :class:`SplitWorkerLost` when a worker
    of its split was lost, :class:`RunnerKilled` when a SIGKILL this node did not send ended it (the OOM
    killer, an operator's ``kill -9``), else :class:`RunnerCrashed` (SIGSEGV, SIGABRT, an exit, our own
    kill of a stuck runner: the request may be the cause)."""
    if loss is not None:
        return SplitWorkerLost(model, loss)
    if exit_code == -signal.SIGKILL and not we_killed:
        return RunnerKilled(
            f"model runner for {model!r} was killed by a SIGKILL this node did not send "
            "(the out-of-memory killer, or kill -9)"
        )
    how = "" if exit_code is None else f" ({exit_how(exit_code)})"
    return RunnerCrashed(f"model runner for {model!r} exited unexpectedly{how}")


def exit_how(code: int | None) -> str:
    """How a child ended, from its return code: ``killed by signal N`` or ``exit code N``."""
    return f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"


class RunnerLoadError(Exception):
    """The model could not be loaded at all (bad file, no memory, no RPC support)."""


#: ``[defaults.model_fit].reasoning_format`` (the runner's ``--reasoning-format``), as llama-server's
#: flag of that name: "auto" = detected from the chat template; "none" = the model is treated as not
#: reasoning (no split, thoughts stay in the answer); "think" / "gpt-oss" = that format, whatever the
#: template says (docs/reasoning.md "Override").
REASONING_FORMAT_SETTINGS = ("auto", "none", "think", "gpt-oss")


@dataclass(frozen=True)
class RunnerSettings:
    n_ctx: int = 4096
    n_batch: int = 512
    #: Sequences the runner decodes together (``[defaults.throughput].parallel``; 1 with a draft model).
    parallel: int = 1
    #: False: one sequence at a time (the batch engine with one slot; needs parallel = 1).
    continuous_batching: bool = True
    #: llama.cpp ``n_ubatch`` (capped at ``n_batch`` by llama.cpp).
    n_ubatch: int = 512
    #: auto | on | off (``hydra_node/runtime/runner/llama_params.py``: auto runs as on).
    flash_attention: str = "auto"
    #: KV cache ggml types by name (``llama_params.KV_CACHE_TYPES``).
    type_k: str = "f16"
    type_v: str = "f16"
    #: auto | on | off: map the model file (auto: llama.cpp's default, on where supported).
    mmap: str = "auto"
    threads: int = 0
    threads_batch: int = 0
    mlock: bool = False
    prompt_cache: bool = True
    warmup: bool = True
    queue_size: int = 16
    load_timeout_s: float = 120.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    crash_loop_restarts: int = 5
    crash_loop_window_s: float = 60.0
    #: Prefix sharing across slots ([defaults.model_fit.prefix_cache]: enabled, min_tokens, max_entries).
    share_prefixes: bool = True
    min_shared_tokens: int = 64
    max_cached_prefixes: int = 64
    #: The prompt cache's tiers ([defaults.model_fit.prefix_cache] ram_mb, disk_gb; 0 = off; docs/prompt-cache.md).
    prompt_cache_ram_mb: int = 1024
    prompt_cache_disk_gb: float = 8.0
    #: How the model's reasoning is delimited (:data:`REASONING_FORMAT_SETTINGS`; "auto": detected).
    reasoning_format: str = "auto"
    #: A runner put in state failed by a crash loop is tried again after this long (0 = never):
    #: whatever broke it (memory pressure, a lost RPC worker) may have passed.
    failed_retry_s: float = 300.0
    rpc_endpoints: tuple[str, ...] = ()
    tensor_split: tuple[float, ...] = ()
    inject_token_delay_ms: float = 0.0  # test/bench knob: the runner sleeps this long per token
    #: A request's grammar work per token / per request before it fails with 422 grammar_too_slow.
    grammar_token_budget_ms: float = 5000.0
    grammar_request_budget_s: float = 60.0
    #: llama.cpp ``n_gpu_layers``: ``[defaults.hardware].gpu_layers``, or a split plan's.  None: auto
    #: (-1 with RPC endpoints or a GPU device, else 0).
    n_gpu_layers: int | None = None
    #: Keep the output projection in host memory (a split plan's ``output_on_host``).
    output_on_host: bool = False
    #: Give up on a generation (and kill the runner) when no frame comes for this long; 0 = never.
    #: Split runners need it: a stalled RPC worker or tunnel blocks llama.cpp forever.
    stall_timeout_s: float = 0.0
    #: More runner arguments (speculative decoding: hydra_node/runtime/child/speculative/assemble.py).
    extra_argv: tuple[str, ...] = ()


@dataclass
class RequestStats:
    """Rolling per-runner request statistics (for status and, later, the scheduler)."""

    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    queue_wait_ms: float = 0.0
    ttft_ms: float = 0.0
    itl_ms: float = 0.0
    tokens_per_s: float = 0.0
    cached_tokens: int = 0
    prompt_tokens: int = 0

    def observe(self, fin: Finished, alpha: float = 0.2) -> None:
        self.completed += 1
        first = self.completed == 1

        def ewma(old, new):
            return new if first else (1 - alpha) * old + alpha * new

        self.queue_wait_ms = ewma(self.queue_wait_ms, fin.queue_wait_ms)
        self.ttft_ms = ewma(self.ttft_ms, fin.ttft_ms)
        if fin.completion_tokens > 1:
            self.itl_ms = ewma(self.itl_ms, fin.itl_ms)
            if fin.itl_ms > 0:
                self.tokens_per_s = ewma(self.tokens_per_s, 1000.0 / fin.itl_ms)
        self.cached_tokens += fin.cached_tokens
        self.prompt_tokens += fin.prompt_tokens


@dataclass(frozen=True)
class RequestSummary:
    """:class:`RequestStats` rounded for ``/api/status``."""

    completed: int
    failed: int
    cancelled: int
    queue_wait_ms: float
    ttft_ms: float
    itl_ms: float
    tokens_per_s: float
    prefix_cache_hit_rate: float

    @classmethod
    def of(cls, s: RequestStats) -> RequestSummary:
        return cls(
            completed=s.completed,
            failed=s.failed,
            cancelled=s.cancelled,
            queue_wait_ms=round(s.queue_wait_ms, 2),
            ttft_ms=round(s.ttft_ms, 2),
            itl_ms=round(s.itl_ms, 2),
            tokens_per_s=round(s.tokens_per_s, 1),
            prefix_cache_hit_rate=round(s.cached_tokens / s.prompt_tokens, 3) if s.prompt_tokens else 0.0,
        )


@dataclass(frozen=True)
class RunnerStatus:
    """One runner in ``/api/status`` ``models``."""

    id: str
    path: str
    state: RunnerState
    pid: int | None
    restarts: int
    last_error: str | None
    queue_depth: int
    queue_capacity: int
    in_flight: int
    n_ctx: int | None
    size_bytes: int | None
    requests: RequestSummary
    #: The runner's own speculative-decoding figures, as it reported them (None without a draft).
    speculative: Mapping[str, Any] | None
    #: The llama.cpp parameters the runner loaded with, as its ready message reported them
    #: (n_ubatch, flash_attn, type_k, type_v, use_mmap, use_mlock, threads, gpu_layers); None before.
    llama: Mapping[str, Any] | None = None
    #: How the runner generates, from its ready message: mode (continuous_batching | sequential, with
    #: the reason), parallel, ctx_per_slot (the most one request may use: n_ctx, the
    #: unified KV cache is shared), n_ctx_total; None before it is ready.
    engine: Mapping[str, Any] | None = None
    #: The continuous-batching engine's latest figures (its ``stats`` frames: batch size, free slots,
    #: KV cells, prefill/decode tokens/s, prefix reuse); None before the first, or without the engine.
    engine_stats: EngineStatistics | None = None
    #: What the model can do, from the runner's ready message (reasoning, thinks, switch, fim:
    #: inference/capabilities.py); None before it is ready.
    caps: ModelCaps | None = None
    #: The multimodal projector GGUF the runner loads beside the model (``--mmproj``); None without.
    mmproj: str | None = None


def safe_file_part(name: str) -> str:
    """A file-name part for a model id: ASCII letters, digits, ``-_.`` (at most 48), then a short hash
    of the whole id, so two ids never share a pid or log file and no name outgrows 255 bytes."""
    readable = "".join(c if (c.isascii() and c.isalnum()) or c in "-_." else "_" for c in name)[:48]
    return f"{readable}-{hashlib.sha256(name.encode()).hexdigest()[:10]}"
