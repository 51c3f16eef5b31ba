"""A model split over RPC workers of other mesh nodes, through encrypted tunnels.

Three real nodes on loopback in one mesh: two ``--no-model`` workers (each lending its
RPC worker, ``--max-memory 0.2``) and a coordinator whose ``--max-memory 0.06`` cannot
hold the bundled model, so it is split over one worker, reached only through the mesh.
One test walks the whole story to keep the node start-ups (the slow part) shared:

1. the split serves, with the worker leased to the coordinator, and greedy output equals
   an unsplit copy of the model that the other worker node hot-loads through the API (and
   unloads again; its RPC worker stays up);
2. the worker node in use is killed mid-generation: the coordinator replans onto the other
   worker (``last_heal.replan`` = ``replacement_worker``) and that request goes on there
   (``split_worker_lost`` is continued, test_split_heal_live.py), and the next request
   succeeds with the same output.

Lease refusals and tunnel bytes are in test_rpc_tunnel.py, the stall bound in
test_runner_stall.py.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from harness import NodeProcess, request  # noqa: E402

from hydra_node.models import BUNDLED_MODEL_ID, bundled_model_path  # noqa: E402

PROMPTS = ["def fib(n):", "The capital of France is", "1, 2, 3, 4,"]
MAX_TOKENS = 8
READY_TIMEOUT_S = 60.0


def _complete(node: NodeProcess, model: str, prompt: str, max_tokens: int = MAX_TOKENS) -> str:
    code, body = request(
        "POST",
        node.api_port,
        "/v1/completions",
        {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
        timeout=60,
    )
    assert code == 200, body
    return json.loads(body)["choices"][0]["text"]


def _split_of(st: dict) -> dict:
    return st["splits"][BUNDLED_MODEL_ID]


def _worker_peers(st: dict) -> list[str]:
    plan = _split_of(st).get("plan") or {}
    return [d["peer"] for d in plan.get("devices", []) if d["kind"] == "rpc"]


def _ready_split(st: dict) -> bool:
    s = st.get("splits", {}).get(BUNDLED_MODEL_ID)
    return bool(s and s["state"] == "ready" and s["split"])


@pytest.fixture
def nodes(tmp_path):
    started: list[NodeProcess] = []

    def start(name: str, *args: str, wait: bool = True) -> NodeProcess:
        n = NodeProcess(tmp_path / name, *args)
        started.append(n)
        return n.start(wait=wait)

    yield start
    for n in started:
        n.kill_all()


def test_split_over_mesh_tunnels(nodes, tmp_path):
    slow = tmp_path / "slow.toml"
    slow.write_text("[runner]\ninject_token_delay_ms = 40\n")
    w1 = nodes("w1", "--no-model", "--max-memory", "0.2", "--name", "w1")
    token = w1.invite()
    w2 = nodes("w2", "--no-model", "--max-memory", "0.2", "--name", "w2", "--join", token, wait=False)
    coord = nodes(
        "coord",
        "--max-memory",
        "0.06",
        "--no-rpc-worker",
        "--stall-timeout",
        "30",
        "--config",
        str(slow),
        "--join",
        token,
        wait=False,
    )
    w2.wait_ready()
    coord.wait_ready()
    workers = {w1.status()["node_id"]: w1, w2.status()["node_id"]: w2}
    st = coord.wait_status(_ready_split, timeout=READY_TIMEOUT_S, what="split model ready")
    split = _split_of(st)
    assert split["plan"]["reason"] == "too_large_for_host"
    (peer,) = _worker_peers(st)
    assert peer in workers
    host = [d for d in split["plan"]["devices"] if d["kind"] == "host"][0]
    remote = [d for d in split["plan"]["devices"] if d["kind"] == "rpc"][0]
    assert host["layers"][1] == remote["layers"][0] and remote["layers"][1] == 31
    assert remote["endpoint"].startswith("127.0.0.1:") and remote["tunnel"]["worker_proto"] == "7.0.0"
    used, spare = workers[peer], next(w for p, w in workers.items() if p != peer)
    lease = used.status()["rpc_worker"]["lease"]["leased_to"]
    assert lease.startswith(coord.status()["node_id"])

    split_texts = [_complete(coord, BUNDLED_MODEL_ID, p) for p in PROMPTS]
    # The bytes took the tunnel data connection (native pump), the output projection stayed home.
    remote = [d for d in _split_of(coord.status())["plan"]["devices"] if d["kind"] == "rpc"][0]
    assert remote["tunnel"]["data_connections"] >= 1 and remote["tunnel"]["data_fallback"] is None, remote
    assert host["holds_output"] and _split_of(st)["plan"]["output_on_host"]
    data = used.status()["rpc_worker"]["lease"]["data"]
    assert data["accepted"] >= 1 and data["rejected"] == {}, data

    # Hot swap on the spare worker node: an unsplit copy as the reference; its RPC worker stays up.
    worker_pid = spare.status()["rpc_worker"]["pid"]
    code, body = request(
        "POST",
        spare.console_port,
        "/api/runtime/models",
        {"model": f"ref={bundled_model_path()}", "wait": True, "timeout_s": 60},
        timeout=90,
    )
    assert code == 200, body
    assert json.loads(body)["split"] is False
    code, body = request("POST", spare.console_port, "/api/runtime/models", {"model": f"ref={bundled_model_path()}"})
    assert code == 409, body
    ref_texts = [_complete(spare, "ref", p) for p in PROMPTS]
    assert split_texts == ref_texts
    code, body = request("DELETE", spare.console_port, "/api/runtime/models/ref")
    assert code == 200, body
    st = spare.status()
    assert "ref" not in [m["id"] for m in st["models"]] and st["rpc_worker"]["pid"] == worker_pid
    assert request("DELETE", spare.console_port, "/api/runtime/models/ref")[0] == 404

    # Kill the worker node in use mid-generation: a replan onto the spare worker, and the stream goes on.
    conn = http.client.HTTPConnection("127.0.0.1", coord.api_port, timeout=60)
    conn.request(
        "POST",
        "/v1/completions",
        json.dumps(
            {
                "model": BUNDLED_MODEL_ID,
                "prompt": "Once upon a time",
                "max_tokens": 64,
                "temperature": 0,
                "stream": True,
            }
        ),
        {"Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    assert resp.status == 200
    first = resp.readline()
    assert first.startswith(b"data: ")
    os.killpg(used.proc.pid, signal.SIGKILL)
    rest = resp.read().decode()
    conn.close()
    assert '"error"' not in rest and "data: [DONE]" in rest, rest

    st = coord.wait_status(
        lambda s: _ready_split(s) and _worker_peers(s) != [peer], timeout=READY_TIMEOUT_S, what="replanned split ready"
    )
    assert _worker_peers(st) == [next(p for p in workers if p != peer)]
    heal = _split_of(st)["last_heal"]
    assert (heal["worker_lost"], heal["replan"], heal["workers"]) == (peer, "replacement_worker", _worker_peers(st))
    assert st["models"][0]["restarts"] >= 1
    # llama.cpp saw its tunnel socket close and aborted at once (not the stall bound's kill).
    assert "stalled" not in (st["models"][0]["last_error"] or ""), st["models"][0]["last_error"]
    assert _complete(coord, BUNDLED_MODEL_ID, PROMPTS[0]) == ref_texts[0]
    assert coord.proc.poll() is None
