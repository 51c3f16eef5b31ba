"""Abuse of a live node's HTTP ports (issue 14 items 1, 5, 6, 8; issue 13 item 5), bounded and
fuzz-free: each attack is made once against a real ``hydra-node serve`` and must get its refusal
while the node stays up and answers ``/health``.

| attack | what it gets |
|---|---|
| DNS rebinding: a foreign ``Host`` on either loopback port | 403 ``forbidden_host`` |
| CSRF: a form POST / foreign ``Origin`` to the management API | 415 / 403, nothing changes |
| reading ``/api/status`` for an invite token | no token there (``POST /api/invite`` or the CLI) |
| a non-ASCII ``Authorization`` value | 401, not 500 |
| ``Expect: 100-continue`` with a big body (curl) | ``100 Continue`` at once, no 1 s stall |
| a browser preflight from an allowed / foreign origin | 204 with CORS headers / 403 |
| 520 idle connections from one address | ``/health`` still answered, other addresses unaffected |
| a slowloris request head | 408 and closed at the head deadline |
| pipelining junk behind a streaming response | read only up to a bound: the node's RSS stays flat |
| pipelining ``GET /health`` on either port, never reading the answers | buffered only up to a bound: RSS stays flat |
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time

import pytest

from harness import SHARED_API_KEY, SHARED_CORS_ORIGIN, request
from hydra_node.models import BUNDLED_MODEL_ID

KEY = SHARED_API_KEY
ORIGIN = SHARED_CORS_ORIGIN
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def node(shared_keyed_node):
    """The session's shared keyed node (tests/conftest.py): it requires KEY and allows ORIGIN."""
    return shared_keyed_node


def _raw(port: int, data: bytes, source: str = "127.0.0.1", timeout: float = 30) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0)) as s:
        s.sendall(data)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return out
            out += chunk


def _status_and_body(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_foreign_host_is_refused_on_both_ports(node):
    for port in (node.api_port, node.console_port):
        status, body = _status_and_body(
            _raw(port, b"GET /api/status HTTP/1.1\r\nHost: rebind.evil.example:3131\r\nConnection: close\r\n\r\n")
        )
        assert status == 403 and body["error"]["code"] == "forbidden_host"
        ok = _raw(port, f"GET /health HTTP/1.1\r\nHost: localhost:{port}\r\nConnection: close\r\n\r\n".encode())
        assert ok.startswith(b"HTTP/1.1 200")


def test_management_state_changes_need_json_and_a_same_origin_and_status_has_no_token(node):
    st = node.status()
    assert "token" not in st and node.proc.poll() is None
    model = {"model": f"x={BUNDLED_MODEL_ID}"}
    form = request(
        "POST",
        node.console_port,
        "/api/runtime/models",
        "model=x",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert form[0] == 415 and json.loads(form[1])["error"]["code"] == "unsupported_media_type"
    foreign = request(
        "POST",
        node.console_port,
        "/api/invite",
        {"ttl_s": 120},
        headers={"Content-Type": "application/json", "Origin": "https://evil.example"},
    )
    assert foreign[0] == 403 and json.loads(foreign[1])["error"]["code"] == "forbidden_origin"
    assert (
        request(
            "POST", node.console_port, "/api/runtime/models", json.dumps(model), headers={"Content-Type": "text/plain"}
        )[0]
        == 415
    )
    assert [m["id"] for m in node.status()["models"]] == [BUNDLED_MODEL_ID]  # nothing was loaded
    own = f"http://127.0.0.1:{node.console_port}"
    code, body = request(
        "POST",
        node.console_port,
        "/api/invite",
        {"ttl_s": 120},
        headers={"Content-Type": "application/json", "Origin": own},
    )
    assert code == 200 and json.loads(body)["token"]
    cli = subprocess.run(
        [sys.executable, "-m", "hydra_node.cli", "invite", "--home", str(node.home)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0 and cli.stdout.strip(), cli.stderr


def test_authorization_values_any_bytes_and_any_scheme_case(node):
    for value in ("Bearer \u00e9\u00e8".encode("latin-1"), "Bearer \u4e2d\u6587".encode(), b"Bearer \xff\xfe\x80"):
        raw = _raw(
            node.api_port,
            b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nAuthorization: " + value + b"\r\n\r\n",
        )
        status, body = _status_and_body(raw)
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
    for scheme in ("bearer", "BEARER", "Bearer"):
        assert request("GET", node.api_port, "/v1/models", headers={"Authorization": f"{scheme} {KEY}"})[0] == 200
    assert request("GET", node.console_port, "/health")[0] == 200


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_big_body_gets_100_continue_and_an_answer(node, tmp_path):
    body = tmp_path / "body.json"
    body.write_text(json.dumps({"model": "no-such-model", "prompt": "p" * (2 << 20)}))
    res = subprocess.run(
        [
            "curl",
            "-sv",
            "-H",
            f"Authorization: Bearer {KEY}",
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            f"@{body}",
            f"http://127.0.0.1:{node.api_port}/v1/completions",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "HTTP/1.1 100" in res.stderr and "Done waiting for 100-continue" not in res.stderr
    assert json.loads(res.stdout)["error"]["code"] == "model_not_found"
    unauth = subprocess.run(
        ["curl", "-sv", "--data-binary", f"@{body}", f"http://127.0.0.1:{node.api_port}/v1/completions"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "HTTP/1.1 100" not in unauth.stderr and "HTTP/1.1 401" in unauth.stderr  # refused before the body


def test_cors_preflight_and_a_streamed_completion_from_an_allowed_origin(node):
    pre = {
        "Origin": ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    conn_code, _ = request("OPTIONS", node.api_port, "/v1/chat/completions", headers=pre)
    assert conn_code == 204
    evil = request("OPTIONS", node.api_port, "/v1/chat/completions", headers={**pre, "Origin": "https://evil.example"})
    assert evil[0] == 403 and json.loads(evil[1])["error"]["code"] == "cors_origin_not_allowed"
    payload = json.dumps(
        {"model": BUNDLED_MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}
    ).encode()
    raw = _raw(
        node.api_port,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"Origin: "
        + ORIGIN.encode()
        + b"\r\nAuthorization: Bearer "
        + KEY.encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(payload)).encode()
        + b"\r\n\r\n"
        + payload,
        timeout=120,
    )
    head = raw.split(b"\r\n\r\n", 1)[0].decode().lower()
    assert head.startswith("http/1.1 200") and f"access-control-allow-origin: {ORIGIN}" in head
    assert "text/event-stream" in head and b"data: [DONE]" in raw


def test_idle_connections_from_one_address_do_not_lock_out_health(node):
    idle = []
    try:
        for _ in range(520):  # more than the whole table of the old server (512)
            s = socket.create_connection(("127.0.0.1", node.console_port), timeout=30, source_address=("127.0.0.2", 0))
            idle.append(s)
            try:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")  # then sit idle in keep-alive
                s.recv(65536)
            except OSError:
                pass  # over the address's caps: answered and closed, or closed at once
        for source in ("127.0.0.1", "127.0.0.2"):
            raw = _raw(
                node.console_port,
                b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
                source=source,
            )
            assert raw.startswith(b"HTTP/1.1 200"), source
        assert request("GET", node.console_port, "/api/status")[0] == 200
    finally:
        for s in idle:
            s.close()


def test_a_slowloris_head_gets_408_and_is_closed(node):
    with socket.create_connection(("127.0.0.1", node.api_port), timeout=60) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        got = b""
        try:
            for _ in range(600):  # a header line every 0.1 s, never the blank line (a minute at most)
                s.sendall(b"X-Drip: a\r\n")
                s.settimeout(0.1)
                try:
                    chunk = s.recv(65536)
                except socket.timeout:
                    continue
                if not chunk:
                    break
                got += chunk
        except (BrokenPipeError, ConnectionResetError):
            pass
    assert got.startswith(b"HTTP/1.1 408")


def test_pipelined_junk_behind_a_stream_does_not_grow_the_node(node):
    payload = json.dumps(
        {"model": BUNDLED_MODEL_ID, "prompt": "1, 2, 3, 4, 5, 6,", "max_tokens": 3000, "temperature": 0, "stream": True}
    ).encode()
    before = _rss_kb(node.proc.pid)
    with socket.create_connection(("127.0.0.1", node.api_port), timeout=60) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer "
            + KEY.encode()
            + b"\r\nContent-Length: "
            + str(len(payload)).encode()
            + b"\r\n\r\n"
            + payload
        )
        data = b""
        while b"data: " not in data:
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
        s.setblocking(False)
        junk, sent, stalled_since = b"J" * (1 << 20), 0, None
        while sent < (512 << 20):
            try:
                sent += s.send(junk)
                stalled_since = None
            except BlockingIOError:
                stalled_since = stalled_since or time.monotonic()
                if time.monotonic() - stalled_since > 3:  # the node stopped reading: TCP pushes back
                    break
                try:
                    s.recv(65536)  # keep the stream flowing
                except BlockingIOError:
                    time.sleep(0.01)
        grown_mb = (_rss_kb(node.proc.pid) - before) / 1024
    assert sent < (128 << 20), sent  # socket buffers, not the node, absorbed what was sent
    assert grown_mb < 64, grown_mb
    assert request("GET", node.console_port, "/health")[0] == 200


def test_pipelined_health_never_read_does_not_grow_the_node(node):
    # Issue 25 item 1: 1,000 MB of pipelined GET /health took the node from 48 to 1,723 MB RSS.
    for port in (node.api_port, node.console_port):
        one = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
        chunk = one * ((1 << 20) // len(one))
        before = _rss_kb(node.proc.pid)
        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
            sent, deadline = 0, time.monotonic() + 20
            while sent < (300 << 20) and time.monotonic() < deadline:
                try:  # blocks once TCP pushes back: then the timeout ends the loop
                    sent += s.send(chunk[sent % len(chunk) :])
                except TimeoutError:
                    break
            grown_mb = (_rss_kb(node.proc.pid) - before) / 1024
            assert s.recv(4096).startswith(b"HTTP/1.1 200"), port  # they were served, not refused
        assert sent < (64 << 20), (port, sent)  # socket buffers, not the node, took what was sent
        assert grown_mb < 64, (port, grown_mb)
        assert request("GET", port, "/health")[0] == 200
