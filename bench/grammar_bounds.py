"""What a slow JSON-schema grammar costs a runner, with and without the grammar bounds (issue 25 item 2).

One real runner child (the bundled model, 2 slots). Each case sends a greedy completion whose
``response_format`` pattern is ``^([a-z]|[a-z]|...)*$`` with N alternatives under the repetition
(llama.cpp's grammar engine does work that grows with N cubed on such patterns), then a plain
request, and prints: the answer (or its error), how long it took, how long the plain request took
after it, and whether the runner survived (restarts, pid). The cases:

* N = 64, no budget (``[runner] grammar_token_budget_ms`` set far above any token): the work itself;
* N = 64, a 5 ms budget per token: that request fails 422 ``grammar_too_slow``, the runner goes on;
* N = 150: refused with a 400 when the grammar is built (more than 64 alternatives under one
  repetition), so it never reaches the runner (before the bound it ran ~16 s, blocking every sequence).

Run: .venv/bin/python bench/grammar_bounds.py [--max-tokens 16]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import trio

from hydra_node.grammar.constraints import json_schema_grammar
from hydra_node.inference import GenerationError, GenerationRequest, InvalidRequest
from hydra_node.models import resolve_model
from hydra_node.runtime.runner.records import RunnerSettings
from hydra_node.runtime.runner.supervisor import RunnerSupervisor

NO_BUDGET_MS = 1e9


def pattern_grammar(alternatives: int) -> str:
    pattern = "^(" + "|".join(["[a-z]"] * alternatives) + ")*$"
    return json_schema_grammar({"type": "string", "pattern": pattern}, param="response_format")


async def one_case(alternatives: int, budget_ms: float, max_tokens: int) -> str:
    label = f"N={alternatives:<4} budget={'none' if budget_ms >= NO_BUDGET_MS else f'{budget_ms:g} ms':<8}"
    t = time.monotonic()
    try:
        grammar = pattern_grammar(alternatives)
    except InvalidRequest as exc:
        return f"{label} refused at build in {time.monotonic() - t:.3f} s: {exc.message[:70]}"
    settings = RunnerSettings(n_ctx=1024, parallel=2, warmup=False, grammar_token_budget_ms=budget_ms)
    sup = RunnerSupervisor(resolve_model(None), Path(tempfile.mkdtemp()), settings, node_id="bench")
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        pid = sup.pid
        req = GenerationRequest(
            model="m",
            kind="completion",
            prompt="Write a word:",
            temperature=0.0,
            max_tokens=max_tokens,
            grammar=grammar,
        )
        t = time.monotonic()
        try:
            async with sup.generate(req) as events:
                evs = [e async for e in events]
            out = f"answered ({evs[-1].finish_reason}, {evs[-1].completion_tokens} tokens)"
        except GenerationError as exc:
            out = f"{exc.status} {exc.code}"
        took = time.monotonic() - t
        t = time.monotonic()
        plain = GenerationRequest(model="m", kind="completion", prompt="Hi", temperature=0.0, max_tokens=4)
        async with sup.generate(plain) as events:
            [e async for e in events]
        after = time.monotonic() - t
        same_pid, restarts = sup.pid == pid, sup.restarts
        nursery.cancel_scope.cancel()
    return f"{label} {out} in {took:.2f} s; next plain request {after:.2f} s; restarts={restarts} same_pid={same_pid}"


async def main(max_tokens: int) -> None:
    for alternatives, budget_ms in ((64, NO_BUDGET_MS), (64, 5.0), (150, 5000.0)):
        print(await one_case(alternatives, budget_ms, max_tokens), flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-tokens", type=int, default=16)
    trio.run(main, ap.parse_args().max_tokens)
