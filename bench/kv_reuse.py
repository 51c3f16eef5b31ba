"""TTFT of a ~2,000-token prompt: cold prefill vs the prompt's KV state imported from a file.

One real runner child (the bundled model unless ``--model``), one slot, a context that fits the
prompt and the answer.  The prompt's state is exported once (``kv_export``); then each round,
side by side in one run:

* cold: a short other prompt takes the slot (the long prompt's cells are gone), then the long
  prompt is generated (1 token): its TTFT is the whole prefill;
* imported: the short prompt takes the slot again, the state file is imported (``kv_import``,
  timed), then the long prompt is generated: the prompt cache reuses all but its last token.

Printed: the median TTFT of each (the runner's own measurement, from tokenising to the first
token), the import time, and the ratios imported/cold with and without the import (goal <= 0.2).

    .venv/bin/python bench/kv_reuse.py [--tokens 2000] [--rounds 3] [--model PATH]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hydra_node.inference import GenerationRequest
from hydra_node.models import resolve_model
from hydra_node.runtime.runner.records import RunnerSettings
from hydra_node.runtime.runner.supervisor import RunnerSupervisor

SENTENCE = "The archive held letters from sailors, merchants and lighthouse keepers along the northern coast. "


def completion(prompt_tokens: tuple[int, ...] = (), prompt: str = "") -> GenerationRequest:
    return GenerationRequest(
        model="m", kind="completion", prompt=prompt, prompt_tokens=prompt_tokens, max_tokens=1, temperature=0.0
    )


def prompt_ids(model_path: Path, n: int) -> tuple[int, ...]:
    """Exactly ``n`` token ids of English text (BOS first), from the model's own tokenizer."""
    import llama_cpp

    vocab = llama_cpp.Llama(model_path=str(model_path), vocab_only=True, verbose=False)
    return tuple(vocab.tokenize((SENTENCE * (n // 10 + 10)).encode(), add_bos=True)[:n])


async def ttft(sup: RunnerSupervisor, req: GenerationRequest) -> tuple[float, int]:
    async with sup.generate(req) as events:
        evs = [ev async for ev in events]
    return evs[-1].ttft_ms, evs[-1].cached_tokens


async def bench(args) -> None:
    home = Path(tempfile.mkdtemp(prefix="kv-bench-"))
    model = resolve_model(args.model)
    sup = RunnerSupervisor(
        model, home, RunnerSettings(n_ctx=args.tokens + 256, n_batch=512, parallel=1, warmup=True), node_id="bench"
    )
    ids = prompt_ids(model.path, args.tokens)
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        long_req, short_req = completion(prompt_tokens=ids), completion(prompt="Colours:")
        t0 = time.perf_counter()
        exported = await sup.kv.export(long_req, home / "long.hykv")
        export_ms = (time.perf_counter() - t0) * 1000
        print(
            f"model {model.id}: prompt {exported.tokens} tokens, state file {exported.bytes / 1e6:.1f} MB, "
            f"export {export_ms:.0f} ms (its prefill included)"
        )
        cold, warm, imports = [], [], []
        for i in range(args.rounds):
            await ttft(sup, short_req)  # the slot now holds the short prompt: the long one's cells are gone
            ms, cached = await ttft(sup, long_req)
            assert cached <= 1, f"cold run reused {cached} tokens"
            cold.append(ms)
            await ttft(sup, short_req)
            imported = await sup.kv.import_state(home / "long.hykv")
            imports.append(imported.duration_ms)
            ms, cached = await ttft(sup, long_req)
            assert cached == exported.tokens - 1, f"imported run reused {cached} of {exported.tokens} tokens"
            warm.append(ms)
            print(f"round {i + 1}: cold TTFT {cold[-1]:.0f} ms | import {imports[-1]:.0f} ms + TTFT {warm[-1]:.0f} ms")
        c, w, imp = statistics.median(cold), statistics.median(warm), statistics.median(imports)
        print(f"median cold TTFT {c:.0f} ms; imported TTFT {w:.0f} ms; import {imp:.0f} ms")
        print(f"ratio imported/cold TTFT: {w / c:.3f} (goal <= 0.2); including the import: {(w + imp) / c:.3f}")
        nursery.cancel_scope.cancel()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", default=None, help="a GGUF path (default: the bundled SmolLM2-135M)")
    trio.run(bench, p.parse_args())


if __name__ == "__main__":
    main()
