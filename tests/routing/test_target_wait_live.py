"""Waiting for a target (docs/scheduler.md "Waiting for a target") on a real node hosting the
bundled model, with no other host: (i) its runner SIGKILLed mid-stream (the runner process, not
the node) — the stream waits for the restart and continues there: no error event, the text of an
uninterrupted greedy run, one ``finish_reason``, usage counting every token, one continuation;
(ii) a request sent while the runner restarts waits and is served; (iii) the model unloaded by
the operator, re-hosting off (gone for good) — at once a clean 503 naming ``[scheduler].target_wait_s``
and why it did not wait (an unload is a clean leave, unlike a death). The runner sleeps
40 ms per token (``[runner].inject_token_delay_ms``) so the answer is still being generated when
its runner dies."""

from __future__ import annotations

import json
import os
import signal

import pytest
from continuation_mesh import CUT_AFTER_CHUNKS, MODEL, reference_finish, stream_chat, text_of
from harness import NodeProcess, request

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
WAIT_S = 15  # longer than a restart of the bundled model's runner on a loaded machine (4-7 s seen)


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """One node for the three tests, in order (each leaves the runner as the next expects)."""
    tmp_path = tmp_path_factory.mktemp("target_wait")
    cfg = tmp_path / "hydra.toml"
    cfg.write_text(
        f"[runner]\ninject_token_delay_ms = 40\n[scheduler]\ntarget_wait_s = {WAIT_S}\n"
        "[rehost]\nenabled = false\n"  # (iii): nothing hosts the unloaded model again
    )
    node = NodeProcess(tmp_path / "h", "--config", str(cfg), "--no-rpc-worker", "--name", "h")
    try:
        node.start()
        node.wait_status(lambda st: st["models"][0]["state"] == "ready", timeout=90, what="runner ready")
        yield node
    finally:
        node.kill_all()


def test_i_a_stream_whose_runner_is_killed_waits_for_its_restart_and_continues(host):
    _, reference = stream_chat(host.api_port)  # uninterrupted
    assert reference[-1]["usage"]["completion_tokens"] >= CUT_AFTER_CHUNKS + 10, reference[-1]["usage"]
    pid = host.runner_pid()
    killed: list[int] = []

    def cut(n: int, headers: dict) -> None:
        if n == CUT_AFTER_CHUNKS and not killed:
            killed.append(pid)
            os.kill(pid, signal.SIGKILL)  # the runner only: the node restarts it

    _, events = stream_chat(host.api_port, cut)
    assert killed, "the stream ended before the runner could be killed"
    assert not [e for e in events if "error" in e], events
    assert text_of(events) == text_of(reference)  # greedy: identical to the uninterrupted run
    finishes = [c["finish_reason"] for e in events for c in e.get("choices", []) if c.get("finish_reason")]
    assert finishes == [reference_finish(reference)]
    assert events[-1]["usage"] == reference[-1]["usage"]
    routing = host.status()["routing"]
    assert routing["continuations"] == 1 and routing["target_waits"]["routed"] == 1, routing


def test_ii_a_request_sent_while_the_runner_restarts_waits_and_is_served(host):
    pid = host.wait_status(lambda st: st["models"][0]["state"] == "ready", timeout=60, what="ready")["models"][0]["pid"]
    os.kill(pid, signal.SIGKILL)
    host.wait_status(lambda st: st["models"][0]["state"] != "ready", what="runner restarting")
    code, answer = request("POST", host.api_port, "/v1/chat/completions", BODY, timeout=WAIT_S + 30)
    assert code == 200, answer
    assert host.status()["routing"]["target_waits"]["routed"] >= 1


def test_iii_a_model_gone_for_good_is_a_clean_503_naming_the_wait(host):
    code, out = request("DELETE", host.console_port, f"/api/runtime/models/{MODEL}")
    assert code == 200, out
    code, answer = request("POST", host.api_port, "/v1/chat/completions", BODY, timeout=WAIT_S + 30)
    err = json.loads(answer)["error"]
    assert code == 503 and err["code"] == "model_unavailable", answer
    assert "[scheduler].target_wait_s" in err["message"] and "did not wait" in err["message"], err
