"""Memory-proportional layer splits over RPC workers (pure: no I/O, no clock).

Model of llama.cpp 0.3.36 (``llama-model.cpp: load_tensors``), used throughout:

* A model has ``n_layers`` repeating layers plus an output layer: ``n_layers + 1``
  offloadable *blocks*, numbered ``0..n_layers`` (block ``n_layers`` is the output).
  The input embedding always stays on the host CPU.
* llama.cpp's device list is the RPC devices in registration order, then local GPUs;
  CPUs are never in it.  ``n_gpu_layers = g`` offloads the *last* ``g`` blocks; the first
  ``n_layers + 1 - g`` stay on the host CPU.  ``tensor_split`` (one value per listed
  device) divides the offloaded blocks in order: normalised cumulative shares.
* So on a CPU-only host the host holds the first blocks and the workers the rest (the
  last worker computes the logits); on a host whose memory is a GPU device the host
  is last in ``tensor_split`` and holds the last blocks, as in mesh-llm and tightwad.
* **Output head on the host.**  On a CPU-only host whose last chosen worker is a CPU too,
  the output layer's weight matrix (``output.weight``, or ``token_embd.weight`` that tied
  models reuse) is pinned to the host's CPU with a llama.cpp tensor buffer-type override
  (``SplitPlan.output_on_host``).  llama.cpp still lists the output block under the last
  worker (its ``output_norm`` runs there), but the vocabulary projection runs on the host,
  so each decoded token brings back the hidden state (``n_embd`` floats: 2.3 KB for
  SmolLM2) instead of the logits (``n_vocab`` floats: 196 KB for SmolLM2, 0.5 MB for a
  128k vocabulary).  With a GPU worker last we leave the projection on its GPU.  In memory
  terms the output block then belongs to the host: the host's count includes it and the
  last worker's excludes it (its llama.cpp range is one block longer than its count).
* We pass ``tensor_split`` as whole block counts: llama.cpp normalises them, and a
  count boundary ``c/total`` then compares exactly equal to ``float(j)/total``, so the
  blocks land exactly where the plan says (fractional shares can round across).

Sizes are estimates: every block, and the input embedding, is taken to weigh
``ceil(model_size_bytes / (n_layers + 2))``, plus ``kv_bytes_per_layer`` for a block's
KV cache; each device may fill ``(1 - safety_margin)`` of its free memory.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from hydra_node.runtime.rpc.proto import GGML_RPC_MAX_SERVERS, RPC_PROTO, ProtoVersion

#: Default share of each device's free memory left unplanned (compute buffers, OS).
DEFAULT_SAFETY_MARGIN = 0.10

Reason = Literal["fits_locally", "forced", "too_large_for_host"]
DeviceKind = Literal["host", "rpc"]
#: (name, kind, worker id, endpoint, blocks it can hold, blocks assigned, usable bytes), in split order
_Entry = tuple[str, DeviceKind, str | None, str | None, int, int, int]


class PlanError(Exception):
    """No placement satisfies the memory and version constraints; the message says why."""


@dataclass(frozen=True)
class Capacity:
    """The host that will run llama.cpp (the coordinator)."""

    free_bytes: int
    #: True when the host's memory is a llama.cpp GPU device (it is then last in tensor_split).
    has_gpu_device: bool = False

    def __post_init__(self) -> None:
        if self.free_bytes < 0:
            raise ValueError("free_bytes must be >= 0")


@dataclass(frozen=True)
class WorkerInfo:
    """An RPC worker as a coordinator sees it (readiness line / gossip + measured RTT)."""

    worker_id: str
    endpoint: str  # how the coordinator reaches it (a local tunnel port for remote workers)
    proto: ProtoVersion
    free_bytes: int  # already capped by the worker's --max-memory-bytes
    rtt_ms: float = 0.0
    device: str = "CPU"  # ggml device name the worker computes on ("CPU", "CUDA0", ...)

    @property
    def is_cpu(self) -> bool:
        return self.device.upper().startswith("CPU")

    def __post_init__(self) -> None:
        if self.free_bytes < 0 or not math.isfinite(self.rtt_ms) or self.rtt_ms < 0:
            raise ValueError(f"worker {self.worker_id!r}: free_bytes and rtt_ms must be >= 0")


@dataclass(frozen=True)
class DevicePlacement:
    name: str  # "host", or llama.cpp's name "RPC<i>" in a fresh runner
    kind: DeviceKind
    worker_id: str | None
    endpoint: str | None
    first_block: int  # llama.cpp assigns blocks [first_block, stop_block) here
    stop_block: int
    bytes_estimate: int
    usable_bytes: int
    proportion: float  # share of all blocks' memory
    holds_output: bool = False  # the output projection's weights live here

    @property
    def n_blocks(self) -> int:
        return self.stop_block - self.first_block


@dataclass(frozen=True)
class SplitPlan:
    split: bool
    reason: Reason
    model_size_bytes: int
    n_layers: int
    devices: tuple[DevicePlacement, ...]  # in block order
    rpc_endpoints: tuple[str, ...]  # registration order == llama.cpp device order
    tensor_split: tuple[float, ...]  # per llama.cpp device: block counts
    n_gpu_layers: int
    rejected: tuple[tuple[str, str], ...] = field(default=())  # (worker_id, why)
    #: Pin the output projection to the host CPU (a tensor override; see the module notes).
    output_on_host: bool = False

    def to_status(self) -> dict[str, Any]:
        """Plain-data view for ``/api/status``."""
        return {
            "split": self.split,
            "reason": self.reason,
            "n_layers": self.n_layers,
            "n_gpu_layers": self.n_gpu_layers,
            "tensor_split": list(self.tensor_split),
            "output_on_host": self.output_on_host,
            "devices": [
                {
                    "name": d.name,
                    "kind": d.kind,
                    "worker_id": d.worker_id,
                    "endpoint": d.endpoint,
                    "layers": [d.first_block, d.stop_block],
                    "holds_output": d.holds_output,
                    "bytes_estimate": d.bytes_estimate,
                    "proportion": d.proportion,
                }
                for d in self.devices
            ],
            "rejected": [{"worker_id": w, "reason": r} for w, r in self.rejected],
        }


def _usable(free: int, margin: float) -> int:
    return int(free * (1.0 - margin))


def _allocate(n_blocks: int, usable: list[int], caps: list[int], lower: list[int]) -> list[int]:
    """Blocks per device: proportional to ``usable``, within ``[lower, caps]``.

    One block at a time to the device furthest below its ideal share that has room;
    ties go to the earlier device.  Requires ``sum(lower) <= n_blocks <= sum(caps)``.
    """
    total = sum(usable)
    ideal = [n_blocks * u / total if total else 0.0 for u in usable]
    counts = list(lower)
    for _ in range(n_blocks - sum(counts)):
        best = max((i for i in range(len(counts)) if counts[i] < caps[i]), key=lambda i: (ideal[i] - counts[i], -i))
        counts[best] += 1
    return counts


def _choose(cands: list[tuple[WorkerInfo, int]], need: int, at_least: int) -> tuple[WorkerInfo, ...] | None:
    """Fewest workers whose capacities cover ``need`` blocks; then lowest total RTT,
    then most capacity, then worker ids.  ``cands`` is at most GGML_RPC_MAX_SERVERS long."""
    for k in range(max(at_least, 1), len(cands) + 1):
        best_key, best = None, None
        for combo in itertools.combinations(cands, k):
            if sum(c for _, c in combo) < need:
                continue
            key = (
                sum(w.rtt_ms for w, _ in combo),
                -sum(c for _, c in combo),
                tuple(sorted(w.worker_id for w, _ in combo)),
            )
            if best_key is None or key < best_key:
                best_key, best = key, combo
        if best is not None:
            return tuple(w for w, _ in sorted(best, key=lambda wc: (wc[0].rtt_ms, wc[0].worker_id)))
    return None


def plan_split(
    model_size_bytes: int,
    n_layers: int,
    host: Capacity,
    workers: list[WorkerInfo],
    *,
    force_split: bool = False,
    max_memory_bytes: int | None = None,
    safety_margin: float = DEFAULT_SAFETY_MARGIN,
    kv_bytes_per_layer: int = 0,
    ours: ProtoVersion = RPC_PROTO,
) -> SplitPlan:
    """Decide where each block of a model goes; raise :class:`PlanError` if nothing fits.

    Split when the model does not fit the host's usable memory (its free memory, capped
    by ``max_memory_bytes``), or when ``force_split``.  Workers are chosen by
    :func:`_choose` among those with a compatible protocol and room for a block.
    """
    if model_size_bytes <= 0 or n_layers <= 0:
        raise ValueError("model_size_bytes and n_layers must be positive")
    if not 0.0 <= safety_margin < 1.0 or kv_bytes_per_layer < 0:
        raise ValueError("safety_margin must be in [0, 1) and kv_bytes_per_layer >= 0")
    ids = [w.worker_id for w in workers]
    eps = [w.endpoint for w in workers]
    if len(set(ids)) != len(ids) or len(set(eps)) != len(eps):
        raise ValueError("worker ids and endpoints must be unique")

    n_blocks = n_layers + 1
    block = -(-model_size_bytes // (n_layers + 2))
    cost = block + kv_bytes_per_layer
    host_free = host.free_bytes if max_memory_bytes is None else min(host.free_bytes, max_memory_bytes)
    host_usable = _usable(host_free, safety_margin)
    if host_usable < block:
        raise PlanError(
            f"host has {host_usable} usable bytes, less than the input embedding "
            f"(~{block} bytes) that llama.cpp always keeps on the host"
        )
    host_cap = min(n_blocks, (host_usable - block) // cost)

    if host_cap >= n_blocks and not force_split:
        return _local_plan(model_size_bytes, n_layers, host, host_usable, block, cost)

    rejected: list[tuple[str, str]] = []
    cands: list[tuple[WorkerInfo, int]] = []
    for w in sorted(workers, key=lambda w: (w.rtt_ms, w.worker_id)):
        cap = min(n_blocks, _usable(w.free_bytes, safety_margin) // cost)
        if not ours.accepts_worker(w.proto):
            rejected.append((w.worker_id, f"RPC protocol {w.proto} incompatible with ours {ours}"))
        elif cap < 1:
            rejected.append((w.worker_id, f"{w.free_bytes} free bytes hold no layer (~{cost} bytes)"))
        elif len(cands) >= GGML_RPC_MAX_SERVERS:
            rejected.append((w.worker_id, f"beyond the {GGML_RPC_MAX_SERVERS} lowest-RTT workers"))
        else:
            cands.append((w, cap))
    need = n_blocks - host_cap
    chosen = _choose(cands, need, 1 if force_split else 0)
    if chosen is None:
        why = "; ".join(f"{w}: {r}" for w, r in rejected) or "none rejected"
        raise PlanError(
            f"model of {model_size_bytes} bytes ({n_blocks} layers of ~{cost} bytes) does not fit: "
            f"host holds {host_cap} layers, {len(cands)} usable workers hold "
            f"{sum(c for _, c in cands)} more, {need} needed ({why})"
        )
    caps = {w.worker_id: c for w, c in cands}
    # The output projection stays on a CPU-only host when the last worker is a CPU too
    # (module notes); the host then needs room for at least that block.
    output_on_host = not host.has_gpu_device and host_cap >= 1 and chosen[-1].is_cpu

    usable = [_usable(w.free_bytes, safety_margin) for w in chosen] + [host_usable - block]
    counts = _allocate(
        n_blocks,
        usable,
        [caps[w.worker_id] for w in chosen] + [host_cap],
        [1] * len(chosen) + [1 if output_on_host else 0],
    )
    worker_counts, host_count = counts[:-1], counts[-1]
    # Blocks llama.cpp assigns to each device: the output block is the last worker's in its
    # eyes even when its weights are pinned to the host.
    assigned = list(counts)
    if output_on_host:
        assigned[-2] += 1
        assigned[-1] -= 1
    rpc: list[_Entry] = [
        (f"RPC{i}", "rpc", w.worker_id, w.endpoint, c, a, u)
        for i, (w, c, a, u) in enumerate(zip(chosen, worker_counts, assigned, usable))
    ]
    host_entry: _Entry = ("host", "host", None, None, host_count, assigned[-1], host_usable)
    if host.has_gpu_device:
        order, tensor_split, ngl = rpc + [host_entry], tuple(float(a) for a in assigned), n_blocks
        output_holder = "host"
    else:
        order, ngl = [host_entry] + rpc, n_blocks - assigned[-1]
        tensor_split = tuple(float(a) for a in assigned[:-1])
        output_holder = "host" if output_on_host else rpc[-1][0]
    devices, start = [], 0
    for name, kind, wid, ep, c, a, u in order:
        devices.append(
            DevicePlacement(
                name,
                kind,
                wid,
                ep,
                start,
                start + a,
                c * cost + (block if kind == "host" else 0),
                u,
                c / n_blocks,
                name == output_holder,
            )
        )
        start += a
    return SplitPlan(
        True,
        "forced" if force_split and host_cap >= n_blocks else "too_large_for_host",
        model_size_bytes,
        n_layers,
        tuple(devices),
        tuple(w.endpoint for w in chosen),
        tensor_split,
        ngl,
        tuple(rejected),
        output_on_host,
    )


def _local_plan(model_size_bytes: int, n_layers: int, host: Capacity, usable: int, block: int, cost: int) -> SplitPlan:
    n_blocks = n_layers + 1
    dev = DevicePlacement("host", "host", None, None, 0, n_blocks, n_blocks * cost + block, usable, 1.0, True)
    return SplitPlan(
        False, "fits_locally", model_size_bytes, n_layers, (dev,), (), (), n_blocks if host.has_gpu_device else 0
    )
