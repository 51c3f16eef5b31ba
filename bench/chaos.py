"""Chaos: streams go on while hosts are killed with ``kill -9`` and restarted (issue 26 item 6).

A mesh on loopback: H hosts of the bundled model (default 3) and one API-only node (``--no-model``)
that every client talks to. The hosts sleep ``--token-delay-ms`` per token
(``[runner].inject_token_delay_ms``, as tests/routing/test_continuation_live.py does) so a
48-token answer lasts long enough to be cut. First each prompt's reference output is computed by an
uninterrupted, sequential run through the API-only node. Then, for R rounds: C concurrent
streaming greedy chat clients (one distinct prompt each) start; once a random client has received a
random number of content chunks (``--cut-min``..``--cut-max``), the killer ``kill -9``s the process
group of a random host serving at least one of the streams (its node and its runner), waits for the
streams to end, restarts the host (``--join`` with an invite from a live host, as
tests/routing/test_handover_live.py does) and waits until the API-only node sees its model and
model identity again.

Reported: requests started / completed / failed; outputs identical to the reference; characters
duplicated or lost against the reference (:func:`text_diff`; goal 0); continued requests
(``hydra_served_by`` naming more than one host); the stall each continuation added (the gap between
the last content chunk before the kill and the first after it) p50/p95, next to the failure
detection time measured in the same run (the kill to the API-only node's ``request.continued``
event on ``/api/events``, first per kill) and the prompt's prefill time (TTFT at a host's own API,
its local runner, minus the median inter-token gap: the prefill, not the first decode and its
injected delay); goal: stall p95 <= detection + 2 x prefill. The time from a model's last host
dying to that model answering elsewhere is item 4 (re-hosting), not built: reported as n/a.
No asserts on timings; a table, then one JSON line of figures.

Greedy outputs depend on their batch neighbours (docs/scheduler.md "The runner's contract": a near
tie can break the other way beside other sequences' cells), so by default each host decodes one
sequence at a time (``--parallel 1``) and a control round of the same concurrent clients with no kill
shows how many outputs match the sequential reference anyway; ``--parallel 0`` keeps the node's
default slots. Each differing output is classed by where it parts from its reference: before the
kill (not the continuation's doing) or at/after it; chaos-details.json in the run's folder holds
every output next to its reference.

Run: .venv/bin/python bench/chaos.py [--hosts 3] [--clients 4] [--rounds 3] [--max-tokens 48]
       [--token-delay-ms 40] [--cut-min 5] [--cut-max 20] [--seed 1] [--parallel 1]
       [--control-rounds 1]
"""

from __future__ import annotations

import argparse
import difflib
import http.client
import json
import random
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from _common import NodeProcess, median, percentile

PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "Explain why the sky is blue to a ten year old.",
    "Describe a walk through a forest in autumn.",
    "List some good habits for a healthy morning routine.",
    "Tell me about the history of the bicycle.",
    "Write a letter to a friend about a trip to the sea.",
    "What makes a good cup of tea?",
    "Describe the life of a lighthouse keeper.",
]
MESH_TIMEOUT_S = 120.0
STREAM_TIMEOUT_S = 180.0


def text_diff(reference: str, got: str) -> tuple[int, int]:
    """``(duplicated, lost)`` characters of ``got`` against ``reference``: duplicated = characters
    in ``got`` that the reference lacks (inserted, or the new side of a replacement), lost =
    characters of the reference missing from ``got`` (deleted, or the old side of a replacement).
    Both 0 exactly when the texts are equal."""
    duplicated = lost = 0
    matcher = difflib.SequenceMatcher(None, reference, got, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op in ("insert", "replace"):
            duplicated += j2 - j1
        if op in ("delete", "replace"):
            lost += i2 - i1
    return duplicated, lost


def first_difference(a: str, b: str) -> int | None:
    """The index of the first character where ``a`` and ``b`` differ (the shorter one's length if
    one is a prefix of the other), or None when they are equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def stall_across(times: list[float], t_cut: float) -> float | None:
    """The gap between the last arrival before ``t_cut`` and the first after it (seconds), or None
    when no arrival lies on both sides."""
    before = [t for t in times if t <= t_cut]
    after = [t for t in times if t > t_cut]
    if not before or not after:
        return None
    return min(after) - max(before)


@dataclass
class StreamResult:
    prompt: str
    served_by_header: str | None = None
    text: str = ""
    chunk_times: list[float] = field(default_factory=list)
    chunk_ends: list[int] = field(default_factory=list)  # len(text) after each content chunk
    served_by: list[str] = field(default_factory=list)
    completion_tokens: int | None = None
    error: str | None = None


def stream(port: int, prompt: str, max_tokens: int, on_chunk=None) -> StreamResult:
    """One streaming greedy chat to 127.0.0.1:``port``: its text, content-chunk arrival times, the
    final chunk's ``hydra_served_by`` (or the header's one host) and any error (never raised)."""
    res = StreamResult(prompt)
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    from hydra_node.models import BUNDLED_MODEL_ID

    body["model"] = BUNDLED_MODEL_ID
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=STREAM_TIMEOUT_S)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            res.error = f"HTTP {r.status}: {r.read(500)!r}"
            return res
        res.served_by_header = r.getheader("x-hydra-served-by")
        done = False
        while line := r.readline():
            line = line.strip()
            if line == b"data: [DONE]":
                done = True
                break
            if not line.startswith(b"data: "):
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                res.error = f"error event: {ev['error']}"
                return res
            if ev.get("usage"):
                res.completion_tokens = ev["usage"].get("completion_tokens")
            if ev.get("hydra_served_by"):
                res.served_by = list(ev["hydra_served_by"])
            for c in ev.get("choices") or ():
                piece = (c.get("delta") or {}).get("content")
                if piece:
                    res.text += piece
                    res.chunk_times.append(time.perf_counter())
                    res.chunk_ends.append(len(res.text))
                    if on_chunk is not None:
                        on_chunk(len(res.chunk_times), res)
        if not done:
            res.error = "stream ended without data: [DONE]"
    except (OSError, http.client.HTTPException, ValueError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    if not res.served_by and res.served_by_header:
        res.served_by = [res.served_by_header]
    return res


class ContinuedEvents:
    """Reads the API-only node's ``/api/events`` in a thread; keeps each ``request.continued``
    with its arrival time."""

    def __init__(self, console_port: int):
        from events_sse import SseStream  # tests/, on the path through _common

        self.events: list[tuple[float, dict]] = []
        self._sse = SseStream(console_port, timeout=3600)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                ev = self._sse.next()
                if isinstance(ev, dict) and ev.get("event") == "request.continued":
                    self.events.append((time.perf_counter(), ev["data"]))
        except (OSError, EOFError, http.client.HTTPException, ValueError):
            return

    def first_after(self, t: float, victim: str) -> float | None:
        times = [at for at, data in self.events if at >= t and data.get("from") == victim]
        return min(times) if times else None


def wait_hosts_seen(api: NodeProcess, host_ids: list[str], model: str) -> None:
    """Until ``api`` sees every host alive with ``model`` and its model identity (a continuation
    target needs one)."""
    api.wait_status(
        lambda st: all(
            any(
                p["id"] == h and p["state"] == "alive" and model in p["models"] and model in p.get("model_idents", {})
                for p in st["peers"]
            )
            for h in host_ids
        ),
        timeout=MESH_TIMEOUT_S,
        what="every host's model and identity seen by the API node",
    )


def prefill_estimate(host: NodeProcess, prompts: list[str], max_tokens: int) -> tuple[float, float, float]:
    """(TTFT, inter-token gap, prefill) medians in seconds, streamed at a host's own API (its local
    runner); prefill = TTFT - inter-token gap (the first token's decode and injected delay)."""
    ttfts, gaps = [], []
    for p in prompts:
        t0 = time.perf_counter()
        res = stream(host.api_port, p, max_tokens)
        if res.error or len(res.chunk_times) < 2:
            continue
        ttfts.append(res.chunk_times[0] - t0)
        gaps.append(median([b - a for a, b in zip(res.chunk_times, res.chunk_times[1:])]))
    ttft, gap = median(ttfts), median(gaps)
    return ttft, gap, max(0.0, ttft - gap)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=3, help="hosts of the bundled model (at least 3)")
    ap.add_argument("--clients", type=int, default=4, help="concurrent streaming clients per round")
    ap.add_argument("--rounds", type=int, default=3, help="kill/restart rounds")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--token-delay-ms", type=float, default=40.0, help="[runner].inject_token_delay_ms")
    ap.add_argument("--cut-min", type=int, default=5, help="fewest content chunks before the kill")
    ap.add_argument("--cut-max", type=int, default=20, help="most content chunks before the kill")
    ap.add_argument("--seed", type=int, default=1, help="the killer's random choices")
    ap.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="[defaults.throughput] parallel of each host: 1 (default) decodes one sequence at a time, so a "
        "greedy output does not depend on its batch neighbours; 0: the node's default",
    )
    ap.add_argument(
        "--control-rounds",
        type=int,
        default=1,
        help="rounds of the same concurrent clients with no kill first (greedy output beside other sequences)",
    )
    args = ap.parse_args()
    if args.hosts < 3:
        ap.error("--hosts must be at least 3 (issue 26 item 6)")
    if not 1 <= args.cut_min <= args.cut_max:
        ap.error("need 1 <= --cut-min <= --cut-max")
    if args.parallel < 0:
        ap.error("--parallel must be >= 0")
    if args.clients > len(PROMPTS):
        ap.error(f"--clients must be at most {len(PROMPTS)} (one distinct prompt each)")
    from hydra_node.models import BUNDLED_MODEL_ID as MODEL

    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="hydra-bench-chaos-"))
    cfg = root / "hydra.toml"
    slots = f"[defaults.throughput]\nparallel = {args.parallel}\n" if args.parallel else ""
    cfg.write_text(f"[runner]\ninject_token_delay_ms = {args.token_delay_ms:g}\n{slots}")
    common = ("--config", str(cfg), "--no-rpc-worker")
    hosts = [NodeProcess(root / f"h{i}", *common, "--name", f"h{i}") for i in range(args.hosts)]
    api = NodeProcess(root / "api", *common, "--no-model", "--name", "api")
    prompts = PROMPTS[: args.clients]
    try:
        t_setup = time.perf_counter()
        hosts[0].start()
        for h in hosts[1:]:
            h.args += ["--join", hosts[0].invite()]
            h.start(wait=False)
        api.args += ["--join", hosts[0].invite()]
        api.start()
        for h in hosts[1:]:
            h.wait_ready()
        ids = {h.status()["node_id"]: h for h in hosts}
        wait_hosts_seen(api, list(ids), MODEL)
        print(f"mesh of {args.hosts} hosts + API node ready in {time.perf_counter() - t_setup:.1f} s ({root})")
        events = ContinuedEvents(api.console_port)

        references = {p: stream(api.api_port, p, args.max_tokens) for p in prompts}  # uninterrupted
        bad = {p: r.error for p, r in references.items() if r.error}
        if bad:
            raise SystemExit(f"a reference run failed: {bad}")
        ttft, gap, prefill = prefill_estimate(hosts[0], prompts, args.max_tokens)

        control_identical = control_total = 0
        for _ in range(args.control_rounds):
            with ThreadPoolExecutor(len(prompts)) as pool:
                control = list(pool.map(lambda p: stream(api.api_port, p, args.max_tokens), prompts))
            control_total += len(control)
            control_identical += sum(1 for r in control if not r.error and r.text == references[r.prompt].text)

        started = completed = failed = identical = 0
        diverged_before_cut = diverged_after_cut = 0
        details: list[dict] = []
        duplicated = lost = 0
        stalls: list[float] = []
        detections: list[float] = []
        continued = 0
        failures: list[str] = []
        kills: list[str] = []
        for rnd in range(args.rounds):
            cut_at = rng.randint(args.cut_min, args.cut_max)
            trigger = threading.Event()
            live: dict[int, StreamResult] = {}  # the streams that have sent content, by id()

            def on_chunk(
                n: int,
                res: StreamResult,
                cut_at: int = cut_at,
                trigger: threading.Event = trigger,
                live: dict[int, StreamResult] = live,
            ) -> None:
                live[id(res)] = res
                if n >= cut_at:
                    trigger.set()

            started += len(prompts)
            with ThreadPoolExecutor(len(prompts)) as pool:
                futures = [pool.submit(stream, api.api_port, p, args.max_tokens, on_chunk) for p in prompts]
                trigger.wait(STREAM_TIMEOUT_S)
                serving = sorted({r.served_by_header for r in list(live.values()) if r.served_by_header in ids})
                victim = rng.choice(serving or sorted(ids))
                t_kill = time.perf_counter()
                ids[victim].kill_all()  # kill -9 of its process group: the node and its runner
                kills.append(f"round {rnd + 1}: {ids[victim].home.name} after {cut_at} chunks")
                results = [f.result() for f in futures]
            for res in results:
                if res.error:
                    failed += 1
                    failures.append(f"round {rnd + 1} {res.prompt[:30]!r}: {res.error}")
                    continue
                completed += 1
                ref = references[res.prompt].text
                identical += res.text == ref
                cut_chars = max((e for t, e in zip(res.chunk_times, res.chunk_ends) if t <= t_kill), default=0)
                at = first_difference(ref, res.text)
                if at is not None:
                    if at < cut_chars:
                        diverged_before_cut += 1
                    else:
                        diverged_after_cut += 1
                details.append(
                    {
                        "round": rnd + 1,
                        "prompt": res.prompt,
                        "served_by": res.served_by,
                        "chars_before_kill": cut_chars,
                        "first_difference": at,
                        "reference": ref,
                        "text": res.text,
                    }
                )
                d, lo = text_diff(ref, res.text)
                duplicated, lost = duplicated + d, lost + lo
                if len(res.served_by) > 1 and res.served_by[0] == victim:
                    continued += 1
                    stall = stall_across(res.chunk_times, t_kill)
                    if stall is not None:
                        stalls.append(stall)
            t_detect = events.first_after(t_kill, victim)
            if t_detect is not None:
                detections.append(t_detect - t_kill)
            # restart the victim: rejoin with an invite from a live host
            node = ids[victim]
            live = next(h for i, h in ids.items() if i != victim)
            node.join_with(live.invite())
            node.start()
            wait_hosts_seen(api, list(ids), MODEL)

        stall_p50, stall_p95 = percentile(stalls, 50), percentile(stalls, 95)
        det_p50 = percentile(detections, 50)
        goal = det_p50 + 2 * prefill
        figures = {
            "hosts": args.hosts,
            "clients": args.clients,
            "rounds": args.rounds,
            "max_tokens": args.max_tokens,
            "token_delay_ms": args.token_delay_ms,
            "parallel": args.parallel or "node default",
            "started": started,
            "completed": completed,
            "failed": failed,
            "identical_to_reference": identical,
            "diverged_before_kill": diverged_before_cut,
            "diverged_at_or_after_kill": diverged_after_cut,
            "control_identical": control_identical,
            "control_total": control_total,
            "chars_duplicated": duplicated,
            "chars_lost": lost,
            "continued": continued,
            "stall_p50_ms": round(stall_p50 * 1000, 1),
            "stall_p95_ms": round(stall_p95 * 1000, 1),
            "detection_p50_ms": round(det_p50 * 1000, 1),
            "detection_max_ms": round(max(detections, default=float("nan")) * 1000, 1),
            "prefill_ms": round(prefill * 1000, 1),
            "ttft_local_ms": round(ttft * 1000, 1),
            "inter_token_ms": round(gap * 1000, 1),
            "stall_goal_ms": round(goal * 1000, 1),
            "stall_p95_over_goal": round(stall_p95 / goal, 2) if goal > 0 else None,
            "continuations_status": api.status()["routing"].get("continuations"),
            "continuation_failures_status": api.status()["routing"].get("continuation_failures"),
            "rehost_s": "n/a (item 4 not built)",
        }
        print()
        for k in kills:
            print(f"  kill -9 {k}")
        for f in failures:
            print(f"  FAILED {f}")
        rows = [
            ("requests started / completed / failed", f"{started} / {completed} / {failed}"),
            ("outputs identical to the reference", f"{identical} / {completed}"),
            (
                "  the others: diverged before / at-or-after the kill",
                f"{diverged_before_cut} / {diverged_after_cut}",
            ),
            ("control (no kill, same concurrency) identical", f"{control_identical} / {control_total}"),
            ("characters duplicated / lost (goal 0)", f"{duplicated} / {lost}"),
            ("requests continued (hydra_served_by > 1 host)", f"{continued}"),
            (
                "router continuations / continuation failures",
                f"{figures['continuations_status']} / {figures['continuation_failures_status']}",
            ),
            ("stall added per continuation p50 / p95", f"{stall_p50 * 1000:.0f} / {stall_p95 * 1000:.0f} ms"),
            ("failure detection (kill -> request.continued) p50", f"{det_p50 * 1000:.0f} ms"),
            (
                "prompt prefill (local TTFT - inter-token gap)",
                f"{prefill * 1000:.0f} ms (TTFT {ttft * 1000:.0f}, gap {gap * 1000:.0f})",
            ),
            (
                "goal: stall p95 <= detection + 2 x prefill",
                f"{goal * 1000:.0f} ms (p95 / goal = {figures['stall_p95_over_goal']})",
            ),
            ("last host dies -> model answers elsewhere", "n/a (item 4 not built)"),
        ]
        width = max(len(r[0]) for r in rows)
        for name, value in rows:
            print(f"  {name:<{width}}  {value}")
        (root / "chaos-details.json").write_text(json.dumps(details, indent=1))
        print(f"  (every output against its reference: {root / 'chaos-details.json'})")
        print(json.dumps(figures))
    finally:
        for n in (*hosts, api):
            n.kill_all()


if __name__ == "__main__":
    main()
