"""The draft server and RemoteDrafter over real TCP on loopback (no node): exactness, typed errors, bounds."""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from spec_standalone.decoder import Completion, Emitted, SpeculativeDecoder

from hydra_node.runtime.child.speculative.sampling import SamplingParams
from hydra_node.runtime.child.speculative import draft_server as ds
from hydra_node.runtime.child.speculative.remote import DraftUnavailable, RemoteDrafter
from hydra_node.runtime.speculative.wire import BoundedFrameDecoder, frame, vocab_fingerprint

PROMPT = "def fibonacci(n):"


@pytest.fixture(scope="module")
def server(draft_engine):
    srv = ds.DraftServer(draft_engine, "draft-test")
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(4)
    lsock.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = lsock.accept()
            except OSError:
                continue
            threading.Thread(target=srv.serve_connection, args=(conn,), daemon=True).start()

    th = threading.Thread(target=accept, daemon=True)
    th.start()
    yield srv, f"127.0.0.1:{lsock.getsockname()[1]}"
    stop.set()
    th.join(2)
    lsock.close()


def _drafter(target_engine, endpoint: str, vocab: str | None = None) -> RemoteDrafter:
    return RemoteDrafter(endpoint, n_vocab=target_engine.n_vocab, vocab=vocab or vocab_fingerprint(target_engine.llm))


def _tokens(events) -> tuple[list[int], Completion]:
    events = list(events)
    return [e.token for e in events if isinstance(e, Emitted)], events[-1]


def test_remote_draft_gives_the_target_alone_output(server, target_engine, reference):
    _, endpoint = server
    drafter = _drafter(target_engine, endpoint)
    toks, done = _tokens(
        SpeculativeDecoder(target_engine, drafter).generate(target_engine.tokenize(PROMPT), max_tokens=24)
    )
    drafter.close()
    assert toks == reference(PROMPT, 24)
    assert done.draft_failure is None and done.rounds > 0 and done.accepted > 0
    assert drafter.rtt_s is not None and drafter.model == "draft-test"


def test_other_vocabulary_is_refused_and_the_target_finishes_alone(server, target_engine, reference):
    _, endpoint = server
    drafter = _drafter(target_engine, endpoint, vocab="0" * 32)
    toks, done = _tokens(
        SpeculativeDecoder(target_engine, drafter).generate(target_engine.tokenize(PROMPT), max_tokens=8)
    )
    assert toks == reference(PROMPT, 8)
    assert "vocabulary" in done.draft_failure and done.rounds == 0


def test_unreachable_draft_is_a_typed_failure(target_engine):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    drafter = _drafter(target_engine, f"127.0.0.1:{port}")
    with pytest.raises(DraftUnavailable):
        drafter.start([1, 2, 3], SamplingParams(), None)


def _raw(endpoint: str):
    host, _, port = endpoint.rpartition(":")
    conn = socket.create_connection((host, int(port)), timeout=10)
    dec = BoundedFrameDecoder()

    def receive() -> dict | None:
        while (msg := dec.next_message()) is None:
            data = conn.recv(65536)
            if not data:
                return None
            dec.receive_data(data)
        return msg

    assert receive()["op"] == "hello"
    return conn, receive


@pytest.mark.parametrize(
    "payload, code",
    [
        (frame({"op": "propose", "k": 2}), "out_of_order"),
        (frame({"op": "start", "tokens": [1, 10**9]}), "bad_request"),
        (frame({"op": "start", "tokens": []}), "bad_request"),
        (frame({"op": "start", "tokens": [1, 2]}) + frame({"op": "propose", "k": 65}), "bad_request"),
        (frame({"op": "start", "tokens": [1, 2]}) + frame({"op": "teleport"}), "unknown_op"),
        (frame({"op": "start", "tokens": [1, 2]}) + frame({"op": "commit", "accepted": 3, "next": 5}), "draft_failed"),
        (struct.pack(">I", 50 * 1024 * 1024), "too_large"),
    ],
)
def test_bad_requests_get_typed_errors_and_the_connection_ends(server, payload, code):
    _, endpoint = server
    conn, receive = _raw(endpoint)
    with conn:
        conn.sendall(payload)
        msg = receive()
        assert msg["op"] == "error" and msg["code"] == code, msg
        assert receive() is None  # closed after the error


def test_a_second_target_is_told_busy(server, monkeypatch):
    _, endpoint = server
    monkeypatch.setattr(ds, "BUSY_WAIT_S", 0.2)
    first, _ = _raw(endpoint)
    with first:
        host, _, port = endpoint.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=10) as second:
            dec = BoundedFrameDecoder()
            while (msg := dec.next_message()) is None:
                dec.receive_data(second.recv(65536))
            assert msg["op"] == "error" and msg["code"] == "busy"


def test_catch_up_then_propose_equals_lazy_propose(draft_engine):
    from hydra_node.runtime.child.speculative.draft import DraftSession

    prompt = draft_engine.tokenize(PROMPT)
    extra = draft_engine.tokenize(" return fibonacci(n - 1)", add_bos=False)
    proposals = []
    for eager in (False, True):
        s = DraftSession(draft_engine)
        s.start(prompt, SamplingParams(), None)
        s.extend(extra)
        if eager:
            assert s.catch_up() == len(extra)  # all committed tokens but the last
        prop = s.propose(4)
        assert prop.catchup_tokens == (1 if eager else len(extra) + 1)
        proposals.append(prop.tokens)
    assert proposals[0] == proposals[1]


def test_target_alone_tokens_reach_a_remote_draft_in_batches(server, target_engine, reference):
    """A controller that falls back at once: the draft hears of plain tokens in batches, and its
    probe rounds after them still give the target's output."""
    from hydra_node.runtime.child.speculative.controller import ControllerConfig, SpeculationController

    _, endpoint = server
    drafter = _drafter(target_engine, endpoint)
    sent = []
    real_send = drafter._send
    drafter._send = lambda msg: (sent.append(msg["op"]), real_send(msg))[1]
    ctl = SpeculationController(
        ControllerConfig(min_speedup=5.0, resume_speedup=5.0, reprobe_after_tokens=4, min_rounds_before_fallback=1)
    )
    toks, done = _tokens(
        SpeculativeDecoder(target_engine, drafter, ctl).generate(target_engine.tokenize(PROMPT), max_tokens=24)
    )
    drafter.close()
    assert toks == reference(PROMPT, 24)
    assert done.draft_failure is None and done.target_steps > 8
    assert 0 < sent.count("extend") < done.target_steps  # batched, not one message per token
