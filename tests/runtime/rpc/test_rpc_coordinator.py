"""Runner-side checks that keep llama.cpp from aborting: all before any registration."""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from hydra_node.runtime.rpc import IncompatibleWorker, WorkerUnreachable
from hydra_node.runtime.rpc import proto as _proto
from hydra_node.runtime.child.rpc_coordinator import (
    LLAMA_SPLIT_MODE_LAYER,
    RpcRegistrationError,
    llama_kwargs_for_plan,
    placement_evidence,
    register_rpc_servers,
    rpc_devices,
)
from hydra_node.runtime.rpc.plan import Capacity, WorkerInfo, plan_split


class FakeOldWorker:
    """A loopback server answering HELLO as a protocol 6.2.0 worker would."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            conn.recv(1 + 8 + _proto.CONN_CAPS_SIZE)
            conn.sendall(struct.pack("<Q", 28) + bytes([6, 2, 0, 0]) + bytes(24))

    def close(self) -> None:
        self.sock.close()
        self.thread.join(5)


def test_incompatible_worker_is_refused_before_llama_sees_it():
    fake = FakeOldWorker()
    try:
        with pytest.raises(RpcRegistrationError, match="6.2.0") as exc:
            register_rpc_servers([fake.endpoint])
        assert isinstance(exc.value.__cause__, IncompatibleWorker)
    finally:
        fake.close()
    assert rpc_devices() == []


def test_unreachable_and_busy_workers_are_refused(start_worker):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(RpcRegistrationError) as exc:
        register_rpc_servers([dead], probe_timeout=1.0)
    assert isinstance(exc.value.__cause__, WorkerUnreachable)

    _, ready = start_worker()
    with socket.create_connection(("127.0.0.1", int(ready["endpoint"].split(":")[1]))) as holder:
        holder.sendall(_proto.encode_hello())  # another coordinator holds the worker
        holder.recv(64)
        with pytest.raises(RpcRegistrationError, match="serving another coordinator"):
            register_rpc_servers([ready["endpoint"]], probe_timeout=1.0)
    assert rpc_devices() == []


def test_bad_endpoint_lists():
    with pytest.raises(RpcRegistrationError, match="duplicate"):
        register_rpc_servers(["127.0.0.1:1", "127.0.0.1:1"])
    with pytest.raises(RpcRegistrationError, match="host:port"):
        register_rpc_servers(["127.0.0.1"])
    with pytest.raises(RpcRegistrationError, match="at most 16"):
        register_rpc_servers([f"127.0.0.1:{p}" for p in range(1, 18)])


def test_llama_kwargs_follow_the_plan():
    ws = [WorkerInfo("a", "127.0.0.1:7001", _proto.RPC_PROTO, 60_000_000)]
    split = plan_split(100_000_000, 30, Capacity(60_000_000), ws)
    kw = llama_kwargs_for_plan(split)
    assert kw == {
        "n_gpu_layers": split.n_gpu_layers,
        "tensor_split": list(split.tensor_split),
        "split_mode": LLAMA_SPLIT_MODE_LAYER,
    }
    local = plan_split(100_000_000, 30, Capacity(1_000_000_000), ws)
    assert llama_kwargs_for_plan(local) == {"n_gpu_layers": 0}


def test_placement_evidence_parses_llama_log():
    lines = [
        "load_tensors:   CPU_Mapped model buffer size =    92.10 MiB",
        "load_tensors: RPC0[127.0.0.1:5] model buffer size =    23.25 MiB",
        "unrelated",
    ]
    assert placement_evidence(lines) == {"CPU_Mapped": 92.1, "RPC0[127.0.0.1:5]": 23.25}


def test_llama_kwargs_pad_other_registered_devices():
    from hydra_node.runtime.child.rpc_coordinator import RpcDevice

    ws = [WorkerInfo("a", "127.0.0.1:7001", _proto.RPC_PROTO, 60_000_000)]
    split = plan_split(100_000_000, 30, Capacity(60_000_000), ws)
    registered = [RpcDevice("RPC0", "127.0.0.1:9999"), RpcDevice("RPC1", "127.0.0.1:7001")]
    kw = llama_kwargs_for_plan(split, registered)
    assert kw["tensor_split"] == [0.0, split.tensor_split[0]]
    with pytest.raises(RpcRegistrationError, match="not registered"):
        llama_kwargs_for_plan(split, registered[:1])


def test_missing_rpc_libraries_give_a_rebuild_hint(tmp_path):
    from hydra_node.runtime.rpc.ggml import Ggml, RpcUnavailable

    with pytest.raises(RpcUnavailable, match="-DGGML_RPC=on"):
        Ggml(tmp_path)


def test_verify_placement_against_llama_log():
    from hydra_node.runtime.child.rpc_coordinator import PlacementMismatch, verify_placement

    ws = [WorkerInfo("a", "127.0.0.1:7001", _proto.RPC_PROTO, 60_000_000)]
    plan = plan_split(100_000_000, 30, Capacity(60_000_000), ws)
    host, rpc = plan.devices
    assert plan.output_on_host and host.holds_output and not rpc.holds_output
    lines = [
        f"load_tensors: layer {b:3d} assigned to device {'CPU' if b < rpc.first_block else 'RPC0'}, is_swa = 0"
        for b in range(31)
    ]
    # llama.cpp still names the last worker for the output block; the override moves its weights.
    with pytest.raises(PlacementMismatch, match="did not apply the tensor override"):
        verify_placement(plan, lines)
    lines.append("tensor token_embd.weight (28 MiB q8_0) buffer type overridden to CPU")
    assert verify_placement(plan, lines)[30] == "RPC0"
    lines[rpc.first_block] = lines[rpc.first_block].replace("RPC0", "CPU")
    with pytest.raises(PlacementMismatch, match=f"{rpc.first_block}: \\('RPC0', 'CPU'\\)"):
        verify_placement(plan, lines)
