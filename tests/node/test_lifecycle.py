"""Supervision and lifecycle of a live node: crashes, restarts, shutdown, isolation, limits."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from harness import NodeProcess, pids_with_parent, request
from hydra_node.models import BUNDLED_MODEL_ID

MODEL = BUNDLED_MODEL_ID
# Greedy counting goes on for thousands of tokens: a generation that will not end by itself.
LONG = {"model": MODEL, "prompt": "1, 2, 3, 4, 5, 6,", "max_tokens": 3000, "temperature": 0, "stream": True}


def open_stream(port: int, body: dict) -> tuple[socket.socket, bytes]:
    """Start a streaming request on a raw socket; return it once the first SSE event arrived."""
    payload = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload
    )
    data = b""
    while b"data: " not in data:
        chunk = s.recv(65536)
        assert chunk, data
        data += chunk
    return s, data


def read_to_end(s: socket.socket, data: bytes = b"") -> bytes:
    while not data.endswith(b"0\r\n\r\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


@pytest.fixture
def node(tmp_path):
    n = NodeProcess(tmp_path / "home").start()
    yield n
    n.kill_all()


def test_runner_kill_9_mid_stream_gives_clean_error_and_restarts(node):
    pid = node.runner_pid()
    s, data = open_stream(node.api_port, LONG)
    os.kill(pid, signal.SIGKILL)
    data = read_to_end(s, data).decode()
    s.close()
    assert '"error"' in data and "runner" in data  # a final SSE error event, not a hang or a reset
    assert data.rstrip().endswith("0")  # the chunked body was terminated properly
    st = node.wait_status(
        lambda st: st["models"][0]["state"] == "ready" and st["models"][0]["pid"] != pid, what="runner restarted"
    )
    assert st["runner_restarts"] >= 1
    code, body = request(
        "POST", node.api_port, "/v1/completions", {"model": MODEL, "prompt": "Hello", "max_tokens": 4, "temperature": 0}
    )
    assert code == 200, body
    assert node.proc.poll() is None


def test_client_disconnect_cancels_generation_promptly(node):
    s, _ = open_stream(node.api_port, LONG)
    s.close()
    st = node.wait_status(
        lambda st: st["inflight_requests"] == 0 and st["queue_depth"] == 0,
        timeout=5,
        what="generation cancelled after disconnect",
    )
    assert st["models"][0]["requests"]["cancelled"] == 1  # the runner acknowledged the cancellation
    t = time.monotonic()
    code, _ = request(
        "POST", node.api_port, "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "temperature": 0}
    )
    assert code == 200 and time.monotonic() - t < 30


def test_sigterm_ends_streams_with_error_and_leaves_nothing_behind(node):
    runner = node.runner_pid()
    worker = node.wait_status(lambda st: st["rpc_worker"]["state"] == "ready", timeout=30, what="RPC worker ready")[
        "rpc_worker"
    ]["pid"]
    s, data = open_stream(node.api_port, LONG)
    assert sorted(pids_with_parent(node.proc.pid)) == sorted([runner, worker])
    node.proc.send_signal(signal.SIGTERM)
    data = read_to_end(s, data).decode()
    s.close()
    assert "node_shutting_down" in data and "data: [DONE]" in data
    assert node.proc.wait(30) == 0
    for pid in (runner, worker):
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    run_dir = node.home / "run"
    assert not list(run_dir.glob("*.pid")), list(run_dir.iterdir())
    assert not (run_dir / "ports.json").exists()


def test_two_nodes_with_different_homes_do_not_interfere(tmp_path):
    a = NodeProcess(tmp_path / "a").start(wait=False)
    b = NodeProcess(tmp_path / "b").start(wait=False)
    try:
        a.wait_ready()
        b.wait_ready()
        sa, sb = a.status(), b.status()
        assert sa["node_id"] != sb["node_id"]
        assert a.api_port != b.api_port and a.console_port != b.console_port
        assert sa["models"][0]["pid"] != sb["models"][0]["pid"]
        body = {"model": MODEL, "prompt": "The sky is", "max_tokens": 6, "temperature": 0}
        assert request("POST", a.api_port, "/v1/completions", body)[0] == 200
        assert request("POST", b.api_port, "/v1/completions", body)[0] == 200
        assert a.stop() == 0
        assert b.status()["node_state"] == "serving"
        assert (b.home / "run" / "node.pid").exists() and not (a.home / "run" / "node.pid").exists()
        # a second node on a home that is in use is refused
        dup = subprocess.run(
            [sys.executable, "-m", "hydra_node.cli", "serve", "--home", str(b.home), "--port", "0", "--console", "0"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert dup.returncode == 1 and "already running" in dup.stderr
    finally:
        a.kill_all()
        b.kill_all()


def test_queue_overflow_is_429_with_retry_after(tmp_path):
    cfg = tmp_path / "hydra.toml"
    cfg.write_text("[defaults.throughput]\nqueue_size = 1\nparallel = 1\n")  # one slot: the second request waits
    n = NodeProcess(tmp_path / "home", "--config", str(cfg)).start()
    socks = []
    try:
        socks.append(open_stream(n.api_port, LONG)[0])  # running
        results = []

        def queued():
            results.append(
                request("POST", n.api_port, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1})
            )

        t = threading.Thread(target=queued, daemon=True)
        t.start()
        n.wait_status(lambda st: st["queue_depth"] == 1, timeout=10, what="one request queued")
        conn = http.client.HTTPConnection("127.0.0.1", n.api_port, timeout=30)
        conn.request("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": "y", "max_tokens": 1}))
        r = conn.getresponse()
        body = json.loads(r.read())
        assert r.status == 429 and int(r.getheader("Retry-After")) >= 1
        assert body["error"]["code"] == "queue_full"
        socks[0].close()
        t.join(30)
        assert results and results[0][0] == 200
    finally:
        for s in socks:
            s.close()
        n.kill_all()


def test_listen_all_requires_api_key(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "hydra_node.cli", "serve", "--home", str(tmp_path), "--listen-all"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HYDRA_API_KEY": ""},
    )
    assert r.returncode == 2 and "API key" in r.stderr


def test_api_key_is_enforced_and_headless_hides_console(tmp_path):
    n = NodeProcess(tmp_path / "home", "--listen-all", "--api-key", "s3cret-key", "--headless").start()
    try:
        assert request("GET", n.api_port, "/v1/models")[0] == 401
        assert request("GET", n.api_port, "/v1/models", headers={"Authorization": "Bearer wrong-key"})[0] == 401
        assert request("GET", n.api_port, "/v1/models", headers={"Authorization": "Bearer s3cret-key"})[0] == 200
        assert request("GET", n.console_port, "/health")[0] == 200
        assert request("GET", n.console_port, "/", headers={"Authorization": "Bearer s3cret-key"})[0] == 404
        code, body = request("GET", n.console_port, "/api/status", headers={"Authorization": "Bearer s3cret-key"})
        assert code == 200
    finally:
        n.kill_all()


def test_crash_loop_is_reported_as_failed(tmp_path):
    cfg = tmp_path / "hydra.toml"
    cfg.write_text(
        "[runner]\ncrash_loop_restarts = 2\ncrash_loop_window_s = 60.0\n"
        "restart_backoff_initial_s = 0.1\nfailed_retry_s = 4\n"
    )
    n = NodeProcess(tmp_path / "home", "--config", str(cfg)).start()
    try:
        for _ in range(2):
            pid = n.wait_status(lambda st: st["models"][0]["state"] == "ready", what="ready")["models"][0]["pid"]
            os.kill(pid, signal.SIGKILL)
            n.wait_status(lambda st, pid=pid: st["models"][0]["pid"] != pid, what="runner gone")
        st = n.wait_status(lambda st: st["models"][0]["state"] == "failed", what="failed state")
        assert "killed by signal 9" in st["models"][0]["last_error"]
        code, body = request("POST", n.api_port, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1})
        assert code == 503 and "failed" in json.loads(body)["error"]["message"]
        for port in (n.console_port, n.api_port):  # the node is up, and says a model failed
            code, body = request("GET", port, "/health")
            assert code == 503 and json.loads(body) == {"status": "degraded", "failed_models": [MODEL]}
        # after failed_retry_s the runner is tried again, and serves
        n.wait_status(lambda st: st["models"][0]["state"] == "ready", what="ready after the retry")
        code, _ = request("POST", n.api_port, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1})
        assert code == 200 and request("GET", n.console_port, "/health")[0] == 200
    finally:
        n.kill_all()


def test_unloadable_model_fails_start_with_clear_error(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(4096))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "hydra_node.cli",
            "serve",
            "--home",
            str(tmp_path / "h"),
            "--port",
            "0",
            "--console",
            "0",
            "--model",
            str(bad),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1 and "failed to load" in r.stderr
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "hydra_node.cli",
            "serve",
            "--home",
            str(tmp_path / "h"),
            "--model",
            str(tmp_path / "missing.gguf"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "neither the bundled id" in r.stderr


def test_stale_pid_files_and_orphans_are_cleaned_on_start(tmp_path):
    from hydra_node.pidfile import write_pidfile

    home = tmp_path / "home"
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead_owner = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_owner.wait()
    write_pidfile(home / "run" / "runner-old.pid", orphan.pid, ["x"], kind="runner", owner_pid=dead_owner.pid)
    write_pidfile(home / "run" / "runner-stale.pid", gone.pid, ["x"], kind="runner")
    n = NodeProcess(home).start()
    try:
        assert orphan.wait(10) == -signal.SIGKILL
        assert not (home / "run" / "runner-stale.pid").exists()
        assert not (home / "run" / "runner-old.pid").exists()
    finally:
        n.kill_all()
        if orphan.poll() is None:
            orphan.kill()
