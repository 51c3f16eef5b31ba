"""If one head is cut off, the request goes on (docs/scheduler.md "Continuing a stream"), on real
nodes on loopback: A and C host the bundled model, B hosts nothing. A streaming greedy chat sent to
B is served by A or C; after 10 chunks that host's node and its runner are killed with SIGKILL.
The client gets one uninterrupted stream, no error event, the text of an uninterrupted run, one
``finish_reason``, usage counting the prompt once and every completion token, and
``hydra_served_by`` naming both hosts. The hosts sleep 40 ms per token
(``[runner].inject_token_delay_ms``) so the answer is still being generated when its host dies."""

from __future__ import annotations

import pytest
from continuation_mesh import (
    CUT_AFTER_CHUNKS,
    assert_one_uninterrupted_answer,
    stream_chat,
    two_hosts_and_a_front,
)


@pytest.fixture
def mesh(tmp_path):
    yield from two_hosts_and_a_front(tmp_path, "[runner]\ninject_token_delay_ms = 40\n")


def test_a_stream_whose_host_is_killed_goes_on_on_the_other_host(mesh):
    b, ids = mesh["b"], mesh["ids"]
    by_id = {ids["a"]: mesh["a"], ids["c"]: mesh["c"]}
    _, reference = stream_chat(b.api_port)  # uninterrupted
    ref_usage = reference[-1]["usage"]
    assert ref_usage["completion_tokens"] >= CUT_AFTER_CHUNKS + 10, ref_usage  # long enough to cut
    killed: list[str] = []

    def cut(n: int, headers: dict) -> None:
        if n == CUT_AFTER_CHUNKS and not killed:
            killed.append(headers["x-hydra-served-by"])
            by_id[killed[0]].kill_all()  # kill -9 of its process group: the node and its runner

    headers, events = stream_chat(b.api_port, cut)
    assert killed, "the stream ended before the host could be cut"
    other = next(i for i in by_id if i != killed[0])
    assert_one_uninterrupted_answer(events, reference, [killed[0], other])
    status = b.status()["routing"]
    assert status["continuations"] == 1 and status["continuation_failures"] == 0
