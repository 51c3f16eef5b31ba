"""API overhead: the node's OpenAI API vs llama-cpp-python called directly.

Same prompts, greedy, same thread count, interleaved in one run (alternating which
side goes first).  Prints decode tokens/s and time to first token for each side,
and the ratios the single-node issue asks for:

  throughput ratio (node / direct) >= 0.97, median added TTFT <= 15 ms on loopback.

Run: .venv/bin/python bench/api_overhead.py [--rounds 5] [--max-tokens 96]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from _common import NodeProcess, median, stream_completion

PROMPTS = [
    "def quicksort(arr):\n",
    "The history of the printing press begins",
    "A list of ten fruits:\n1.",
    "Q: Why is the sky blue?\nA:",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument(
        "--threads",
        type=int,
        default=max(1, (os.cpu_count() or 2) // 2),
        help="llama.cpp threads on both sides (default: half the cores, like llama-cpp-python)",
    )
    args = ap.parse_args()

    import llama_cpp
    from hydra_node.models import BUNDLED_MODEL_ID, bundled_model_path

    home = Path(tempfile.mkdtemp(prefix="hydra-bench-"))
    cfg = home / "hydra.toml"
    cfg.write_text(
        f"[defaults.throughput]\nthreads = {args.threads}\nthreads_batch = {args.threads}\n"
        f"[defaults.model_fit]\nctx_size = 2048\n"
    )
    node = NodeProcess(home / "node", "--config", str(cfg)).start()
    llm = llama_cpp.Llama(
        str(bundled_model_path()), n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads, verbose=False
    )
    res = {"direct": {"ttft": [], "tps": []}, "node": {"ttft": [], "tps": []}}

    def direct(prompt):
        t0 = time.perf_counter()
        t_first = t_last = None
        n = 0
        for chunk in llm.create_completion(prompt, max_tokens=args.max_tokens, temperature=0, stream=True):
            now = time.perf_counter()
            if t_first is None:
                t_first = now
            t_last = now
            n += 1
        return t_first - t0, t_last - t_first, n

    def via_node(prompt):
        return stream_completion(
            node.api_port,
            {"model": BUNDLED_MODEL_ID, "prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0},
        )

    try:
        for p in PROMPTS:  # warm both sides once
            direct(p), via_node(p)
        for r in range(args.rounds):
            for i, p in enumerate(PROMPTS):
                order = [("direct", direct), ("node", via_node)]
                if (r + i) % 2:
                    order.reverse()
                for name, fn in order:
                    ttft, dec, n = fn(p)
                    res[name]["ttft"].append(ttft * 1000)
                    if n > 1 and dec > 0:
                        res[name]["tps"].append((n - 1) / dec)
    finally:
        node.kill_all()
    d, n = res["direct"], res["node"]
    print(
        f"samples per side: {len(d['ttft'])} ({args.rounds} rounds x {len(PROMPTS)} prompts, "
        f"max_tokens={args.max_tokens}, threads={args.threads})"
    )
    print(f"{'':8} {'decode tok/s (median)':>22} {'TTFT ms (median)':>18}")
    for name, v in res.items():
        print(f"{name:8} {median(v['tps']):22.1f} {median(v['ttft']):18.1f}")
    ratio = median(n["tps"]) / median(d["tps"])
    added = [a - b for a, b in zip(n["ttft"], d["ttft"])]
    print(f"throughput ratio node/direct: {ratio:.3f}  (goal >= 0.97)")
    print(f"median added TTFT: {median(added):.1f} ms  (goal <= 15 ms)")


if __name__ == "__main__":
    main()
