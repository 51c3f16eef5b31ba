"""Mixture of agents (``model: "mesh"``) latency vs its members asked alone, side by side in one run.

One node hosts two distinct models: the bundled Q4_1 and its F16 conversion (under the id
``smollm2-f16``), each runner on ``--threads`` threads, no reducer configured. Rounds interleave
whole (non-streamed) chat requests with the same greedy prompt and ``max_tokens``: the Q4_1 model
alone, the F16 model alone, both models asked directly at the same moment (no arbiter), then
``model: "mesh"`` (both members at once, arbitrated; the greedy answers agree, so no reducer runs —
checked on every answer). Prints the median completion time of each, and the ratios mesh /
slowest member alone (goal <= 1.1), mesh / fastest, and mesh / both-at-once.

Both members share this machine's cores: where cores are scarce (or busy) the two members slow
each other down, which "both at once" shows without the arbiter; members on separate hosts, or
on a machine with a core per runner thread to spare, do not. ``--pin`` measures that case here:
two nodes joined in a mesh, each pinned to its own core with everything it starts (node A hosts
the Q4_1 on core 0 and takes every request; node B hosts the F16 on core 1 and serves it to A
through the mesh), as members on two hosts would be. Use --threads 1 with it.

Run: .venv/bin/python bench/moa.py [--rounds 8] [--max-tokens 32] [--threads 1] [--warmup 2] [--pin]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from _common import NodeProcess

from hydra_node.models import BUNDLED_MODEL_ID, bundled_model_path
from spec_pair import ensure_f16_target

F16 = "smollm2-f16"
PAIR = "both alone, at once"
PROMPT = "Write a short story about a dragon who learns to read."


def ask(port: int, model: str, max_tokens: int) -> tuple[float, dict]:
    """One whole chat request: (seconds, body)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.loads(r.read())
    return time.perf_counter() - t0, out


def ask_pair(port: int, max_tokens: int) -> tuple[float, dict]:
    """Both models asked directly at the same moment (no arbiter): seconds until both answered."""
    outs: list = []
    t0 = time.perf_counter()
    threads = [
        threading.Thread(target=lambda m=m: outs.append(ask(port, m, max_tokens))) for m in (BUNDLED_MODEL_ID, F16)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(outs) == 2
    return time.perf_counter() - t0, {}


def start_pinned(node: NodeProcess, core: int) -> NodeProcess:
    """Start ``node`` with this thread's CPU affinity set to ``core`` (inherited by the node and
    every process it starts), then restore it."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        return node.start()
    finally:
        os.sched_setaffinity(0, before)


def start_nodes(tmp: Path, args, f16: Path) -> tuple[NodeProcess, list[NodeProcess]]:
    """The node every request goes to, and every node started (to stop)."""
    cfg = tmp / "config.toml"
    cfg.write_text(
        f"[defaults.model_fit]\nctx_size = 1024\n[defaults.throughput]\nthreads = {args.threads}\n"
        "[moa]\ndeadline_s = 600\n"
    )
    if not args.pin:
        node = NodeProcess(tmp / "home", "--config", str(cfg), "--model", BUNDLED_MODEL_ID, "--model", f"{F16}={f16}")
        return node.start(), [node]
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("--pin needs two CPUs")
    a = start_pinned(NodeProcess(tmp / "a", "--config", str(cfg), "--model", BUNDLED_MODEL_ID), 0)
    nodes = [a]
    try:
        b = NodeProcess(tmp / "b", "--config", str(cfg), "--model", f"{F16}={f16}", "--join", a.invite())
        nodes.append(start_pinned(b, 1))
        a.wait_status(
            lambda st: any(F16 in json.dumps(p) and p["state"] == "alive" for p in st["peers"]),
            timeout=120,
            what="node A sees node B's model",
        )
        deadline = time.monotonic() + 120
        while F16 not in json.dumps(
            json.load(urllib.request.urlopen(f"http://127.0.0.1:{a.api_port}/v1/models", timeout=10))
        ):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{F16} not routable from node A")
            time.sleep(0.5)
    except BaseException:
        for n in nodes:
            n.kill_all()
        raise
    return a, nodes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument(
        "--pin",
        action="store_true",
        help="two joined nodes, one member each, each pinned to its own core (members on two hosts)",
    )
    args = ap.parse_args()
    f16 = ensure_f16_target(bundled_model_path())
    with tempfile.TemporaryDirectory(prefix="hydra-bench-moa-") as tmp:
        node, nodes = start_nodes(Path(tmp), args, f16)
        try:
            models = (BUNDLED_MODEL_ID, F16, PAIR, "mesh")
            times: dict[str, list[float]] = {m: [] for m in models}
            inside: list[float] = []
            for i in range(args.warmup + args.rounds):
                for m in models:
                    seconds, out = (ask_pair if m == PAIR else lambda p, t, m=m: ask(p, m, t))(
                        node.api_port, args.max_tokens
                    )
                    if m == "mesh":
                        info = out["hydra_moa"]
                        assert not info["reducer"]["ran"] and all(x["status"] == "ok" for x in info["members"]), info
                        if i >= args.warmup:  # the members' own time inside the mesh request (node's clock)
                            inside.append(max(x["latency_ms"] for x in info["members"]) / 1000)
                    if i >= args.warmup:
                        times[m].append(seconds)
        finally:
            for n in nodes:
                n.kill_all()
    med = {m: statistics.median(v) for m, v in times.items()}
    slowest = max((BUNDLED_MODEL_ID, F16), key=med.get)
    fastest = min((BUNDLED_MODEL_ID, F16), key=med.get)
    print(
        f"rounds={args.rounds} max_tokens={args.max_tokens} threads={args.threads} "
        f"{'members on two pinned nodes (cores 0 and 1)' if args.pin else 'both members on one node'} "
        "(median whole-request seconds)"
    )
    for m in models:
        print(f"  {m:32s} {med[m]:7.3f} s   (min {min(times[m]):.3f}, max {max(times[m]):.3f})")
    print(
        f"  {'mesh: its slowest member inside':32s} {statistics.median(inside):7.3f} s   "
        f"(the rest of the mesh request, {med['mesh'] - statistics.median(inside):.3f} s, is routing, "
        "arbitration and the answer)"
    )
    print(f"mesh / slowest member alone ({slowest}): {med['mesh'] / med[slowest]:.3f}   (goal <= 1.1)")
    print(f"mesh / fastest member alone ({fastest}): {med['mesh'] / med[fastest]:.3f}")
    print(
        f"mesh / both members asked directly at once: {med['mesh'] / med[PAIR]:.3f}   (the arbiter's own cost; "
        "above 1.0 only by its overhead)"
    )


if __name__ == "__main__":
    main()
