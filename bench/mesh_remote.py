"""Remote routing overhead: the same requests at the host itself and through a peer that hosts nothing.

Two nodes on loopback (A hosts the bundled model; C joins with --no-model). Greedy,
same prompts, interleaved (alternating which goes first). Prints decode tokens/s and
TTFT for each path and the ratios issue 3 asks for:

  throughput via peer / at host >= 0.95, median added TTFT <= 20 ms.

Run: .venv/bin/python bench/mesh_remote.py [--rounds 5] [--max-tokens 96]
"""

from __future__ import annotations

import argparse
import tempfile
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
    args = ap.parse_args()
    from hydra_node.models import BUNDLED_MODEL_ID

    root = Path(tempfile.mkdtemp(prefix="hydra-bench-mesh-"))
    a = NodeProcess(root / "a").start()
    c = NodeProcess(root / "c", "--no-model", "--join", a.invite()).start()
    try:
        c.wait_status(lambda st: any(p["state"] == "alive" for p in st["peers"]), timeout=30)
        res = {"host": {"ttft": [], "tps": []}, "via_peer": {"ttft": [], "tps": []}}
        ports = {"host": a.api_port, "via_peer": c.api_port}

        def body(p):
            return {"model": BUNDLED_MODEL_ID, "prompt": p, "max_tokens": args.max_tokens, "temperature": 0}

        for p in PROMPTS:
            stream_completion(a.api_port, body(p)), stream_completion(c.api_port, body(p))
        for r in range(args.rounds):
            for i, p in enumerate(PROMPTS):
                order = ["host", "via_peer"] if (r + i) % 2 == 0 else ["via_peer", "host"]
                for name in order:
                    ttft, dec, n = stream_completion(ports[name], body(p))
                    res[name]["ttft"].append(ttft * 1000)
                    if n > 1 and dec > 0:
                        res[name]["tps"].append((n - 1) / dec)
        rtt = [p["rtt_ms"] for p in c.status()["peers"]]
    finally:
        a.kill_all()
        c.kill_all()
    print(f"samples per path: {len(res['host']['ttft'])}, max_tokens={args.max_tokens}, link rtt_ms={rtt}")
    print(f"{'':9} {'decode tok/s (median)':>22} {'TTFT ms (median)':>18}")
    for name, v in res.items():
        print(f"{name:9} {median(v['tps']):22.1f} {median(v['ttft']):18.1f}")
    ratio = median(res["via_peer"]["tps"]) / median(res["host"]["tps"])
    added = [x - y for x, y in zip(res["via_peer"]["ttft"], res["host"]["ttft"])]
    print(f"throughput ratio via_peer/host: {ratio:.3f}  (goal >= 0.95)")
    print(f"median added TTFT: {median(added):.1f} ms  (goal <= 20 ms)")


if __name__ == "__main__":
    main()
