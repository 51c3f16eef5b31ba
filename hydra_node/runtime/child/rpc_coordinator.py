"""Inside a model runner process, before ``llama_cpp.Llama(...)``: attach RPC workers.

Call order in the runner (a child process: llama.cpp *aborts* the process when an RPC
worker dies or misbehaves, and its supervisor then restarts it with a new plan)::

    names = register_rpc_servers(list(plan.rpc_endpoints))  # probes, then registers
    with LlamaLogCapture() as log, output_projection_on_host(plan.output_on_host):
        llm = llama_cpp.Llama(model_path, **llama_kwargs_for_plan(plan), verbose=False)
    verify_placement(plan, log.lines)                     # raises PlacementMismatch
    evidence = placement_evidence(log.lines)              # {"RPC0[127.0.0.1:P]": MiB, "CPU_Mapped": MiB}

RPC registration is process-wide and permanent (ggml keeps a static registry), which
is one more reason to run each split model in its own runner process.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import re
from dataclasses import dataclass

from hydra_node.runtime.rpc import ggml as _ggml
from hydra_node.runtime.rpc.proto import GGML_RPC_MAX_SERVERS, check_worker_proto
from hydra_node.runtime.rpc.plan import SplitPlan
from hydra_node.runtime.rpc.probe import PROBE_TIMEOUT_S, parse_endpoint, probe_worker
from hydra_node.runtime.rpc.worker import CHILD_ENV

#: llama.cpp's ``LLAMA_SPLIT_MODE_LAYER``: whole layers per device.
LLAMA_SPLIT_MODE_LAYER = 1
#: Bound on captured llama.cpp log lines (model loading prints a few hundred).
MAX_LOG_LINES = 2000
#: The output projection's weights (tied models reuse the token embedding as their output).
OUTPUT_TENSOR_PATTERN = rb"^(output|token_embd)\.weight$"


class RpcRegistrationError(Exception):
    """An RPC endpoint could not be attached (the plan's or the worker's fault, says which)."""


class PlacementMismatch(Exception):
    """llama.cpp put layers somewhere other than the plan said (our bug, or a changed llama.cpp)."""


@dataclass(frozen=True)
class RpcDevice:
    name: str  # "RPC0": what llama.cpp's log and device list call it
    endpoint: str  # "127.0.0.1:50052"


def rpc_devices() -> list[RpcDevice]:
    """RPC devices already in this process's ggml registry, in registry order."""
    ggml = _ggml.load()
    out = []
    for i in range(ggml.dev_count()):
        dev = ggml.dev_get(i)
        reg = ggml.dev_backend_reg(dev)
        if reg and ggml.reg_name(reg) == b"RPC":
            out.append(RpcDevice(ggml.dev_name(dev).decode(), ggml.dev_description(dev).decode()))
    return out


def register_rpc_servers(endpoints: list[str], *, probe_timeout: float = PROBE_TIMEOUT_S) -> list[str]:
    """Probe every endpoint, then register it with ggml; return the new device names.

    Raises :class:`RpcRegistrationError` for a bad list, an unreachable or busy worker
    (``WorkerUnreachable`` as cause) or an incompatible one (``IncompatibleWorker`` as
    cause): all checked *before* llama.cpp, which would abort instead, sees any of them.
    Endpoints already registered in this process are refused: llama.cpp cannot drop a
    device, so a changed plan needs a fresh runner process.
    """
    if len(set(endpoints)) != len(endpoints):
        raise RpcRegistrationError(f"duplicate RPC endpoints in {endpoints}")
    known = {d.endpoint for d in rpc_devices()}
    if len(known) + len(endpoints) > GGML_RPC_MAX_SERVERS:
        raise RpcRegistrationError(f"llama.cpp accepts at most {GGML_RPC_MAX_SERVERS} RPC servers")
    for ep in endpoints:
        try:
            parse_endpoint(ep)
        except ValueError as exc:
            raise RpcRegistrationError(str(exc)) from None
        if ep in known:
            raise RpcRegistrationError(f"RPC endpoint {ep} is already registered in this process")
    for ep in endpoints:
        try:
            hello = probe_worker(ep, timeout=probe_timeout)
            check_worker_proto(hello.proto, who=f"RPC worker {ep}")
        except Exception as exc:
            raise RpcRegistrationError(f"cannot use RPC worker {ep}: {exc}") from exc
    os.environ.update(CHILD_ENV)  # read by ggml_abort at abort time
    ggml = _ggml.load()
    names: list[str] = []
    for ep in endpoints:
        reg = ggml.rpc_add_server(ep.encode())
        if not reg:
            raise RpcRegistrationError(f"RPC worker {ep} reports no devices")
        ggml.register(reg)
        names += [ggml.dev_name(ggml.reg_dev_get(reg, i)).decode() for i in range(ggml.reg_dev_count(reg))]
    return names


def llama_kwargs_for_plan(plan: SplitPlan, registered: list[RpcDevice] | None = None) -> dict:
    """Keyword arguments for ``llama_cpp.Llama`` that realise ``plan``.

    ``tensor_split`` has one entry per llama.cpp device.  By default the plan's
    endpoints are taken to be the only RPC devices, registered in plan order (a fresh
    runner).  Pass ``registered=rpc_devices()`` when the process holds other RPC
    devices too: they get 0 and no layers.
    """
    if not plan.split:
        return {"n_gpu_layers": plan.n_gpu_layers}
    split = list(plan.tensor_split)
    if registered is not None:
        n_rpc = len(plan.rpc_endpoints)
        share = dict(zip(plan.rpc_endpoints, split[:n_rpc]))
        missing = set(share) - {d.endpoint for d in registered}
        if missing:
            raise RpcRegistrationError(f"plan uses RPC endpoints not registered here: {sorted(missing)}")
        split = [share.get(d.endpoint, 0.0) for d in registered] + split[n_rpc:]
    return {"n_gpu_layers": plan.n_gpu_layers, "tensor_split": split, "split_mode": LLAMA_SPLIT_MODE_LAYER}


class LlamaLogCapture:
    """Context manager that records llama.cpp/ggml log lines (bounded) while active.

    llama-cpp-python's own log callback is put back on exit.
    """

    def __init__(self) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=MAX_LOG_LINES)
        self._partial = ""
        self._cb: object = None  # the ctypes callback while it is installed

    def __enter__(self) -> "LlamaLogCapture":
        import llama_cpp

        @llama_cpp.llama_log_callback
        def cb(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
            self._partial += text.decode("utf-8", errors="replace")
            *done, self._partial = self._partial.split("\n")
            self.lines.extend(done)

        self._cb = cb  # keep the ctypes thunk alive while C holds it
        llama_cpp.llama_log_set(cb, ctypes.c_void_p(0))
        return self

    def __exit__(self, *exc: object) -> None:
        import llama_cpp
        from llama_cpp import _logger

        llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))
        if self._partial:
            self.lines.append(self._partial)
            self._partial = ""


class _TensorBuftOverride(ctypes.Structure):
    # struct llama_model_tensor_buft_override { const char * pattern; ggml_backend_buffer_type_t buft; }
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


@contextlib.contextmanager
def output_projection_on_host(enabled: bool = True):
    """While active, ``llama_cpp.Llama(...)`` keeps the output projection in host CPU memory.

    That is ``SplitPlan.output_on_host`` (see ``plan.py``): the last worker then sends the
    hidden state per token instead of the logits.  llama-cpp-python 0.3.36 declares
    ``llama_model_params.tensor_buft_overrides`` but never sets it, so we wrap
    ``llama_model_default_params`` (which ``Llama.__init__`` calls to build its
    parameters) for the duration of the load.  The override array lives until the block
    ends; llama.cpp reads it only while loading.
    """
    if not enabled:
        yield
        return
    import llama_cpp.llama_cpp as lc

    overrides = (_TensorBuftOverride * 2)(
        _TensorBuftOverride(OUTPUT_TENSOR_PATTERN, _ggml.load().cpu_buffer_type()), _TensorBuftOverride(None, None)
    )  # NULL-terminated
    default_params = lc.llama_model_default_params

    def with_overrides():
        params = default_params()
        params.tensor_buft_overrides = ctypes.cast(overrides, ctypes.c_void_p)
        return params

    lc.llama_model_default_params = with_overrides
    try:
        yield
    finally:
        lc.llama_model_default_params = default_params


_OVERRIDE_LINE = re.compile(r"tensor (\S+) \(.*\) buffer type overridden to CPU")


def overridden_to_cpu(lines) -> set[str]:
    """Tensors llama.cpp's load log says were pinned to the CPU by a buffer-type override."""
    return {m.group(1) for line in lines if (m := _OVERRIDE_LINE.search(line))}


_BUFFER_LINE = re.compile(r"load_tensors:\s+(\S+) model buffer size =\s+([0-9.]+) MiB")


def placement_evidence(lines) -> dict[str, float]:
    """Model-weight MiB per llama.cpp buffer, e.g. ``{"RPC0[127.0.0.1:P]": 20.1, "CPU_Mapped": 60.2}``."""
    out: dict[str, float] = {}
    for line in lines:
        if m := _BUFFER_LINE.search(line):
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


_LAYER_LINE = re.compile(r"load_tensors: layer\s+(\d+) assigned to device (\S+?),")


def layer_devices(lines) -> dict[int, str]:
    """Block index -> llama.cpp device name ("CPU", "RPC0", ...), from the load log."""
    return {int(m.group(1)): m.group(2) for line in lines if (m := _LAYER_LINE.search(line))}


def verify_placement(plan: SplitPlan, lines, registered: list[RpcDevice] | None = None) -> dict[int, str]:
    """Check llama.cpp's per-layer log against ``plan``; return the assignment.

    ``registered`` maps endpoints to device names when the process holds other RPC
    devices; by default the plan's workers are RPC0, RPC1, ... (a fresh runner).
    """
    names: dict[str | None, str] = {d.endpoint: d.name for d in registered} if registered is not None else {}
    expected: dict[int, str | None] = {}  # None: not checked
    for dev in plan.devices:
        name: str | None
        if dev.kind == "rpc":
            name = names.get(dev.endpoint, dev.name)
        else:  # the host's CPU keeps what is not offloaded; a host GPU's name is not checked
            name = "CPU" if plan.n_gpu_layers < plan.n_layers + 1 else None
        for block in range(dev.first_block, dev.stop_block):
            expected[block] = name
    got = layer_devices(lines)
    wrong = {b: (expected[b], got.get(b)) for b in expected if expected[b] is not None and got.get(b) != expected[b]}
    if wrong:
        raise PlacementMismatch(f"layers not where planned (block: planned, actual): {dict(list(wrong.items())[:8])}")
    if plan.output_on_host and not overridden_to_cpu(lines) & {"output.weight", "token_embd.weight"}:
        raise PlacementMismatch(
            "the output projection was planned on the host CPU but llama.cpp did not apply the tensor override"
        )
    return got
