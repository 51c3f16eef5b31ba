"""The VAST trigger sender against a real HTTP receiver on loopback (a threaded http.server that
records every request and answers from a script: fail the first N, refuse, redirect)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import nacl.signing
import pytest
import trio

from hydra_node.runtime.artifacts.manifest import ArtifactFile, Manifest
from hydra_node.runtime.artifacts.vast import send_trigger
from hydra_node.runtime.artifacts.vast_payload import (
    IDEMPOTENCY_HEADER,
    VastSettings,
    build_payload,
)

KEY = nacl.signing.SigningKey(bytes(range(32)))
MANIFEST = Manifest(
    "model_weights",
    "smol",
    (ArtifactFile("model.gguf", 123, "a" * 64),),
    {"arch": "llama"},
    "posix:/mnt/vast/hydra",
    1_700_000_000,
).sign(KEY)


class Receiver:
    """Answers POSTs with the next scripted ``(status, headers, body)`` (the last one repeats)."""

    def __init__(self, script: list[tuple[int, dict, bytes]]) -> None:
        self.script = list(script)
        self.requests: list[tuple[str, dict, bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append((self.path, dict(self.headers), body))
                status, headers, reply = receiver.script.pop(0) if len(receiver.script) > 1 else receiver.script[0]
                self.send_response(status)
                for k, v in {"Content-Length": str(len(reply)), **headers}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/vast/trigger"


@pytest.fixture
def receiver() -> Iterator[callable]:
    made: list[Receiver] = []

    def make(*script) -> Receiver:
        r = Receiver(list(script))
        threading.Thread(target=r.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        made.append(r)
        return r

    yield make
    for r in made:
        r.server.shutdown()
        r.server.server_close()


def _settings(url: str, attempts: int = 4) -> VastSettings:
    return VastSettings(
        url,
        tenant="t1",
        dataspace="ds",
        target_site="site-b",
        max_attempts=attempts,
        backoff_initial_s=0.01,
        backoff_max_s=0.05,
        request_timeout_s=5.0,
    )


async def test_retries_5xx_and_429_then_delivers_the_same_request(receiver):
    r = receiver((503, {}, b"busy"), (429, {"Retry-After": "0"}, b""), (202, {}, b'{"accepted": true}'))
    settings = _settings(r.url)
    payload = build_payload(MANIFEST, op_id="op-0011-2233", settings=settings)
    with trio.fail_after(30):
        result = await send_trigger(settings, payload)
    assert (result.delivered, result.attempts, result.status, result.last_error) == (True, 3, 202, None)
    assert result.idempotency_key == payload["idempotency_key"]
    assert len(r.requests) == 3
    assert len({body for _, _, body in r.requests}) == 1  # every try the same bytes
    for path, headers, body in r.requests:
        assert path == "/vast/trigger" and headers["Content-Type"] == "application/json"
        assert headers[IDEMPOTENCY_HEADER] == payload["idempotency_key"]
    got = json.loads(r.requests[0][2])
    assert got == payload and got["checksum"]["manifest_id"] == MANIFEST.manifest_id
    assert Manifest.from_json(json.dumps(got["manifest"])) == MANIFEST


@pytest.mark.parametrize(("status", "why"), [(400, "HTTP 400: bad tenant"), (307, "HTTP 307")])
async def test_other_4xx_and_redirects_are_final(receiver, status, why):
    r = receiver((status, {"Location": "http://127.0.0.1:1/elsewhere"}, b"bad tenant" if status == 400 else b""))
    settings = _settings(r.url)
    with trio.fail_after(30):
        result = await send_trigger(settings, build_payload(MANIFEST, op_id="op-1", settings=settings))
    assert (result.delivered, result.attempts, result.status) == (False, 1, status)
    assert result.last_error.startswith("refused:") and why in result.last_error
    assert len(r.requests) == 1


async def test_gives_up_after_max_attempts(receiver):
    r = receiver((500, {}, b"broken"))
    settings = _settings(r.url, attempts=3)
    with trio.fail_after(30):
        result = await send_trigger(settings, build_payload(MANIFEST, op_id="op-1", settings=settings))
    assert (result.delivered, result.attempts, result.status) == (False, 3, 500)
    assert "gave up after 3 tries" in result.last_error and "HTTP 500: broken" in result.last_error
    assert len(r.requests) == 3
    assert result.to_mapping()["attempts"] == 3


async def test_unreachable_endpoint_is_retried_then_reported():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/t"
    settings = _settings(url, attempts=2)
    with trio.fail_after(30):
        result = await send_trigger(settings, build_payload(MANIFEST, op_id="op-1", settings=settings))
    assert (result.delivered, result.attempts, result.status) == (False, 2, None)
    assert "cannot reach" in result.last_error and "refused" in result.last_error.lower()
