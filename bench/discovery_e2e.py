"""End-to-end discovery benchmark with real node processes (prints figures; asserts nothing).

A hosts the bundled model and publishes its mesh on nostr-sdk's LocalRelay (a helper process)
and announces itself with mDNS on a random loopback test port.  Each run starts a fresh
``serve --no-model --auto`` node B and measures, from the spawn of B's process:

* ``ready``: B's ports file written (discovered, joined, APIs up);
* ``first_ok``: the first ``/v1/completions`` (max_tokens 1) through B that answers 200, i.e. A's
  model served over the joined mesh (goal: <= 3 s);
* ``discovery``: B's own figure for the discovery phase (``auto_result.discovery_s``).

Variants: ``nostr`` (relays only), ``both`` (adds the LAN settle of 1.2 s unless a LAN mesh we hold a
credential for shows up), and ``mdns-member`` (B restarts as a member: LAN only, dials A's advert).
mDNS start -> full view between in-process services is measured by ``bench/discovery.py``.

Usage: .venv/bin/python bench/discovery_e2e.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from harness import NodeProcess, request  # noqa: E402
from hydra_node.models import BUNDLED_MODEL_ID  # noqa: E402

GOAL_S = 3.0
RUN_TIMEOUT_S = 60.0
BODY = {"model": BUNDLED_MODEL_ID, "prompt": "1, 2,", "max_tokens": 1, "temperature": 0}


def start_relay() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "discovery" / "local_relay_process.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    return proc, proc.stdout.readline().strip()


def one_run(home: Path, args: list[str]) -> dict:
    b = NodeProcess(home, *args)
    t0 = time.perf_counter()
    b.start(wait=False)
    try:
        b.wait_ready(RUN_TIMEOUT_S)
        t_ready = time.perf_counter()
        deadline = t_ready + RUN_TIMEOUT_S
        while True:
            try:
                code, _ = request("POST", b.api_port, "/v1/completions", BODY, timeout=RUN_TIMEOUT_S)
            except OSError:
                code = 0
            if code == 200:
                break
            if time.perf_counter() > deadline:
                raise TimeoutError("no successful request through B")
            time.sleep(0.02)
        t_ok = time.perf_counter()
        auto = b.status()["discovery"]["auto_result"]
        b.stop()
        return {
            "ready": t_ready - t0,
            "first_ok": t_ok - t0,
            "discovery": auto["discovery_s"],
            "outcome": f"{auto['outcome']}/{auto.get('chosen', {}).get('source')}",
        }
    finally:
        b.kill_all()


def summary(name: str, rows: list[dict]) -> None:
    def med(k):
        return statistics.median(r[k] for r in rows)

    fo = sorted(r["first_ok"] for r in rows)
    print(
        f"{name:<12} n={len(rows)}  spawn->ready median {med('ready'):.2f} s   spawn->first 200 median "
        f"{med('first_ok'):.2f} s (min {fo[0]:.2f}, max {fo[-1]:.2f}; goal {GOAL_S:.0f} s: ratio "
        f"{med('first_ok') / GOAL_S:.2f})   discovery phase median {med('discovery') * 1000:.0f} ms   "
        f"outcomes {sorted({r['outcome'] for r in rows})}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    a = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="hydra-disc-e2e-"))
    relay, url = start_relay()
    mdns = [
        "--mdns-group",
        "224.0.0.251",
        "--mdns-port",
        str(random.randrange(20000, 60000)),
        "--mdns-interface",
        "127.0.0.1",
    ]
    node_a = NodeProcess(root / "a", "--publish", "--mdns", "--nostr-relay", url, *mdns)
    try:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "hydra_node.cli", "--version"], check=True, capture_output=True)
        print(f"baseline: `hydra-node --version` (interpreter + CLI imports) {time.perf_counter() - t0:.2f} s")
        node_a.start()
        node_a.wait_status(lambda s: s["discovery"]["nostr"]["relays"][0]["ok_accepted"] >= 1, timeout=30)
        results: dict[str, list[dict]] = {"nostr": [], "both": [], "mdns-member": []}
        for i in range(a.runs):
            home = root / f"b{i}"
            results["nostr"].append(
                one_run(home, ["--no-model", "--auto", "--mesh-discovery-mode", "nostr", "--nostr-relay", url])
            )
            results["mdns-member"].append(
                one_run(home, ["--no-model", "--auto", "--mesh-discovery-mode", "mdns", *mdns])
            )
            shutil.rmtree(home)
            results["both"].append(one_run(root / f"c{i}", ["--no-model", "--auto", "--nostr-relay", url, *mdns]))
        for name, rows in results.items():
            summary(name, rows)
        print(json.dumps(results))
    finally:
        node_a.kill_all()
        relay.stdin.close()
        relay.wait(5)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
