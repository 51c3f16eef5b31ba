"""Model transfer: a download from an HTTP server vs the same file from a mesh peer, side by side.

Both sides move the bundled GGUF (98 MB) on this machine's loopback, into an empty cache, and
verify its sha256 before it counts as done:
* http: `download_http` from the tests' Hub stand-in (a threaded `http.server`), in this process;
* mesh: node B asks node A over their encrypted link (`POST /api/models/fetch` on B: the
  `model_fetch` stream, B's worker-thread writes, the sha256, the commit).
Rounds alternate which side goes first. Reported: seconds and MB/s per side (median over
rounds) and the ratio mesh/http of the throughputs.

Run: .venv/bin/python bench/model_fetch.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # harness, waiting
# the Hub stand-in of the download tests
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "runtime" / "fetch"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _common

from _common import NodeProcess, median
from harness import request
from test_models_download import BUNDLED, HubStandIn
from waiting import poll_until

from hydra_node.runtime.fetch import ModelCache, load_catalogue, resolve_remote
from hydra_node.runtime.fetch.http_fetch import download_http

REF = "hf://bench/models-GGUF/shared.gguf"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    data = BUNDLED.read_bytes()
    size_mb = len(data) / 1e6
    root = Path(tempfile.mkdtemp(prefix="hydra-bench-fetch-"))
    hub = HubStandIn({"/bench/models-GGUF/resolve/main/shared.gguf": data})
    remote = resolve_remote(REF, load_catalogue(), hub.url)
    download_http(remote, ModelCache(root / "a" / "models"), token=None, read_timeout_s=30)
    a = NodeProcess(root / "a", "--no-model", "--no-rpc-worker").start()
    b = NodeProcess(root / "b", "--no-model", "--no-rpc-worker", "--join", a.invite())
    times: dict[str, list[float]] = {"http": [], "mesh": []}
    try:
        b.start()

        def http_once() -> float:
            cache_dir = root / "http-cache"
            shutil.rmtree(cache_dir, ignore_errors=True)
            t0 = time.perf_counter()
            download_http(remote, ModelCache(cache_dir), token=None, read_timeout_s=30)
            return time.perf_counter() - t0

        def mesh_once() -> float:
            ModelCache(root / "b" / "models").remove("shared")
            t0 = time.perf_counter()
            code, body = request("POST", b.console_port, "/api/models/fetch", {"model": REF}, timeout=300)
            if code == 404:  # A's announcement has not reached B yet (first round only)
                return -1.0
            assert code == 200 and json.loads(body)["source"].startswith("peer:"), body
            return time.perf_counter() - t0

        poll_until(lambda: mesh_once() >= 0 or None, timeout_s=30, what="B sees A's models")  # warm-up
        for r in range(args.rounds):
            order = ("http", "mesh") if r % 2 == 0 else ("mesh", "http")
            for side in order:
                times[side].append(http_once() if side == "http" else mesh_once())
    finally:
        b.kill_all()
        a.kill_all()
        hub.close()
        shutil.rmtree(root, ignore_errors=True)
    print(f"file: {BUNDLED.name}, {size_mb:.1f} MB, {args.rounds} rounds, loopback, sha256 verified on both sides")
    print(f"{'side':<6} {'median s':>9} {'MB/s':>8}   rounds (s)")
    rate = {}
    for side, ts in times.items():
        rate[side] = size_mb / median(ts)
        print(f"{side:<6} {median(ts):9.2f} {rate[side]:8.1f}   {', '.join(f'{t:.2f}' for t in ts)}")
    print(f"ratio mesh/http throughput: {rate['mesh'] / rate['http']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
