"""llama.cpp RPC workers, leases and memory-proportional layer splits.

Public surface (importing this package does not load llama.cpp):

* :mod:`.plan` – ``plan_split(...) -> SplitPlan`` (pure), ``Capacity``, ``WorkerInfo``, ``PlanError``.
* :mod:`.supervisor` – ``RpcWorkerSupervisor`` (trio) running ``python -m hydra_node.runtime.rpc.worker``.
* :mod:`.lease` – ``WorkerLease`` (one coordinator per worker).
* :mod:`.coordinator` – in a runner process: ``register_rpc_servers``, ``llama_kwargs_for_plan``.
* :mod:`.readiness`, :mod:`.probe` – how a worker's version and memory are learnt.
"""

from hydra_node.runtime.rpc._proto import RPC_PROTO, IncompatibleWorker, ProtoVersion, RpcProtocolError, check_worker_proto
from hydra_node.runtime.rpc.lease import LeaseError, LeaseHeld, LeaseNotHeld, WorkerLease
from hydra_node.runtime.rpc.plan import Capacity, DevicePlacement, PlanError, SplitPlan, WorkerInfo, plan_split
from hydra_node.runtime.rpc.probe import WorkerHello, WorkerUnreachable, probe_worker
from hydra_node.runtime.rpc.readiness import BadReadiness, Readiness, StartFailure, parse_readiness
from hydra_node.runtime.rpc.supervisor import Backoff, RpcWorkerSupervisor, WorkerFailed, WorkerState, WorkerStatistics

__all__ = [
    "RPC_PROTO", "IncompatibleWorker", "ProtoVersion", "RpcProtocolError", "check_worker_proto",
    "LeaseError", "LeaseHeld", "LeaseNotHeld", "WorkerLease",
    "Capacity", "DevicePlacement", "PlanError", "SplitPlan", "WorkerInfo", "plan_split",
    "WorkerHello", "WorkerUnreachable", "probe_worker",
    "BadReadiness", "Readiness", "StartFailure", "parse_readiness",
    "Backoff", "RpcWorkerSupervisor", "WorkerFailed", "WorkerState", "WorkerStatistics",
]
