"""The scheduler live: a loopback mesh with one slowed host, routing `off` vs `active`.

Four processes: two hosts of the bundled model (one made slower with `[runner]
inject_token_delay_ms`) and two entry nodes without a model, one with `[scheduler] mode = "off"`
(the fixed rule: lowest queue, then RTT) and one with `mode = "active"`. Requests alternate
between the two entries (off, active, off, active, ...), so both see the same machine load. The
client measures TTFT (first content chunk of a stream) and completion time.

Prints p50/p95 TTFT and completion time per mode, the ratios active/off, and where each entry's
requests were served.

Run: .venv/bin/python bench/scheduler_live.py [--requests 12] [--delay-ms 100] [--max-tokens 8]
     [--concurrency 1] [--warmup 3]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

from _common import NodeProcess

MODEL = "SmolLM2-135M-Instruct-Q4_1"
GOSSIP_WAIT_S = 30.0


def stream_chat(port: int, text: str, max_tokens: int) -> tuple[float, float]:
    """One streamed chat request on a raw socket: (ttft_s, completion_s)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    payload = json.dumps(body).encode()
    t0 = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload
        )
        buf, t_first = b"", None
        while b"data: [DONE]" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                raise RuntimeError(f"connection closed early: {buf[-300:]!r}")
            buf += chunk
            if t_first is None and b'"content":"' in buf.replace(b'"content":""', b""):
                t_first = time.perf_counter()
    t_end = time.perf_counter()
    return (t_first or t_end) - t0, t_end - t0


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * len(xs) + 0.5) - 1))]  # nearest rank


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=12, help="requests per mode")
    ap.add_argument("--delay-ms", type=float, default=100.0, help="injected per-token delay of the slow host")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=1, help="parallel clients per mode")
    ap.add_argument("--warmup", type=int, default=3, help="unmeasured requests straight at each host first")
    args = ap.parse_args()

    base = Path(tempfile.mkdtemp(prefix="hydra-sched-live-"))
    (base / "slow.toml").write_text(f"[runner]\ninject_token_delay_ms = {args.delay_ms}\n")
    (base / "off.toml").write_text('[scheduler]\nmode = "off"\n')
    (base / "active.toml").write_text('[scheduler]\nmode = "active"\n')
    nodes: list[NodeProcess] = []
    try:
        fast = NodeProcess(base / "fast", "--name", "fast").start()
        nodes.append(fast)
        token = fast.invite()
        slow = NodeProcess(base / "slow", "--name", "slow", "--config", str(base / "slow.toml"), "--join", token)
        off = NodeProcess(base / "off", "--no-model", "--config", str(base / "off.toml"), "--join", token)
        active = NodeProcess(base / "active", "--no-model", "--config", str(base / "active.toml"), "--join", token)
        for n in (slow, off, active):
            nodes.append(n)
            n.start(wait=False)
        for n in (slow, off, active):
            n.wait_ready()
        ids = {fast.status()["node_id"]: "fast", slow.status()["node_id"]: "slow"}
        for entry in (off, active):
            entry.wait_status(
                lambda st: sum(1 for p in st["peers"] if p["state"] == "alive" and p["models"]) == 2,
                GOSSIP_WAIT_S,
                "both hosts alive",
            )
        # Warm both runners straight at the hosts (a fresh runner's first requests are several
        # times slower on a loaded machine); not measured, and the entries learn only hints from it.
        for host in (fast, slow):
            for i in range(args.warmup):
                stream_chat(host.api_port, f"Warm-up {i}: say hello.", args.max_tokens)
        results: dict[str, list[tuple[float, float]]] = {"off": [], "active": []}
        lock = threading.Lock()

        def client(worker: int) -> None:
            for i in range(worker, args.requests, args.concurrency):
                for mode, entry in (
                    (("off", off), ("active", active)) if i % 2 == 0 else (("active", active), ("off", off))
                ):
                    r = stream_chat(entry.api_port, f"Request {i}: name a fruit and a colour.", args.max_tokens)
                    with lock:
                        results[mode].append(r)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=client, args=(w,)) for w in range(args.concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0

        print(
            f"scheduler live bench: {args.requests} requests per mode, slow host +{args.delay_ms:g} ms/token, "
            f"max_tokens {args.max_tokens}, concurrency {args.concurrency}, wall {wall:.1f} s"
        )
        print(f"{'mode':<8}{'TTFT p50':>10}{'TTFT p95':>10}{'done p50':>10}{'done p95':>10}   served (fast/slow)")
        summary = {}
        for mode, entry in (("off", off), ("active", active)):
            ttft = [r[0] for r in results[mode]]
            done = [r[1] for r in results[mode]]
            summary[mode] = (pct(ttft, 0.5), pct(ttft, 0.95), pct(done, 0.5), pct(done, 0.95))
            served = {"fast": 0, "slow": 0}
            for t in entry.status()["network_costs"]["targets"]:
                if t["node"] in ids:
                    served[ids[t["node"]]] += t["successes"]
            print(
                f"{mode:<8}"
                + "".join(f"{v * 1000:>8.0f}ms" for v in summary[mode])
                + f"   {served['fast']}/{served['slow']}"
            )
        ratios = [a / o if o else float("nan") for a, o in zip(summary["active"], summary["off"])]
        print(
            "ratio active/off: TTFT p50 {:.2f}, TTFT p95 {:.2f}, completion p50 {:.2f}, completion p95 {:.2f}".format(
                *ratios
            )
        )
        st = active.status()["scheduler"]
        print(
            f"active entry: decisions {st['decisions']}, overrides {st['overrides']}; "
            f"mean TTFT off {statistics.mean(r[0] for r in results['off']) * 1000:.0f} ms, "
            f"active {statistics.mean(r[0] for r in results['active']) * 1000:.0f} ms"
        )
        slow_id = next(k for k, v in ids.items() if v == "slow")
        for d in reversed(st["recent_decisions"]):  # why the active entry chose the slow host
            if d["target"].startswith(slow_id):
                terms = {
                    ids.get(sc["target"].split("/")[0], "?"): {
                        k: round(sc[k]) for k in ("total_ms", "queue_ms", "prefill_ms", "decode_ms", "unknown_ms")
                    }
                    for sc in d["scores"]
                }
                print(f"  active -> slow: {d['reason']}; {terms}")
    finally:
        for n in nodes:
            n.kill_all()


if __name__ == "__main__":
    main()
