"""llama.cpp RPC workers, leases and memory-proportional layer splits.

Public surface (importing this package does not load llama.cpp):

* :mod:`.plan` – ``plan_split(...) -> SplitPlan`` (pure), ``Capacity``, ``WorkerInfo``, ``PlanError``.
* :mod:`.supervisor` – ``RpcWorkerSupervisor`` (trio) running ``python -m hydra_node.runtime.rpc.worker``.
* :mod:`.lease` – ``WorkerLease`` (one coordinator per worker).
* :mod:`.ggml` – the ctypes binding to ggml's RPC library, and the build check of the node.
* The runner's side (``register_rpc_servers``, ``llama_kwargs_for_plan``) is :mod:`hydra_node.runtime.child.rpc_coordinator`.
* :mod:`.readiness`, :mod:`.probe` – how a worker's version and memory are learnt.
"""

import importlib

#: Public name -> the submodule that defines it.  Loaded on first use (PEP 562), so the worker process
#: (``python -m hydra_node.runtime.rpc.worker``) does not pay for trio and the supervisor: it is a
#: process per machine, and every megabyte of it counts against the node's memory.
_SOURCES = {
    "proto": ("RPC_PROTO", "IncompatibleWorker", "ProtoVersion", "RpcProtocolError", "check_worker_proto"),
    "lease": ("LeaseError", "LeaseHeld", "LeaseNotHeld", "WorkerLease"),
    "plan": ("Capacity", "DevicePlacement", "PlanError", "SplitPlan", "WorkerInfo", "plan_split"),
    "probe": ("WorkerHello", "WorkerUnreachable", "probe_worker"),
    "readiness": ("BadReadiness", "Readiness", "StartFailure", "parse_readiness"),
    "supervisor": ("Backoff", "RpcWorkerSupervisor", "WorkerFailed", "WorkerState", "WorkerStatistics"),
}
_WHERE = {name: module for module, names in _SOURCES.items() for name in names}


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))


__all__ = [name for names in _SOURCES.values() for name in names]
