"""A real split: two loopback workers + a coordinator process, against the unsplit model."""

from __future__ import annotations

import signal

import pytest

from rpc_helpers import read_json_line

from hydra_node.runtime.rpc import RPC_PROTO

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Three reasons to learn Python:"]
#: Model load over RPC on a busy 2-core box.
LOAD_TIMEOUT = 120.0
#: How long llama.cpp may take to notice a dead worker.
DEATH_NOTICE_TIMEOUT = 30.0


def _spec(model_path, workers, **kw) -> dict:
    return {
        "model": str(model_path),
        "workers": workers,
        "host_free": 40_000_000,
        "prompts": PROMPTS,
        "max_tokens": 16,
        "mode": "compare",
        **kw,
    }


def test_split_over_two_workers_matches_unsplit_model(model_path, start_worker, run_child):
    (_, r1), (_, r2) = start_worker(), start_worker()
    assert r1["proto"] == r2["proto"] == str(RPC_PROTO)
    child = run_child(_spec(model_path, [r1, r2]))
    plan = read_json_line(child, LOAD_TIMEOUT)["plan"]
    assert plan["split"] and plan["reason"] == "too_large_for_host"
    assert [d["endpoint"] for d in plan["devices"] if d["kind"] == "rpc"] == [r1["endpoint"], r2["endpoint"]]

    evidence = read_json_line(child, LOAD_TIMEOUT)["evidence"]
    assert evidence["devices"] == evidence["registry"] == ["RPC0", "RPC1"]
    # Every block sits on the device the plan named (llama.cpp's own debug log).
    expected = {b: ("CPU" if d["kind"] == "host" else d["name"]) for d in plan["devices"] for b in range(*d["layers"])}
    assert {int(k): v for k, v in evidence["layers"].items()} == expected
    # And weights were really allocated on both workers.
    assert evidence["buffers"][f"RPC0[{r1['endpoint']}]"] > 1.0
    assert evidence["buffers"][f"RPC0[{r2['endpoint']}]"] > 1.0

    local_buffers = read_json_line(child, LOAD_TIMEOUT)["local_buffers"]
    assert not any(name.startswith("RPC") for name in local_buffers)
    for prompt in PROMPTS:
        row = read_json_line(child, LOAD_TIMEOUT)
        assert row["prompt"] == prompt
        assert row["split"]["ids"] == row["local"]["ids"]
        assert len(row["split"]["ids"]) == 16 and row["split"]["text"].strip()
    assert read_json_line(child, LOAD_TIMEOUT) == {"done": True}
    assert child.wait(10) == 0


def test_stalled_worker_hangs_coordinator_and_dead_worker_aborts_it(model_path, start_worker, run_child):
    """What llama.cpp does when a worker stops answering, then dies (see docs/splits.md).

    A stalled worker (SIGSTOP) blocks the coordinator indefinitely: ggml RPC has no
    timeouts, so the runner supervisor needs a token-stall bound.  A dead worker makes
    the coordinator abort (SIGABRT) at once: no reconnect, no error return.
    """
    (_, r1), (w2, r2) = start_worker(), start_worker()
    child = run_child(_spec(model_path, [r1, r2], mode="stream", max_tokens=2000))
    for _ in range(2):
        read_json_line(child, LOAD_TIMEOUT)  # plan, evidence
    for _ in range(3):
        assert "token" in read_json_line(child, LOAD_TIMEOUT)

    w2.send_signal(signal.SIGSTOP)
    while True:  # drain tokens already on their way
        try:
            read_json_line(child, 0.5)
        except TimeoutError:
            break
    with pytest.raises(TimeoutError):  # no token, no exit: blocked on the stalled worker
        read_json_line(child, 1.5)
    assert child.poll() is None

    w2.kill()
    w2.wait(10)
    assert child.wait(DEATH_NOTICE_TIMEOUT) == -signal.SIGABRT
    assert "Remote RPC server crashed" in child.stderr.read()
