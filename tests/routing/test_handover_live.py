"""A rolling restart loses no request (docs/scheduler.md "Hand-over on stop"), on real nodes on
loopback: A and C host the bundled model, B hosts nothing. A streaming greedy chat sent to B is
served by A or C (X); X gets SIGTERM mid-stream: it hands the generation over with ``draining``
and B's router continues it on the other host (Y). X restarts and rejoins; then a stream sent to
Y's OWN API, served by Y's runner, gets Y SIGTERMed mid-stream: Y's router continues it on X and
keeps the client's HTTP stream open until it is complete. Each time the client's text is an
uninterrupted run's, with no error event, ``hydra_served_by`` names both hosts, and the stopped
node exits 0. The hosts sleep 60 ms per token (``[runner].inject_token_delay_ms``) so the answer
outlasts ``[node].handover_grace_s`` (0.5 s here) when its host is stopped."""

from __future__ import annotations

import signal
import threading

import pytest
from continuation_mesh import (
    CUT_AFTER_CHUNKS,
    assert_one_uninterrupted_answer,
    stream_chat,
    two_hosts_and_a_front,
    wait_hosts_seen,
)

#: Bound on a stopped node's exit: its grace, the hand-over, the API drain and leaving the mesh.
EXIT_TIMEOUT_S = 30.0
HANDED_OVER = "is stopping and handed its generation over"  # the draining error's message


@pytest.fixture
def mesh(tmp_path):
    yield from two_hosts_and_a_front(tmp_path, "[runner]\ninject_token_delay_ms = 60\n[node]\nhandover_grace_s = 0.5\n")


def stream_and_stop(port: int, stop_host) -> tuple[list[dict], list[str]]:
    """Stream the chat from ``port``; after CUT_AFTER_CHUNKS content chunks ``stop_host(served_by)``
    SIGTERMs its node (in a thread: the stream is read on meanwhile). The events and the host stopped."""
    stopped: list[str] = []
    threads: list[threading.Thread] = []

    def cut(n: int, headers: dict) -> None:
        if n == CUT_AFTER_CHUNKS and not stopped:
            stopped.append(headers["x-hydra-served-by"])
            threads.append(threading.Thread(target=stop_host, args=(stopped[0],)))
            threads[0].start()

    _, events = stream_chat(port, cut)
    for t in threads:
        t.join(EXIT_TIMEOUT_S + 5)
    assert stopped, "the stream ended before its host could be stopped"
    return events, stopped


def test_a_stopped_host_hands_its_streams_over_in_a_rolling_restart(mesh):
    a, b, c, ids = mesh["a"], mesh["b"], mesh["c"], mesh["ids"]
    by_id = {ids["a"]: a, ids["c"]: c}
    _, reference = stream_chat(b.api_port)  # uninterrupted
    assert reference[-1]["usage"]["completion_tokens"] >= CUT_AFTER_CHUNKS + 20, reference[-1]["usage"]
    codes: dict[str, int] = {}

    def stop(host_id: str) -> None:
        codes[host_id] = by_id[host_id].stop(signal.SIGTERM, timeout=EXIT_TIMEOUT_S)

    # 1. a peer's request: the stopping host X hands it over, B's router continues it on Y
    events, (x,) = stream_and_stop(b.api_port, stop)
    y = next(i for i in by_id if i != x)
    assert_one_uninterrupted_answer(events, reference, [x, y])
    assert codes == {x: 0}  # X exited cleanly
    continued = [ln for ln in b.log().splitlines() if "event=request_continued" in ln]
    assert len(continued) == 1 and HANDED_OVER in continued[0], continued  # a hand-over, not a lost link

    # X restarts and rejoins (the rolling restart's next step)
    host_x, host_y = by_id[x], by_id[y]
    host_x.join_with(host_y.invite())
    host_x.start()
    wait_hosts_seen(host_y, [x])  # with its model identity: Y can continue on X

    # 2. Y's own client: Y's router continues it on X and keeps the client's stream open until done
    events, stopped = stream_and_stop(host_y.api_port, stop)
    assert stopped == [y]  # served by Y's own runner (local first)
    assert_one_uninterrupted_answer(events, reference, [y, x])
    assert codes[y] == 0
