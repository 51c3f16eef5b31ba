"""Discrete-event replay of request traces against a heterogeneous mesh, per routing policy.

Every policy sees the same trace, the same hosts and the same random draws for host behaviour
(the host's RNG is seeded per request, not per policy). Hydra active uses the real
``hydra_node.routing`` scheduler and telemetry, fed only with what a router observes: TTFT,
completion time, server-reported queue wait and cached tokens, token counts, RTT probes, failures.

    .venv/bin/python bench/scheduler_sim.py [--seed N] [--seeds N] [--duration S]
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import math
import random
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hydra_node.routing import (  # noqa: E402
    Candidate,
    RequestFeatures,
    Scheduler,
    SchedulerConfig,
    Target,
)

MODEL = "qwen3-8b"
PROBE_EVERY_S = 2.0
MAX_ATTEMPTS = 3
CONTENTION = 0.12  # per extra active stream, each stream's TPOT grows by this fraction
PREFILL_OVERHEAD_MS = 15.0


@dataclass(frozen=True)
class HostSpec:
    name: str
    slots: int
    prefill_tps: float
    decode_tps: float
    rtt_ms: float
    jitter_ms: float
    context: int
    advertised_decode_tps: float
    advertised_prefill_tps: float
    cache_entries: int = 8
    fail_from_s: float = math.inf
    fail_prob: float = 0.0
    fail_after_ms: float = 1500.0


def uniform_mesh() -> list[HostSpec]:
    """Four identical LAN GPUs: nothing to learn, so Hydra must simply not lose."""
    return [HostSpec(f"gpu{i}", 2, 2000, 40, 4, 1, 16384, 40, 2000) for i in range(4)]


def mesh(failing: bool = False) -> list[HostSpec]:
    """Five hosts: a local GPU, a LAN GPU, a Mac, a CPU box, a WAN GPU (advertises too much)."""
    wan_fail = dict(fail_from_s=150.0, fail_prob=0.7) if failing else {}
    return [
        HostSpec("local", 4, 4000, 60, 0, 0, 16384, 60, 4000),
        HostSpec("lan-gpu", 2, 2000, 40, 4, 1, 16384, 40, 2000),
        HostSpec("mac", 2, 600, 25, 12, 3, 8192, 25, 600),
        HostSpec("cpu", 1, 150, 12, 3, 1, 4096, 12, 150),
        HostSpec("wan-gpu", 4, 3000, 50, 90, 25, 16384, 70, 5000, **wan_fail),
    ]


@dataclass(frozen=True)
class Req:
    rid: int
    arrival: float
    session: str | None
    prompt: int
    shared: int  # tokens shared with the session's previous turn (cacheable)
    output: int
    max_tokens: int


def make_trace(kind: str, seed: int, duration: float) -> list[Req]:
    rng = random.Random(f"{kind}-{seed}")
    reqs: list[Req] = []
    rate = 1.2  # requests/s on average (~40% of the mesh's capacity, ~60% without the WAN GPU)

    def output() -> int:
        return max(8, min(512, int(rng.lognormvariate(math.log(130), 0.6))))

    if kind in ("hetero-prompts", "uniform"):
        t = 0.0
        while t < duration:
            t += rng.expovariate(rate * 0.9)
            prompt = max(30, min(12000, int(rng.lognormvariate(math.log(700), 1.1))))
            reqs.append(Req(0, t, None, prompt, 0, output(), 512))
    else:
        # Multi-turn chat sessions: each turn re-sends the history (prefix cache reuse).
        t = 0.0
        session_rate = rate / 4.0
        n = 0
        while t < duration:
            if kind == "bursty":
                phase = (t % 60.0) < 12.0  # 12 s bursts every minute at 3.5x the base rate
                t += rng.expovariate(session_rate * (3.5 if phase else 0.375))
            else:
                t += rng.expovariate(session_rate)
            n += 1
            at, history = t, 0
            system = rng.choice((200, 400, 800))
            for _turn in range(rng.randint(2, 6)):
                user = max(10, int(rng.lognormvariate(math.log(120), 0.8)))
                out = output()
                prompt = system + history + user
                reqs.append(Req(0, at, f"s{n}", prompt, system + history, out, 512))
                history += user + out
                at += rng.expovariate(1 / 12.0) + 2.0
    reqs.sort(key=lambda r: r.arrival)
    return [
        Req(i, r.arrival, r.session, r.prompt, r.shared, r.output, r.max_tokens)
        for i, r in enumerate(reqs)
        if r.arrival < duration
    ]


@dataclass
class Host:
    spec: HostSpec
    active: int = 0
    queue: list = field(default_factory=list)
    cache: OrderedDict = field(default_factory=OrderedDict)  # session -> cached tokens


class Sim:
    """One policy over one trace."""

    def __init__(
        self, policy: str, specs: list[HostSpec], trace: list[Req], seed: int, overrides: dict | None = None
    ) -> None:
        self.policy, self.trace, self.seed = policy, trace, seed
        self.hosts = {s.name: Host(s) for s in specs}
        self.names = [s.name for s in specs]
        self.in_flight = {n: 0 for n in self.names}
        self.events: list = []
        self.seq = itertools.count()
        self.rr = 0
        self.rng = random.Random(f"policy-{policy}-{seed}")
        self.results: dict[int, tuple[float, float, bool]] = {}
        mode = {"hydra": "active", "sticky-lq": "off"}.get(policy)
        cfg = SchedulerConfig.from_mapping({**(overrides or {}), "mode": mode or "off"})
        self.scheduler = Scheduler(cfg) if mode else None

    def target(self, name: str) -> Target:
        return Target("local" if name == "local" else name, MODEL)

    def push(self, at: float, kind: str, *payload) -> None:
        heapq.heappush(self.events, (at, next(self.seq), kind, payload))

    # ---- policies ------------------------------------------------------------------------
    def eligible(self, req: Req, tried: set[str]) -> list[str]:
        names = [n for n in self.names if n not in tried and self.hosts[n].spec.context >= req.prompt + req.max_tokens]
        return names or [n for n in self.names if self.hosts[n].spec.context >= req.prompt + req.max_tokens]

    def choose(self, req: Req, tried: set[str], now: float) -> str:
        names = self.eligible(req, tried)
        if self.policy == "round-robin":
            self.rr += 1
            return names[self.rr % len(names)]
        if self.policy == "least-queue":
            low = min(self.in_flight[n] for n in names)
            return self.rng.choice([n for n in names if self.in_flight[n] == low])
        if self.policy == "p2c":
            pair = self.rng.sample(names, 2) if len(names) > 1 else names
            return min(pair, key=lambda n: (self.in_flight[n], self.rng.random()))
        # One router, so its in-flight count is the whole load: queue_depth is what the host's
        # gossip would say. Every policy sees the same in-flight counts.
        candidates = []
        for n in names:
            spec = self.hosts[n].spec
            candidates.append(
                Candidate(
                    self.target(n),
                    spec.context,
                    in_flight=self.in_flight[n],
                    queue_depth=max(0, self.in_flight[n] - spec.slots),
                    slots=spec.slots,
                    advertised_decode_tps=spec.advertised_decode_tps,
                    advertised_prefill_tps=spec.advertised_prefill_tps,
                )
            )
        features = RequestFeatures(MODEL, req.prompt, req.max_tokens, session_key=req.session, prefix_key=None)
        decision = self.scheduler.decide(candidates, features, now)
        return decision.target.node

    # ---- host model ----------------------------------------------------------------------
    def send(self, req: Req, tried: set[str], now: float) -> None:
        name = self.choose(req, tried, now)
        self.in_flight[name] += 1
        spec = self.hosts[name].spec
        one_way = (spec.rtt_ms + random.Random(f"j{req.rid}-{len(tried)}").uniform(0, spec.jitter_ms)) / 2000
        self.push(now + one_way, "enqueue", req, name, tried, now, one_way)

    def start_next(self, name: str, now: float) -> None:
        host = self.hosts[name]
        while host.queue and host.active < host.spec.slots:
            req, tried, sent_at, one_way, enq = host.queue.pop(0)
            host.active += 1
            spec = host.spec
            draw = random.Random(f"h{self.seed}-{req.rid}-{len(tried)}")
            if now >= spec.fail_from_s and draw.random() < spec.fail_prob:
                self.push(now + spec.fail_after_ms / 1000, "fail", req, name, tried, sent_at, one_way)
                continue
            cached = 0
            if req.session and req.session in host.cache:
                cached = min(host.cache[req.session], req.shared)
                host.cache.move_to_end(req.session)
            prefill_s = (PREFILL_OVERHEAD_MS + (req.prompt - cached) * 1000 / spec.prefill_tps) / 1000
            tpot_s = (1 + CONTENTION * (host.active - 1)) / spec.decode_tps
            first = now + prefill_s
            done = first + (req.output - 1) * tpot_s
            self.push(done, "done", req, name, tried, sent_at, one_way, first, now - enq, cached)

    def run(self) -> dict[int, tuple[float, float, bool]]:
        for req in self.trace:
            self.push(req.arrival, "arrive", req)
        t = 0.0
        end = self.trace[-1].arrival if self.trace else 0.0
        while t <= end:
            self.push(t, "probe")
            t += PROBE_EVERY_S
        while self.events:
            now, _, kind, p = heapq.heappop(self.events)
            if kind == "arrive":
                self.send(p[0], set(), now)
            elif kind == "probe":
                if self.scheduler is not None:
                    for n in self.names:
                        spec = self.hosts[n].spec
                        if n != "local":
                            rtt = spec.rtt_ms + random.Random(f"p{n}{now}").uniform(0, spec.jitter_ms)
                            self.scheduler.telemetry.observe_probe(self.target(n), rtt, now)
            elif kind == "enqueue":
                req, name, tried, sent_at, one_way = p
                self.hosts[name].queue.append((req, tried, sent_at, one_way, now))
                self.start_next(name, now)
            elif kind == "done":
                req, name, tried, sent_at, one_way, first, queue_s, cached = p
                self.finish(name, now)
                host = self.hosts[name]
                if req.session:
                    host.cache[req.session] = req.prompt + req.output
                    host.cache.move_to_end(req.session)
                    while len(host.cache) > host.spec.cache_entries:
                        host.cache.popitem(last=False)
                self.push(now + one_way, "reply", req, name, sent_at, first + one_way, queue_s, cached)
            elif kind == "reply":
                req, name, sent_at, first_seen, queue_s, cached = p
                self.in_flight[name] -= 1
                self.results[req.rid] = (first_seen - req.arrival, now - req.arrival, True)
                if self.scheduler is not None:
                    self.scheduler.telemetry.observe_request(
                        self.target(name),
                        now,
                        queue_wait_ms=queue_s * 1000,
                        ttft_ms=(first_seen - sent_at) * 1000,
                        duration_ms=(now - sent_at) * 1000,
                        prompt_tokens=req.prompt,
                        cached_tokens=cached,
                        completion_tokens=req.output,
                    )
            elif kind == "fail":
                req, name, tried, sent_at, one_way = p
                self.finish(name, now)
                self.push(now + one_way, "failed", req, name, tried, sent_at)
            elif kind == "failed":
                req, name, tried, sent_at = p
                self.in_flight[name] -= 1
                if self.scheduler is not None:
                    self.scheduler.telemetry.observe_failure(self.target(name), now, (now - sent_at) * 1000)
                tried = tried | {name}
                if len(tried) >= MAX_ATTEMPTS:
                    self.results[req.rid] = (now - req.arrival, now - req.arrival, False)
                else:
                    self.send(req, tried, now)
        return self.results

    def finish(self, name: str, now: float) -> None:
        self.hosts[name].active -= 1
        self.start_next(name, now)


#: sticky-lq is Hydra's own ``mode = off`` baseline: session affinity, else lowest queue, else RTT.
POLICIES = ("round-robin", "least-queue", "p2c", "sticky-lq", "hydra")
TRACES = ("steady", "bursty", "failing-host", "hetero-prompts", "uniform")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def run_all(seeds: range, duration: float, overrides: dict | None = None) -> dict:
    """Per (trace, policy): every request's TTFT and completion time, pooled over ``seeds``."""
    table: dict = {}
    for seed in seeds:
        for trace_kind in TRACES:
            trace = make_trace("steady" if trace_kind == "failing-host" else trace_kind, seed, duration)
            specs = uniform_mesh() if trace_kind == "uniform" else mesh(trace_kind == "failing-host")
            for policy in POLICIES:
                results = Sim(policy, specs, trace, seed, overrides).run()
                row = table.setdefault((trace_kind, policy), {"ttft": [], "done": [], "failed": 0})
                row["ttft"] += [r[0] for r in results.values()]
                row["done"] += [r[1] for r in results.values()]
                row["failed"] += sum(not r[2] for r in results.values())
    for row in table.values():
        row.update(
            n=len(row["ttft"]),
            ttft_p50=pct(row["ttft"], 0.5),
            ttft_p95=pct(row["ttft"], 0.95),
            done_p50=pct(row["done"], 0.5),
            done_p95=pct(row["done"], 0.95),
        )
    return table


def report(table: dict) -> bool:
    print(
        f"{'trace':15} {'policy':12} {'n':>5} {'fail':>4} {'TTFT p50':>9} {'TTFT p95':>9} "
        f"{'done p50':>9} {'done p95':>9}   (seconds)"
    )
    ok = True
    for trace_kind in TRACES:
        for policy in POLICIES:
            r = table[(trace_kind, policy)]
            print(
                f"{trace_kind:15} {policy:12} {r['n']:5d} {r['failed']:4d} {r['ttft_p50']:9.3f} "
                f"{r['ttft_p95']:9.3f} {r['done_p50']:9.2f} {r['done_p95']:9.2f}"
            )
        h = table[(trace_kind, "hydra")]
        fixed = [table[(trace_kind, p)] for p in POLICIES if p != "hydra"]
        best = min(fixed, key=lambda r: r["ttft_p95"])
        worst_gap = h["ttft_p95"] / best["ttft_p95"] - 1
        done_gap = h["done_p95"] / min(r["done_p95"] for r in fixed) - 1
        print(
            f"  hydra p95 TTFT: {_change(h, table[(trace_kind, 'round-robin')])} vs round-robin, "
            f"{_change(h, table[(trace_kind, 'least-queue')])} vs least-queue, "
            f"{worst_gap * 100:+.1f}% vs best fixed (p95 completion {done_gap * 100:+.1f}%)"
        )
        ok &= worst_gap <= 0.05
    geo = {p: math.exp(sum(math.log(table[(t, p)]["ttft_p95"]) for t in TRACES) / len(TRACES)) for p in POLICIES}
    print("geometric mean over traces of p95 TTFT: " + ", ".join(f"{p} {v:.3f}s" for p, v in geo.items()))
    rr_cut, lq_cut = 1 - geo["hydra"] / geo["round-robin"], 1 - geo["hydra"] / geo["least-queue"]
    print(
        f"hydra: {rr_cut * 100:.1f}% lower than round-robin (goal >= 30%), "
        f"{lq_cut * 100:.1f}% lower than least-queue (goal >= 10%); on every trace at most 5% "
        f"above the best fixed policy: {'yes' if ok else 'NO'}"
    )
    return ok and rr_cut >= 0.30 and lq_cut >= 0.10


def _change(h: dict, other: dict) -> str:
    return f"{(h['ttft_p95'] / other['ttft_p95'] - 1) * 100:+.1f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seeds", type=int, default=3, help="run seeds seed..seed+N-1")
    parser.add_argument("--duration", type=float, default=600.0, help="trace length, simulated s")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a [scheduler] key for the hydra policy",
    )
    args = parser.parse_args()
    overrides = {}
    for item in args.set:
        key, _, value = item.partition("=")
        overrides[key] = float(value) if key not in ("mode",) else value
    started = time.perf_counter()
    seeds = range(args.seed, args.seed + args.seeds)
    print(f"seeds {seeds.start}..{seeds.stop - 1}, {args.duration:.0f} s per trace, overrides {overrides or 'none'}")
    ok = report(run_all(seeds, args.duration, overrides))
    print(f"goals {'met' if ok else 'NOT met'}; wall {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
