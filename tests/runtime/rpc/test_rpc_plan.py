"""plan_split: units, and properties checked against an emulation of llama.cpp's layer assignment."""

from __future__ import annotations

import bisect
import itertools
import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydra_node.runtime.rpc import Capacity, PlanError, ProtoVersion, RPC_PROTO, WorkerInfo, plan_split
from hydra_node.runtime.rpc.plan import DEFAULT_SAFETY_MARGIN

MB = 1_000_000
OLD = ProtoVersion(6, 0, 0)


def w(wid: str, free: int, rtt: float = 1.0, proto: ProtoVersion = RPC_PROTO, device: str = "CPU") -> WorkerInfo:
    return WorkerInfo(wid, f"127.0.0.1:{5000 + sum(map(ord, wid))}", proto, free, rtt, device)


def f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def llama_assignment(n_layers: int, n_gpu_layers: int, tensor_split: tuple[float, ...]) -> list[int]:
    """Device index per block (-1 = host CPU), as llama-model.cpp load_tensors computes it in float32."""
    n_dev = len(tensor_split)
    splits, acc = [], f32(0.0)
    for x in tensor_split:
        acc = f32(acc + f32(x))
        splits.append(acc)
    splits = [f32(s / acc) for s in splits]
    i_gpu_start = max(n_layers + 1 - n_gpu_layers, 0)
    act = 0 if n_dev == 0 else min(n_gpu_layers, n_layers + 1)
    out = []
    for il in range(n_layers + 1):
        if il < i_gpu_start or il - i_gpu_start >= act:
            out.append(-1)
        else:
            out.append(bisect.bisect_right(splits, f32(f32(il - i_gpu_start) / act)))
    return out


def by_id_last_is_cpu(plan, workers) -> bool:
    last = [d for d in plan.devices if d.kind == "rpc"][-1]
    return next(x for x in workers if x.worker_id == last.worker_id).is_cpu


def check_invariants(
    plan, model_size, n_layers, host: Capacity, workers, max_memory=None, margin=DEFAULT_SAFETY_MARGIN
):
    n_blocks = n_layers + 1
    assert math.isclose(math.fsum(d.proportion for d in plan.devices), 1.0, abs_tol=1e-9)
    # contiguous, every block exactly once
    assert plan.devices[0].first_block == 0 and plan.devices[-1].stop_block == n_blocks
    for a, b in zip(plan.devices, plan.devices[1:]):
        assert a.stop_block == b.first_block
    by_id = {x.worker_id: x for x in workers}
    # Exactly one device holds the output projection: the host when the plan pins it there.
    holders = [d for d in plan.devices if d.holds_output]
    assert len(holders) == 1
    if plan.output_on_host:
        assert holders[0].kind == "host" and not host.has_gpu_device
        assert by_id_last_is_cpu(plan, workers)
    elif plan.split and not host.has_gpu_device:
        assert holders[0] is plan.devices[-1]
    # Memory: every block (incl. the output) is counted once, where its weights live.
    assert sum(round(d.proportion * n_blocks) for d in plan.devices) == n_blocks
    for d in plan.devices:
        assert d.n_blocks >= 0 and d.bytes_estimate <= d.usable_bytes
        if d.kind == "host":
            cap = host.free_bytes if max_memory is None else min(host.free_bytes, max_memory)
            assert d.usable_bytes <= cap * (1 - margin) + 1
        else:
            src = by_id[d.worker_id]
            assert d.n_blocks >= 1 and d.usable_bytes <= src.free_bytes * (1 - margin) + 1
            assert RPC_PROTO.accepts_worker(src.proto) and d.endpoint == src.endpoint
    rpc = [d for d in plan.devices if d.kind == "rpc"]
    assert plan.rpc_endpoints == tuple(d.endpoint for d in rpc)
    assert [d.name for d in rpc] == [f"RPC{i}" for i in range(len(rpc))]
    if not plan.split:
        assert plan.tensor_split == () and plan.n_gpu_layers == (n_blocks if host.has_gpu_device else 0)
        return
    # What llama.cpp will do with these arguments is exactly what the plan reports.
    got = llama_assignment(n_layers, plan.n_gpu_layers, plan.tensor_split)
    llama_devices = rpc + ([d for d in plan.devices if d.kind == "host"] if host.has_gpu_device else [])
    expected = []
    for d in plan.devices:
        idx = -1 if (d.kind == "host" and not host.has_gpu_device) else llama_devices.index(d)
        expected += [idx] * d.n_blocks
    assert got == expected


def test_fits_locally_means_no_split():
    plan = plan_split(100 * MB, 30, Capacity(1000 * MB), [w("a", 1000 * MB)])
    assert not plan.split and plan.reason == "fits_locally" and plan.rpc_endpoints == ()
    assert plan.n_gpu_layers == 0 and plan.devices[0].n_blocks == 31
    gpu = plan_split(100 * MB, 30, Capacity(1000 * MB, has_gpu_device=True), [])
    assert gpu.n_gpu_layers == 31


def test_too_large_for_host_splits_proportionally_to_free_memory():
    ws = [w("a", 50 * MB, 1.0), w("b", 60 * MB, 2.0)]  # neither alone holds the rest
    plan = plan_split(100 * MB, 30, Capacity(40 * MB), ws)
    assert plan.split and plan.reason == "too_large_for_host"
    names = [d.name for d in plan.devices]
    assert names == ["host", "RPC0", "RPC1"]  # CPU host: first blocks; workers after, in RTT order
    counts = {d.name: d.n_blocks for d in plan.devices}
    assert counts["RPC1"] > counts["RPC0"] >= counts["host"] - 1
    assert plan.tensor_split == (float(counts["RPC0"]), float(counts["RPC1"]))
    assert plan.n_gpu_layers == counts["RPC0"] + counts["RPC1"]
    check_invariants(plan, 100 * MB, 30, Capacity(40 * MB), ws)
    status = plan.to_status()
    assert status["devices"][1]["endpoint"] == ws[0].endpoint and status["tensor_split"] == list(plan.tensor_split)


def test_gpu_host_is_last_device():
    ws = [w("a", 60 * MB)]
    host = Capacity(60 * MB, has_gpu_device=True)
    plan = plan_split(100 * MB, 30, host, ws)
    assert [d.name for d in plan.devices] == ["RPC0", "host"]
    assert len(plan.tensor_split) == 2 and plan.n_gpu_layers == 31
    assert plan.devices[-1].stop_block == 31  # host computes the logits
    assert plan.devices[-1].holds_output and not plan.output_on_host  # as llama.cpp places it anyway
    check_invariants(plan, 100 * MB, 30, host, ws)


def test_cpu_host_keeps_the_output_projection_unless_a_gpu_worker_is_last():
    ws = [w("a", 50 * MB, 1.0), w("b", 60 * MB, 2.0)]
    plan = plan_split(100 * MB, 30, Capacity(40 * MB), ws)
    host, first, last = plan.devices
    assert plan.output_on_host and host.holds_output and not last.holds_output
    # llama.cpp's view: the output block (30) is the last worker's, one more than its memory share.
    assert last.stop_block == 31 and round(last.proportion * 31) == last.n_blocks - 1
    assert round(host.proportion * 31) == host.n_blocks + 1
    assert plan.to_status()["output_on_host"] is True
    gpu_last = plan_split(100 * MB, 30, Capacity(40 * MB), [ws[0], w("b", 60 * MB, 2.0, device="CUDA0")])
    assert not gpu_last.output_on_host and gpu_last.devices[-1].holds_output
    check_invariants(plan, 100 * MB, 30, Capacity(40 * MB), ws)
    # A host with room for the input embedding only cannot take the output block.
    tiny = plan_split(100 * MB, 30, Capacity(4 * MB), [w("a", 200 * MB)])
    assert not tiny.output_on_host and tiny.devices[-1].holds_output


def test_prefers_fewest_workers_then_lowest_rtt():
    small_near = [w("n1", 40 * MB, 0.1), w("n2", 40 * MB, 0.2)]
    big_far = w("far", 200 * MB, 50.0)
    plan = plan_split(100 * MB, 30, Capacity(20 * MB), small_near + [big_far])
    assert plan.rpc_endpoints == (big_far.endpoint,)
    twins = [w("slow", 200 * MB, 9.0), w("fast", 200 * MB, 3.0)]
    plan = plan_split(100 * MB, 30, Capacity(20 * MB), twins)
    assert plan.rpc_endpoints == (twins[1].endpoint,)


def test_force_split_uses_a_worker_even_when_the_model_fits():
    plan = plan_split(100 * MB, 30, Capacity(1000 * MB), [w("a", 1000 * MB)], force_split=True)
    assert plan.split and plan.reason == "forced" and len(plan.rpc_endpoints) == 1
    assert 10 <= plan.devices[1].n_blocks <= 21  # about half, by memory
    with pytest.raises(PlanError):
        plan_split(100 * MB, 30, Capacity(1000 * MB), [], force_split=True)


def test_max_memory_caps_the_host():
    ws = [w("a", 200 * MB)]
    assert not plan_split(100 * MB, 30, Capacity(1000 * MB), ws).split
    plan = plan_split(100 * MB, 30, Capacity(1000 * MB), ws, max_memory_bytes=50 * MB)
    assert plan.split and plan.devices[0].usable_bytes == 45 * MB


def test_incompatible_workers_are_refused_with_reason():
    ws = [w("old", 500 * MB, 0.1, OLD), w("new", 500 * MB, 5.0)]
    plan = plan_split(100 * MB, 30, Capacity(20 * MB), ws)
    assert plan.rpc_endpoints == (ws[1].endpoint,)
    assert plan.rejected == (("old", "RPC protocol 6.0.0 incompatible with ours 7.0.0"),)
    with pytest.raises(PlanError, match="old: RPC protocol 6.0.0 incompatible"):
        plan_split(100 * MB, 30, Capacity(20 * MB), ws[:1])
    newer_minor = w("minor", 500 * MB, proto=ProtoVersion(7, 1, 0))
    with pytest.raises(PlanError, match="incompatible"):
        plan_split(100 * MB, 30, Capacity(20 * MB), [newer_minor])


def test_nothing_fits_is_a_plan_error():
    with pytest.raises(PlanError, match="does not fit"):
        plan_split(100 * MB, 30, Capacity(20 * MB), [w("a", 20 * MB), w("b", 20 * MB)])
    with pytest.raises(PlanError, match="input embedding"):
        plan_split(100 * MB, 30, Capacity(1 * MB), [w("a", 500 * MB)])


def test_rejects_bad_arguments():
    with pytest.raises(ValueError):
        plan_split(0, 30, Capacity(MB), [])
    with pytest.raises(ValueError):
        plan_split(MB, 30, Capacity(MB), [w("a", MB), w("a", MB)])
    with pytest.raises(ValueError):
        WorkerInfo("x", "127.0.0.1:1", RPC_PROTO, -1)


@settings(max_examples=300, deadline=None)
@given(
    model=st.integers(1 * MB, 200 * MB),
    n_layers=st.integers(1, 80),
    host_frac=st.floats(0.0, 1.5),
    gpu=st.booleans(),
    force=st.booleans(),
    ws=st.lists(
        st.tuples(
            st.floats(0.0, 1.2),
            st.floats(0, 100, allow_nan=False),
            st.sampled_from([RPC_PROTO, RPC_PROTO, OLD, ProtoVersion(7, 0, 3)]),
            st.sampled_from(["CPU", "CPU", "CUDA0"]),
        ),
        max_size=6,
    ),
    max_frac=st.none() | st.none() | st.floats(0.01, 2.0),
    margin=st.sampled_from([0.0, 0.1, 0.3]),
)
def test_plan_properties(model, n_layers, host_frac, gpu, force, ws, max_frac, margin):
    """Frees are fractions of the model size so that every outcome occurs often."""
    host_free = int(model * host_frac)
    max_memory = None if max_frac is None else int(model * max_frac)
    workers = [
        WorkerInfo(f"w{i}", f"127.0.0.1:{6000 + i}", proto, int(model * frac), rtt, device)
        for i, (frac, rtt, proto, device) in enumerate(ws)
    ]
    host = Capacity(host_free, has_gpu_device=gpu)
    kw = dict(force_split=force, max_memory_bytes=max_memory, safety_margin=margin)
    try:
        plan = plan_split(model, n_layers, host, workers, **kw)
    except PlanError:
        # Then truly nothing fits: even every compatible worker plus the host is too small.
        block = -(-model // (n_layers + 2))
        hf = host_free if max_memory is None else min(host_free, max_memory)
        hu = int(hf * (1 - margin))
        if hu >= block:
            caps = [int(x.free_bytes * (1 - margin)) // block for x in workers if RPC_PROTO.accepts_worker(x.proto)]
            host_cap = min(n_layers + 1, (hu - block) // block)
            assert host_cap + sum(caps) < n_layers + 1 or (force and not any(caps))
        return
    check_invariants(plan, model, n_layers, host, workers, max_memory, margin)
    assert plan.split == (force or plan.reason == "too_large_for_host")
    # Deterministic and independent of the order workers are listed in.
    assert plan_split(model, n_layers, host, list(reversed(workers)), **kw) == plan
    if plan.split:
        # Fewest workers: no smaller set of compatible workers could have held the rest.
        block = -(-model // (n_layers + 2))
        host_dev = next(d for d in plan.devices if d.kind == "host")
        host_cap = min(n_layers + 1, (host_dev.usable_bytes - block) // block)
        need = n_layers + 1 - host_cap
        caps = [int(x.free_bytes * (1 - margin)) // block for x in workers if RPC_PROTO.accepts_worker(x.proto)]
        k = len(plan.rpc_endpoints)
        for smaller in range(max(1 if force else 0, 1), k):
            assert not any(sum(c) >= need for c in itertools.combinations(caps, smaller))
