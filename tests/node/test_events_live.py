"""``/api/events`` and ``/api/history`` on real nodes: A hosts the bundled model, B (no model) joins
A's mesh.  An SSE client on a real socket sees A's ``model.loaded`` replayed, ``request.finished``
after a chat, only newer events when it resumes with ``Last-Event-ID``; B sees A join with its
model; A sees B join and, after ``kill -9``, die within the membership bound; ``/api/history``
fills at the configured interval."""

from __future__ import annotations

import json
import os
import signal

import pytest
from events_sse import SseStream
from harness import NodeProcess, request
from waiting import poll_until

from hydra_node.models import BUNDLED_MODEL_ID

MODEL = BUNDLED_MODEL_ID
#: The membership defaults promise a kill -9 is noticed by every peer within this bound (tests/mesh).
DETECTION_BOUND_S = 10.0


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    root = tmp_path_factory.mktemp("events")
    cfg = root / "hydra.toml"
    cfg.write_text("[scheduler]\nhistory_interval_ms = 300\n[runner]\nrestart_backoff_initial_s = 0.1\n")
    a = NodeProcess(root / "a", "--config", str(cfg), "--name", "a").start()
    b = NodeProcess(root / "b", "--no-model", "--name", "b", "--join", a.invite()).start()
    try:
        ids = {"a": a.status()["node_id"], "b": b.status()["node_id"]}
        yield {"a": a, "b": b, "ids": ids}
    finally:
        a.kill_all()
        b.kill_all()


def chat(port: int) -> dict:
    code, body = request(
        "POST",
        port,
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8, "temperature": 0},
    )
    assert code == 200, body
    return json.loads(body)


def test_model_loaded_is_replayed_and_a_chat_ends_in_request_finished(mesh):
    a, a_id = mesh["a"], mesh["ids"]["a"]
    with SseStream(a.console_port, "/api/events?last_event_id=0") as stream:
        assert stream.status == 200
        loaded = stream.events_until(lambda e: e["event"] == "model.loaded", "model.loaded")[-1]
        assert loaded["data"]["model"] == MODEL and loaded["data"]["node_id"] == a_id
        assert loaded["data"]["id"] == loaded["id"] and isinstance(loaded["data"]["ts"], float)
        out = chat(a.api_port)
        done = stream.events_until(lambda e: e["event"] == "request.finished", "request.finished")[-1]["data"]
    assert (done["model"], done["target"], done["status"]) == (MODEL, a_id, "ok")
    assert done["completion_tokens"] == out["usage"]["completion_tokens"] > 0
    assert done["ttft_ms"] > 0 and done["duration_ms"] >= done["ttft_ms"]


def test_resume_with_last_event_id_gets_only_newer_events(mesh):
    a = mesh["a"]
    with SseStream(a.console_port, "/api/events?last_event_id=0&types=request.") as stream:
        seen = stream.events_until(lambda e: True, "a request.finished")
    last = seen[-1]["id"]
    chat(a.api_port)
    with SseStream(a.console_port, "/api/events", headers={"Last-Event-ID": str(last)}) as stream:
        got = stream.events_until(lambda e: e["event"] == "request.finished", "the new request.finished")
    assert got and all(e["id"] > last for e in got)
    assert [e["id"] for e in got] == sorted({e["id"] for e in got})


def test_history_fills_at_the_configured_interval(mesh):
    a = mesh["a"]

    def served_point():
        code, body = request("GET", a.console_port, "/api/history")
        assert code == 200, body
        data = json.loads(body)
        return data if any(p["requests"] >= 1 for p in data["series"]) else None

    chat(a.api_port)
    data = poll_until(served_point, timeout_s=20, what="a history point with a request")
    assert data["interval_s"] == 0.3 and data["capacity"] == 720
    busy = next(p for p in data["series"] if p["requests"] >= 1)
    assert busy["tok_s"] > 0 and busy["ttft_p50_ms"] > 0 and busy["ttft_p95_ms"] >= busy["ttft_p50_ms"]
    assert [p["ts"] for p in data["series"]] == sorted(p["ts"] for p in data["series"])
    _, body = request("GET", a.console_port, f"/api/history?since={data['series'][-1]['ts']}")
    assert all(p["ts"] > data["series"][-1]["ts"] for p in json.loads(body)["series"])


def test_peers_see_each_other_join_and_a_killed_peer_die(mesh):
    a, b, ids = mesh["a"], mesh["b"], mesh["ids"]
    with SseStream(b.console_port, "/api/events?last_event_id=0&types=peer.,model.") as stream:
        seen = stream.events_until(lambda e: e["event"] == "model.announced", "A's model announced")
    joined = [e["data"] for e in seen if e["event"] == "peer.joined"]
    assert joined and joined[0]["node_id"] == ids["a"] and joined[0]["name"] == "a" and joined[0]["addrs"]
    assert seen[-1]["data"] == {**seen[-1]["data"], "model": MODEL, "node_id": ids["a"]}
    with SseStream(a.console_port, "/api/events?last_event_id=0&types=peer.", timeout=DETECTION_BOUND_S + 5) as stream:
        first = stream.events_until(lambda e: e["event"] == "peer.joined", "B joined")[-1]
        assert first["data"]["node_id"] == ids["b"]
        b.kill_all()  # kill -9: no Leave
        after = stream.events_until(lambda e: e["event"] == "peer.dead", "B dead", timeout_s=DETECTION_BOUND_S + 5)
    assert after[-1]["data"]["node_id"] == ids["b"]
    assert "peer.left" not in [e["event"] for e in after]


def test_a_runner_killed_restarts_and_an_unload_is_reported(mesh):
    a, a_id = mesh["a"], mesh["ids"]["a"]
    with SseStream(a.console_port, "/api/events?types=runner.,model.", timeout=60) as stream:
        os.kill(a.runner_pid(), signal.SIGKILL)
        seen = stream.events_until(lambda e: e["event"] == "model.loaded", "the model loaded again", timeout_s=60)
        restarted = [e["data"] for e in seen if e["event"] == "runner.restarted"]
        assert restarted and restarted[0]["model"] == MODEL and restarted[0]["restarts"] >= 1
        assert restarted[0]["reason"]  # why the child ended
        code, body = request("DELETE", a.console_port, f"/api/runtime/models/{MODEL}")
        assert code == 200, body
        gone = stream.events_until(lambda e: e["event"] == "model.unloaded", "model.unloaded")[-1]["data"]
    assert gone == {**gone, "model": MODEL, "node_id": a_id}
