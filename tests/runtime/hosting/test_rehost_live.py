"""Growing back (docs/models.md), on real nodes on loopback: A hosts the bundled model, B and C are
``--standby`` (B offers more room: ``--max-memory``), D is an API-only worker; every node's config
asks ``[rehost].min_hosts`` 1 for the bundled model and for ``ghost``, a model whose file nobody
holds. A is killed with SIGKILL: exactly one node (B, the election's first) loads the model, C and
D stay without it, a chat sent to D is answered again, and B's event feed says
``model.rehosting`` then ``model.rehosted``. Meanwhile ``ghost`` fails on every candidate in turn
(no file to verify: a back-off each, the next one elected), and nothing crashes."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from events_sse import SseStream
from harness import NodeProcess, request
from waiting import poll_until

from hydra_node.models import BUNDLED_MODEL_ID

MODEL = BUNDLED_MODEL_ID
GHOST = "ghost-model"
TIMEOUT_S = 60.0
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0}


@pytest.fixture
def mesh(tmp_path):
    cfg = tmp_path / "hydra.toml"
    cfg.write_text(f'[rehost]\nsettle_s = 1\nmin_hosts = {{"{MODEL}" = 1, "{GHOST}" = 1}}\n')
    common = ("--config", str(cfg), "--no-rpc-worker")
    a = NodeProcess(tmp_path / "a", *common, "--name", "a")
    b = NodeProcess(tmp_path / "b", *common, "--standby", "--max-memory", "3", "--name", "b")
    c = NodeProcess(tmp_path / "c", *common, "--standby", "--max-memory", "2", "--name", "c")
    d = NodeProcess(tmp_path / "d", *common, "--no-model", "--name", "d")
    nodes = (a, b, c, d)
    try:
        a.start()
        for n in (b, c, d):
            n.args += ["--join", a.invite()]
            n.start(wait=False)
        for n in (b, c, d):
            n.wait_ready()
        yield {"a": a, "b": b, "c": c, "d": d, "config": cfg}
    finally:
        for n in nodes:
            n.kill_all()


def events(node: NodeProcess, model: str, until: str) -> list[dict]:
    """The node's buffered ``model.`` events about ``model``, up to the first of type ``until``."""
    sse = SseStream(node.console_port, "/api/events?last_event_id=0&types=model.", timeout=TIMEOUT_S)
    got = sse.events_until(lambda e: e["event"] == until and e["data"].get("model") == model, until, TIMEOUT_S)
    return [e["data"] for e in got if e["data"].get("model") == model]


def hosted(node: NodeProcess) -> list[str]:
    return [m["id"] for m in node.status()["models"]]


def test_a_model_whose_last_host_died_is_hosted_again_by_exactly_one_standby(mesh):
    a, b, c, d = mesh["a"], mesh["b"], mesh["c"], mesh["d"]
    ids = {n: mesh[n].status()["node_id"] for n in "abcd"}
    # ghost: nobody holds its file; B (first) and C (next, once B backs off) fail, nothing loads
    (b_fail,) = [e for e in events(b, GHOST, "model.rehost_failed") if e["type"] == "model.rehost_failed"]
    assert "no host announced its sha256" in b_fail["error"] and b_fail["retry_after_s"] == 30.0
    c_fail = [e for e in events(c, GHOST, "model.rehost_failed") if e["type"] == "model.rehost_failed"]
    assert c_fail[0]["ts"] > b_fail["ts"]  # elected only once B announced its back-off
    # the whole mesh sees A hosting the model (with its file) before it dies
    d.wait_status(
        lambda st: (
            any(p["id"] == ids["a"] and p["state"] == "alive" for p in st["peers"])
            and st["rehost"]["wanted"]
            and any(w["model"] == MODEL and w["live_hosts"] == 1 for w in st["rehost"]["wanted"])
        ),
        timeout=TIMEOUT_S,
        what="D sees A host the model",
    )
    b.wait_status(lambda st: not st["rehost"]["claims"], timeout=TIMEOUT_S, what="B holds no claim")
    killed_at = time.time()
    a.kill_all()  # SIGKILL: no hand-over, no leave

    b.wait_status(
        lambda st: any(m["id"] == MODEL and m["state"] == "ready" for m in st["models"]),
        timeout=TIMEOUT_S,
        what="B hosts the model again",
    )

    def answered() -> bool:
        code, body = request("POST", d.api_port, "/v1/chat/completions", CHAT, timeout=TIMEOUT_S)
        return code == 200 and bool(json.loads(body)["choices"])

    poll_until(answered, timeout_s=TIMEOUT_S, what="a chat to D answered", interval_s=0.5)
    answered_at = time.time()
    seen = [e["type"] for e in events(b, MODEL, "model.rehosted") if e["type"].startswith("model.rehost")]
    assert seen == ["model.rehosting", "model.rehosted"], seen
    rehosting = next(e for e in events(b, MODEL, "model.rehosting") if e["type"] == "model.rehosting")
    rehosted = next(e for e in events(b, MODEL, "model.rehosted") if e["type"] == "model.rehosted")
    print(  # the figure the issue asks for (no assertion on it): last host killed → answering again
        f"rehost: killed→rehosting {rehosting['ts'] - killed_at:.1f} s, →rehosted {rehosted['ts'] - killed_at:.1f} s "
        f"(load {rehosted['load_s']} s), →a chat to D answered {answered_at - killed_at:.1f} s"
    )
    assert rehosting["reason"] == "min_hosts" and rehosting["rank"] == 0 and rehosting["candidates"][0] == ids["b"]
    # exactly one: C (the other standby) and D (a worker) stay without it
    assert hosted(c) == [] and hosted(d) == []
    assert MODEL not in c.status()["rehost"]["claims"]
    assert b.status()["rehost"]["counters"]["rehosted"] == 1

    # hydra-node models min-hosts: set on the running node (D) and written into its config file
    cfg = mesh["config"]
    cli = [sys.executable, "-m", "hydra_node.cli", "models", "min-hosts", "--console", str(d.console_port)]
    done = subprocess.run([*cli, GHOST, "0"], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    assert f"written to {cfg}" in done.stdout and f'"{GHOST}" = 0' in cfg.read_text()
    listed = subprocess.run(cli, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert listed.returncode == 0 and f"{MODEL}: min_hosts 1  live hosts 1" in listed.stdout, listed.stdout
    code, body = request("POST", d.console_port, "/api/rehost/min-hosts", {"model": GHOST, "min_hosts": 99})
    assert code == 400 and json.loads(body)["error"]["param"] == "min_hosts", body
