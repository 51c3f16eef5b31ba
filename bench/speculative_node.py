"""A node with a local draft vs the same node without one: side by side, interleaved, per prompt.

    .venv/bin/python bench/speculative_node.py [--target f16] [--tokens 64] [--repeats 3] [--threads 1]

Two real nodes on loopback serve the same target (the F16 conversion of the bundled SmolLM2-135M
Q4_1 by default, the documented speculative test pair): S with ``--draft`` (the bundled Q4_1,
loaded in S's runner), P without.  Each repeat sends every prompt to both, in alternating order
(so drifting machine load hits both alike), one request at a time, and times each request's wall
clock at the client (non-streaming ``/v1/completions``).  Per prompt we print the median tok/s of
each node, ``ratio`` = S tok/s / P tok/s (the goal: at least 0.95 on every prompt), ``paired`` = the
median of the per-repeat ratios (robuster when the machine's load drifts), plus what S's controller
reports at the end (``/api/status`` ``models[].speculative``).

Prompts: greedy code, prose and a list (speculation may run), a sampled request (temperature 0.8,
seeded: never speculates, so it measures what the draft's presence alone costs), and "pair": two
greedy requests at once (a batch of two: the engine decodes them plainly while both run, and
speculates for the one left alone, if the controller says it pays).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from harness import NodeProcess, request  # noqa: E402

from hydra_node.models import bundled_model_path  # noqa: E402
from spec_pair import ensure_converted_target  # noqa: E402

PROMPTS = {
    "code": ("def quicksort(items):\n    \"\"\"Sort a list of numbers.\"\"\"\n", 0.0),
    "prose": ("The history of the Roman Empire begins", 0.0),
    "list": ("Ten tips for staying healthy:\n1.", 0.0),
    "sampled": ("Once upon a time, in a small village,", 0.8),
    "pair": ("The three laws of thermodynamics are", 0.0),
}

NODE_CONFIG = """
[defaults.model_fit]
ctx_size = 2048
[defaults.throughput]
threads = {threads}
parallel = 2
"""


def _one(node: NodeProcess, model: str, prompt: str, temp: float, n: int, seed: int) -> tuple[float, int]:
    body = {"model": model, "prompt": prompt, "max_tokens": n, "temperature": temp}
    if temp > 0:
        body["seed"] = seed
    t0 = time.perf_counter()
    code, raw = request("POST", node.api_port, "/v1/completions", body, timeout=300)
    dt = time.perf_counter() - t0
    if code != 200:
        raise RuntimeError(f"HTTP {code}: {raw[:300]}")
    return dt, json.loads(raw)["usage"]["completion_tokens"]


def timed(node: NodeProcess, model: str, kind: str, n: int, seed: int) -> float:
    """tok/s of one request (``pair``: two at once, their tokens over the wall time of both)."""
    prompt, temp = PROMPTS[kind]
    if kind != "pair":
        dt, toks = _one(node, model, prompt, temp, n, seed)
        return toks / dt
    out: list = [None, None]

    def run(i: int) -> None:
        out[i] = _one(node, model, prompt if i == 0 else "A short poem about the sea:", temp, n, seed)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if None in out:
        raise RuntimeError("a request of the pair failed")
    return sum(x[1] for x in out) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", choices=["f16", "f32"], default="f16")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--kinds", default=",".join(PROMPTS))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--aa",
        action="store_true",
        help="control run: S gets no draft either, so the ratios show what this machine's noise "
        "and the two nodes' positions alone give",
    )
    args = ap.parse_args()
    draft = bundled_model_path()
    target = ensure_converted_target(draft, kind=args.target)
    kinds = args.kinds.split(",")
    base = Path(tempfile.mkdtemp(prefix="hydra-bench-specnode-"))
    (base / "cfg.toml").write_text(NODE_CONFIG.format(threads=args.threads))
    common = ("--no-rpc-worker", "--config", str(base / "cfg.toml"), "--model", str(target))
    nodes: list[NodeProcess] = []
    try:
        s = NodeProcess(base / "s", *common, *(() if args.aa else ("--draft", str(draft))))
        p = NodeProcess(base / "p", *common)
        nodes += [s, p]
        s.start()
        p.start()
        model = p.status()["models"][0]["id"]
        for node in (s, p):  # warm-up: first requests, the controller's first measurements
            for kind in kinds:
                timed(node, model, kind, 16, 0)
        print(
            f"{'CONTROL (--aa): S without a draft too' if args.aa else 'node with --draft Q4_1 (S)'} vs without (P): "
            f"target={args.target} threads={args.threads} "
            f"tokens={args.tokens} repeats={args.repeats} (wall clock, interleaved)"
        )
        samples: dict[tuple[str, str], list[float]] = {}
        for rep in range(args.repeats):
            for kind in kinds:
                order = [("S", s), ("P", p)] if rep % 2 == 0 else [("P", p), ("S", s)]
                for name, node in order:
                    samples.setdefault((kind, name), []).append(timed(node, model, kind, args.tokens, rep))
        print(f"{'prompt':8} {'S tok/s':>8} {'P tok/s':>8} {'ratio':>6} {'paired':>6}  per-repeat ratios")
        rows = []
        for kind in kinds:
            ts, tp = samples[(kind, "S")], samples[(kind, "P")]
            ratio = statistics.median(ts) / statistics.median(tp)
            per = " ".join(f"{a / b:.2f}" for a, b in zip(ts, tp))
            paired = statistics.median(a / b for a, b in zip(ts, tp))
            rows.append(dict(kind=kind, s=ts, p=tp, ratio=ratio, paired=paired))
            print(
                f"{kind:8} {statistics.median(ts):8.1f} {statistics.median(tp):8.1f} {ratio:6.2f} {paired:6.2f}  {per}"
            )
        spec = s.status()["models"][0].get("speculative")
        print("S speculative status:", json.dumps(spec, sort_keys=True)[:1200])
        if args.json:
            args.json.write_text(json.dumps(dict(rows=rows, speculative=spec), indent=1))
    finally:
        for n in nodes:
            n.kill_all()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
