"""Claude Code with thinking on, through ``hydra claude``, against the front node of the session's
thinking mesh (``thinking_mesh``, tests/conftest.py: ``host`` serves the thinking fixture as
``thinking``, ``front`` hosts nothing and joined it).

What Claude Code (2.1.328) sends: for a model it does not know it always asks for adaptive thinking
(``thinking: {"type": "adaptive"}``, ``MAX_THINKING_TOKENS`` changes nothing for such a model, and
its per-model capability variables are read only for Bedrock, Vertex and the like) with
``output_config.effort`` (``--effort``, default ``high``). The node budgets adaptive thinking by that
effort (docs/agents.md, ``output_config``): ``low`` is 1024 tokens, Anthropic's smallest budget, after
which the host closes the think block and the answer begins; ``--max-tokens`` leaves room for a few
tokens of it. Claude Code samples at temperature 1 (no setting changes it), and the 135M fixture
thinks poorly: the test asserts on where the text goes, not on what it says. Claude Code prints each
block of a message as its own ``assistant`` event (the same message id), so the run stops at the
first text block and the thinking block is looked up in the same message."""

from __future__ import annotations

import pytest

from agentkit import agent_env, install_agents, launcher, require, run_until

pytestmark = pytest.mark.live

MODEL = "thinking"  # the id the session's thinking_mesh serves the fixture under
#: the budget of ``--effort low`` (1024 thinking tokens) and a few tokens of answer
MAX_TOKENS = 1060
#: Claude Code runs tried before the test gives up on seeing a text block (see the loop below).
ATTEMPTS = 3
TAGS = ("<think>", "</think>")


def _blocks(ev: dict, kind: str) -> list[dict]:
    """The blocks of ``kind`` in an assistant event of Claude Code's stream-json output."""
    content = (ev.get("message") or {}).get("content") if ev.get("type") == "assistant" else None
    return [c for c in content or [] if isinstance(c, dict) and c.get("type") == kind]


def test_claude_code_shows_the_thoughts_apart_from_the_answer(thinking_mesh, tmp_path):
    bin_dir, missing = install_agents()
    require(missing, "claude")
    (tmp_path / "work").mkdir()
    argv = launcher(
        "claude",
        thinking_mesh.front.base_url.removesuffix("/v1"),
        tmp_path,
        "--max-tokens",
        str(MAX_TOKENS),
        "--",
        "-p",
        "What is 2 + 2? Answer briefly.",
        "--tools",
        "",
        "--effort",
        "low",
        "--max-turns",
        "1",
        "--system-prompt",
        "You are a helpful assistant.",
        "--output-format",
        "stream-json",
        "--verbose",
    )
    # Claude Code samples at temperature 1 (it cannot be set): the 135M fixture sometimes ends its
    # turn right after the forced end of its thoughts, with no text. Up to ATTEMPTS runs, so the
    # test checks the shape of an answer, not the luck of one sample.
    for _ in range(ATTEMPTS):
        run, answer = run_until(
            argv, agent_env(bin_dir, tmp_path / "home"), tmp_path / "work", lambda ev: _blocks(ev, "text")
        )
        if answer is not None:
            break
    assert answer is not None, run
    message = answer["message"]
    same = [ev for ev in run.events if (ev.get("message") or {}).get("id") == message["id"]]
    thoughts = [b for ev in same for b in _blocks(ev, "thinking")]
    text = "".join(b["text"] for ev in same for b in _blocks(ev, "text"))
    assert message["model"] == MODEL, answer
    assert thoughts and thoughts[0]["thinking"].strip() and thoughts[0]["signature"], run
    assert text.strip() and not any(tag in t for t in (text, thoughts[0]["thinking"]) for tag in TAGS), run
