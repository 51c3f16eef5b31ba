"""One tuning trial: a candidate's runner child (the node's own supervisor and engine), the fixed
prompt set, the figures.

A round sends every prompt of :data:`PROMPTS` at once through :class:`RunnerSupervisor.generate`
(greedy, ``max_tokens`` each; the runner admits ``parallel`` of them together, the rest wait as
they would behind a node's API).  Per round: generation throughput = completion tokens of the
round / its wall-clock time; TTFT = mean time from sending a request to its first text (queue
wait included, what a client sees); prefill rate = prompt tokens / the runner's own time to first
token.  Every request starts with a round-specific tag, so no round reuses an earlier round's
cached prefix.  Peak memory is the child's ``VmHWM`` (Linux; None elsewhere).

``should_stop(partial)`` is asked after every round (the planner's early-stop rule).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import trio

from hydra_node.inference import Finished, GenerationRequest, TextDelta
from hydra_node.models import ModelRef
from hydra_node.runtime.runner.records import RunnerCrashed, RunnerLoadError, RunnerSettings
from hydra_node.runtime.runner.supervisor import RunnerSupervisor
from hydra_node.runtime.tuning.plan import Figures

__all__ = ["PROMPTS", "TrialResult", "TrialSettings", "peak_rss_bytes", "run_trial"]

#: The fixed prompt set: a short question, a medium instruction, a longer context to summarise
#: (about 15, 45 and 150 prompt tokens with the bundled model's tokenizer).
PROMPTS = (
    "Explain in a few sentences why the sky is blue.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle. Describe the "
    "weather, the sea, the old lighthouse and what the message says, then how the keeper answers it.",
    "Summarise the following notes for a team meeting.\n"
    + " ".join(
        f"Item {i}: the build server was slow on day {i}, the release checklist needs an owner, and the "
        f"documentation for module {i} is out of date."
        for i in range(1, 5)
    ),
)


@dataclass(frozen=True)
class TrialSettings:
    rounds: int = 2
    max_tokens: int = 48
    prompts: tuple[str, ...] = PROMPTS

    def __post_init__(self) -> None:
        if not (1 <= self.rounds <= 100 and 1 <= self.max_tokens <= 4096 and self.prompts):
            raise ValueError("rounds 1..100, max_tokens 1..4096 and at least one prompt")


@dataclass(frozen=True)
class TrialResult:
    figures: Figures
    stopped_early: bool
    llama: dict  # what the runner reported it loaded with (its ready message)


def peak_rss_bytes(pid: int | None) -> int | None:
    """``VmHWM`` of a live process (Linux ``/proc``); None where it cannot be read."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


async def _one(runner: RunnerSupervisor, req: GenerationRequest) -> tuple[float, Finished]:
    t0 = trio.current_time()
    first: float | None = None
    async with runner.generate(req) as events:
        async for ev in events:
            if isinstance(ev, TextDelta) and first is None and ev.text:
                first = trio.current_time()
            elif isinstance(ev, Finished):
                end = trio.current_time()
                return ((first if first is not None else end) - t0) * 1000, ev
    raise RunnerCrashed("the runner ended a generation without a finished event")


async def _round(runner: RunnerSupervisor, trial: TrialSettings, tag: int) -> tuple[float, float, float]:
    """(generation tok/s, mean client TTFT ms, prefill tok/s) of one round."""
    results: list[tuple[float, Finished]] = []

    async def go(i: int, text: str) -> None:
        req = GenerationRequest(
            model=runner.model.id,
            kind="completion",
            prompt=f"[{tag}.{i}] {text}",
            max_tokens=trial.max_tokens,
            temperature=0.0,
            seed=0,
            request_id=f"tune-{tag}-{i}",
        )
        results.append(await _one(runner, req))

    t0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        for i, text in enumerate(trial.prompts):
            nursery.start_soon(go, i, text)
    wall = max(trio.current_time() - t0, 1e-6)
    tokens = sum(f.completion_tokens for _, f in results)
    prefill_s = sum(f.ttft_ms for _, f in results) / 1000
    pp = sum(f.prompt_tokens for _, f in results) / prefill_s if prefill_s > 0 else math.inf
    return tokens / wall, sum(t for t, _ in results) / len(results), pp


async def run_trial(
    model: ModelRef,
    settings: RunnerSettings,
    home: Path,
    trial: TrialSettings,
    should_stop: Callable[[Figures], bool] = lambda _f: False,
) -> TrialResult:
    """Start a runner with ``settings`` (its pid and log files under ``home``), measure, stop it.

    Raises :class:`hydra_node.runtime.runner.records.RunnerLoadError` when the model does not
    load with these settings (the caller records the candidate as failed)."""
    runner = RunnerSupervisor(model, home, settings)
    gen: list[float] = []
    ttft: list[float] = []
    pp: list[float] = []
    stopped = False
    rss: int | None = None
    failed: RunnerLoadError | None = None
    async with trio.open_nursery() as nursery:
        try:
            await nursery.start(runner.run)
        except RunnerLoadError as exc:  # raised here bare, re-raised bare below (not in a group)
            failed = exc
            nursery.cancel_scope.cancel()
            return_early = True
        else:
            return_early = False
        for r in range(0 if return_early else trial.rounds):
            g, t, p = await _round(runner, trial, r)
            gen.append(g)
            ttft.append(t)
            pp.append(p)
            rss = peak_rss_bytes(runner.pid)
            partial = _figures(gen, ttft, pp, rss)
            if r + 1 < trial.rounds and should_stop(partial):
                stopped = True
                break
        llama = dict(runner.info.get("llama") or {})
        nursery.cancel_scope.cancel()
    if failed is not None:
        raise failed
    return TrialResult(_figures(gen, ttft, pp, rss), stopped, llama)


def _figures(gen: list[float], ttft: list[float], pp: list[float], rss: int | None) -> Figures:
    n = len(gen)
    return Figures(pp_tok_s=sum(pp) / n, gen_tok_s=sum(gen) / n, ttft_ms=sum(ttft) / n, peak_rss_bytes=rss, rounds=n)
