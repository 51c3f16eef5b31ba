"""A reasoning model through a real runner child: the thinking fixture (tests/fixtures/models.py,
the bundled model with a Qwen3-style template whose generation prompt opens ``<think>``).

The 135M model rarely closes ``</think>`` by itself, so the thinking budget is what brings the
answer deterministically (greedy): the host closes the block when the budget is spent. One runner
serves every case (docs/reasoning.md: the splitter, the budget, the grammar after the block, prefill).
"""

from __future__ import annotations

import json

import trio

from hydra_node.inference import ChatMessage, Finished, GenerationRequest, TextDelta
from hydra_node.models import ModelRef
from hydra_node.runtime.runner.records import RunnerSettings
from hydra_node.runtime.runner.supervisor import RunnerSupervisor
from tests.fixtures.models import thinking_model

TIMEOUT_S = 300
QUESTION = ChatMessage("user", "What is the capital of France?")


def chat(*messages: ChatMessage, max_tokens: int = 12, **kw) -> GenerationRequest:
    return GenerationRequest(
        model="thinking", kind="chat", messages=messages or (QUESTION,), max_tokens=max_tokens, temperature=0.0, **kw
    )


async def run(sup: RunnerSupervisor, req: GenerationRequest) -> tuple[str, str, Finished, list[TextDelta]]:
    async with sup.generate(req) as events:
        evs = [ev async for ev in events]
    fin = evs[-1]
    assert isinstance(fin, Finished)
    deltas = [e for e in evs[:-1] if isinstance(e, TextDelta)]
    return "".join(d.reasoning for d in deltas), "".join(d.text for d in deltas), fin, deltas


async def test_a_thinking_model_through_a_real_runner(tmp_path) -> None:
    sup = RunnerSupervisor(ModelRef("thinking", thinking_model()), tmp_path, RunnerSettings(n_ctx=1024), node_id="n")

    async def check() -> None:
        # the generation prompt opened the block: everything before </think> is reasoning, never text
        reasoning, text, fin, deltas = await run(sup, chat())
        assert reasoning and "<think>" not in reasoning and "</think>" not in text
        assert 1 <= fin.reasoning_tokens <= fin.completion_tokens <= 12
        assert sum(len(d.tokens) for d in deltas) == fin.completion_tokens

        # the switch off: the template writes an empty block, the output is all answer
        reasoning, text, fin, _ = await run(sup, chat(thinking=False))
        assert (reasoning, fin.reasoning_tokens) == ("", 0) and text.strip()

        # a budget: at most N reasoning tokens, then the host closes the block and the answer begins
        reasoning, text, fin, _ = await run(sup, chat(thinking_budget=4, max_tokens=20))
        assert reasoning and fin.reasoning_tokens == 4 and text.strip() and "</think>" not in text
        assert fin.completion_tokens > fin.reasoning_tokens + 2  # the forced closing tokens count, then the answer's

        # a zero budget closes the block at once
        reasoning, text, fin, _ = await run(sup, chat(thinking_budget=0, max_tokens=8))
        assert (reasoning, fin.reasoning_tokens) == ("", 0) and text.strip()

        # a grammar constrains the answer after the block, not the thoughts
        grammar = 'root ::= "{\\"city\\": \\"" [A-Za-z]+ "\\"}"'
        reasoning, text, fin, _ = await run(sup, chat(thinking_budget=3, max_tokens=24, grammar=grammar))
        assert reasoning and not reasoning.startswith("{")
        assert set(json.loads(text)) == {"city"}, text

        # a final assistant message is continued: the answer is only the new text, no new block
        prefill = ChatMessage("assistant", "The capital of France is")
        reasoning, text, fin, _ = await run(sup, chat(QUESTION, prefill, max_tokens=4))
        assert reasoning == "" and fin.reasoning_tokens == 0 and text.strip() and not text.startswith("The capital")
        assert sup.restarts == 0

    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            await check()
            nursery.cancel_scope.cancel()


async def test_reasoning_format_none_makes_the_thinking_model_not_reasoning(tmp_path) -> None:
    """``[defaults.model_fit] reasoning_format = "none"``: the ready message's caps say the model does
    not reason, and its thoughts stay in the answer text (no split; docs/reasoning.md "Override")."""
    settings = RunnerSettings(n_ctx=256, warmup=False, reasoning_format="none")
    sup = RunnerSupervisor(ModelRef("thinking", thinking_model()), tmp_path, settings, node_id="n")
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            assert sup.caps is not None and not sup.caps.reasons and not sup.caps.switch
            reasoning, text, fin, _ = await run(sup, chat(max_tokens=4))
            assert (reasoning, fin.reasoning_tokens) == ("", 0) and text  # the generation prompt opened <think>
            nursery.cancel_scope.cancel()
