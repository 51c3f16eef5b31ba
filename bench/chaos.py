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
its local runner, of the prompt made new by a nonce so no cached prefix is reused, minus the median
inter-token gap: the prefill, not the first decode and its injected delay); goal: stall p95 <= detection + 2 x prefill; the link RTT the API-only node
reports for its peers (``/api/status`` ``peers[].rtt_ms``). No asserts on timings; a table, then one
JSON line of figures.

``--latency-ms MS`` sets ``[testing] link_latency_ms`` on every node (the application's link fault
injection, docs/config.md): each frame a node sends on a mesh link waits MS first, so a link's RTT
grows by 2 x MS. ``--netns`` runs the same scenario with each node in its own network namespace on
one bridge (tests/netlab.py; root only, refused with a clear message otherwise; bench/_netns.py),
with ``--latency-ms 10`` (20 ms RTT) unless given.

``--rehost`` measures issue 26 item 4 instead: the model has ONE host, beside a ``--standby`` node
and the API-only node, every node with ``[rehost] min_hosts = {"<bundled model>" = 1}``; for R
rounds the only host is killed with ``kill -9`` while a client sends a short chat for the model to
the API-only node in a loop (each attempt waits as long as the node lets it); reported: the kill
to the first successful answer, the kill to the standby's ``model.rehosting`` / ``model.rehosted``
events (``/api/events``) and its ``load_s``; goal: answer <= 10 s + load time. The killed node is
restarted as a ``--standby`` for the next round. Refused with a clear error when the tree has no
re-hosting (``hydra-node serve --standby``, ``[rehost]``).

Greedy outputs depend on their batch neighbours (docs/scheduler.md "The runner's contract": a near
tie can break the other way beside other sequences' cells), so by default each host decodes one
sequence at a time (``--parallel 1``) and a control round of the same concurrent clients with no kill
shows how many outputs match the sequential reference anyway; ``--parallel 0`` keeps the node's
default slots. Each differing output is classed by where it parts from its reference: before the
kill (not the continuation's doing) or at/after it; chaos-details.json in the run's folder holds
every output next to its reference.

Run: .venv/bin/python bench/chaos.py [--hosts 3] [--clients 4] [--rounds 3] [--max-tokens 48]
       [--token-delay-ms 40] [--cut-min 5] [--cut-max 20] [--seed 1] [--parallel 1]
       [--control-rounds 1] [--latency-ms MS] [--netns] [--rehost]
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import http.client
import io
import json
import random
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from _common import NodeProcess, median, percentile
from _netns import NetLab, NetnsNode, netns_unavailable

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
NETNS_LATENCY_MS = 10.0
"""``--netns`` without ``--latency-ms``: 10 ms one way on every link, 20 ms RTT."""
REHOST_DEADLINE_S = 300.0
"""``--rehost``: the most a round waits for the model to answer again after its host's kill."""
REHOST_RETRY_S = 0.2
REHOST_GOAL_S = 10.0
"""Issue 26 item 6: a model answers again within this long plus its load time after its last host died."""


def config_text(*, token_delay_ms: float, parallel: int, latency_ms: float, rehost_model: str | None) -> str:
    """The TOML every node of the run reads: the runner's injected per-token delay, the hosts' slots
    (0: the node's default), the links' injected latency (``[testing]``, only when > 0) and, for
    ``--rehost``, ``[rehost] min_hosts`` keeping ``rehost_model`` on one host."""
    text = f"[runner]\ninject_token_delay_ms = {token_delay_ms:g}\n"
    if parallel:
        text += f"[defaults.throughput]\nparallel = {parallel}\n"
    if latency_ms > 0:
        text += f"[testing]\nlink_latency_ms = {latency_ms:g}\n"
    if rehost_model is not None:
        text += f"[rehost]\nmin_hosts = {{ {json.dumps(rehost_model)} = 1 }}\n"
    return text


def rehost_unavailable() -> str | None:
    """Why this tree cannot re-host a model (issue 26 item 4), or None when it can: ``hydra-node serve``
    must take ``--standby`` and the configuration a ``[rehost]`` table."""
    from hydra_node.cli.main import build_parser
    from hydra_node.config import ConfigError, parse_config_text

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            build_parser().parse_args(["serve", "--standby"])
    except SystemExit:
        return "re-hosting is not in this tree: `hydra-node serve` has no --standby (issue 26 item 4)"
    try:
        parse_config_text("[rehost]\nmin_hosts = { \"m\" = 1 }\n")
    except ConfigError as exc:
        return f"re-hosting is not in this tree: the configuration refuses [rehost] min_hosts ({exc})"
    return None


class NodeFactory:
    """``make(name, *extra)``: a node under ``root/name`` with the run's common flags, on loopback
    (``harness.NodeProcess``) or, with a lab, in the next network namespace (``NetnsNode``)."""

    def __init__(self, root: Path, common: tuple[str, ...], lab: NetLab | None):
        self.root, self.common, self.lab = root, common, lab
        self._next = 0

    def __call__(self, name: str, *extra: str) -> NodeProcess:
        args = (*self.common, *extra, "--name", name)
        if self.lab is None:
            return NodeProcess(self.root / name, *args)
        self._next += 1
        return NetnsNode(self.lab, self._next, self.root / name, *args)


def link_rtts(node: NodeProcess) -> list[float]:
    """The RTT (ms) of each linked peer as ``node`` reports it (``/api/status`` ``peers[].rtt_ms``)."""
    return [p["rtt_ms"] for p in node.status()["peers"] if isinstance(p.get("rtt_ms"), (int, float))]


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
    """Reads a node's ``/api/events`` in a thread; keeps each event named in ``names`` (by default
    ``request.continued``) with its arrival time; ``named`` lists them as ``(time, name, data)``."""

    def __init__(self, console_port: int, names: tuple[str, ...] = ("request.continued",)):
        from events_sse import SseStream  # tests/, on the path through _common

        self.names = names
        self.events: list[tuple[float, dict]] = []
        self.named: list[tuple[float, str, dict]] = []
        self._sse = SseStream(console_port, timeout=3600)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                ev = self._sse.next()
                if isinstance(ev, dict) and ev.get("event") in self.names:
                    self.named.append((time.perf_counter(), ev["event"], ev["data"]))
                    if ev["event"] == "request.continued":
                        self.events.append((time.perf_counter(), ev["data"]))
        except (OSError, EOFError, http.client.HTTPException, ValueError):
            return

    def first_after(self, t: float, victim: str) -> float | None:
        times = [at for at, data in self.events if at >= t and data.get("from") == victim]
        return min(times) if times else None

    def first_named(self, name: str, t: float) -> tuple[float, dict] | None:
        """The first ``name`` event that arrived at or after ``t``: (arrival time, data)."""
        return next(((at, data) for at, n, data in self.named if n == name and at >= t), None)


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
    runner); prefill = TTFT - inter-token gap (the first token's decode and injected delay). Each
    prompt is made new by a leading nonce: the host has served the prompts already (the reference
    runs), and a prefix it still holds would be reused, timing no prefill at all — while a
    continuation's new host prefills the prompt it never saw."""
    ttfts, gaps = [], []
    for p in prompts:
        t0 = time.perf_counter()
        res = stream(host.api_port, f"(take {time.time_ns() % 10**9}) {p}", max_tokens)
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
    ap.add_argument(
        "--latency-ms",
        type=float,
        default=None,
        help="[testing] link_latency_ms on every node: one-way delay per mesh link (default 0; 10 with --netns)",
    )
    ap.add_argument(
        "--netns", action="store_true", help="each node in its own network namespace on one bridge (root only)"
    )
    ap.add_argument(
        "--rehost",
        action="store_true",
        help="measure re-hosting instead: one host + a --standby node + the API node; kill -9 the only host",
    )
    args = ap.parse_args()
    latency_ms = args.latency_ms if args.latency_ms is not None else (NETNS_LATENCY_MS if args.netns else 0.0)
    if not 0 <= latency_ms <= 60_000:
        ap.error("--latency-ms must be between 0 and 60000")
    if args.netns and (why := netns_unavailable()) is not None:
        raise SystemExit(f"--netns: {why}")
    if args.rehost and (why := rehost_unavailable()) is not None:
        raise SystemExit(f"--rehost: {why}")
    if args.hosts < 3:
        ap.error("--hosts must be at least 3 (issue 26 item 6)")
    if not 1 <= args.cut_min <= args.cut_max:
        ap.error("need 1 <= --cut-min <= --cut-max")
    if args.parallel < 0:
        ap.error("--parallel must be >= 0")
    if args.clients > len(PROMPTS):
        ap.error(f"--clients must be at most {len(PROMPTS)} (one distinct prompt each)")
    from hydra_node.models import BUNDLED_MODEL_ID as MODEL

    root = Path(tempfile.mkdtemp(prefix="hydra-bench-chaos-"))
    cfg = root / "hydra.toml"
    cfg.write_text(
        config_text(
            token_delay_ms=0.0 if args.rehost else args.token_delay_ms,
            parallel=args.parallel,
            latency_ms=latency_ms,
            rehost_model=MODEL if args.rehost else None,
        )
    )
    common = ("--config", str(cfg), "--no-rpc-worker")
    where = f"{'network namespaces' if args.netns else 'loopback'}, {latency_ms:g} ms injected one-way link latency"
    with contextlib.ExitStack() as stack:
        lab = stack.enter_context(NetLab(3 if args.rehost else args.hosts + 1)) if args.netns else None
        make = NodeFactory(root, common, lab)
        if args.rehost:
            run_rehost(args, make, root, MODEL, where)
        else:
            run_chaos(args, make, root, MODEL, where)


def run_chaos(args: argparse.Namespace, make: NodeFactory, root: Path, MODEL: str, where: str) -> None:
    rng = random.Random(args.seed)
    hosts = [make(f"h{i}") for i in range(args.hosts)]
    api = make("api", "--no-model")
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
        print(f"mesh of {args.hosts} hosts + API node ready in {time.perf_counter() - t_setup:.1f} s ({where}; {root})")
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
                serving = sorted({h for r in list(live.values()) if (h := r.served_by_header) is not None and h in ids})
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
            other = next(h for i, h in ids.items() if i != victim)
            node.join_with(other.invite())
            node.start()
            wait_hosts_seen(api, list(ids), MODEL)

        rtts = link_rtts(api)  # after the run: pings every 5 s, so a fresh figure for every link
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
            "where": where,
            "link_rtt_ms_p50": round(percentile(rtts, 50), 1),
            "rehost": "measured by --rehost",
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
                "prompt prefill (local TTFT of a new prompt - inter-token gap)",
                f"{prefill * 1000:.0f} ms (TTFT {ttft * 1000:.0f}, gap {gap * 1000:.0f})",
            ),
            (
                "goal: stall p95 <= detection + 2 x prefill",
                f"{goal * 1000:.0f} ms (p95 / goal = {figures['stall_p95_over_goal']})",
            ),
            ("link RTT, API node to its peers (/api/status) p50", f"{percentile(rtts, 50):.1f} ms ({where})"),
            ("last host dies -> model answers elsewhere", "see --rehost"),
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


def chat_once(port: int, model: str, timeout_s: float) -> tuple[bool, str | None, str, str]:
    """One short non-streaming greedy chat for ``model``: (answered with content, the
    ``x-hydra-served-by`` header, the error code or exception when not, the error's message)."""
    body = {"model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        if r.status != 200:
            try:
                error = json.loads(data)["error"]
                code, message = error.get("code") or r.status, str(error.get("message", ""))
            except (ValueError, KeyError, TypeError, AttributeError):
                code, message = r.status, data[:300].decode(errors="replace")
            return False, None, f"HTTP {r.status} {code}", message
        content = json.loads(data)["choices"][0]["message"].get("content")
        return bool(content), r.getheader("x-hydra-served-by"), "" if content else "empty answer", ""
    except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError) as exc:
        return False, None, type(exc).__name__, str(exc)
    finally:
        conn.close()


@dataclass
class RehostRound:
    answer_s: float | None  # the kill to the first successful answer
    rehosting_s: float | None  # the kill to the standby's model.rehosting
    rehosted_s: float | None  # the kill to the standby's model.rehosted
    load_s: float | None  # model.rehosted load_s
    attempts: int
    errors: Counter
    last_error_s: float | None  # the kill to the last failed attempt's answer
    first_error: str  # the first failed attempt's code and message ("" when none failed)
    served_by_standby: bool


def run_rehost(args: argparse.Namespace, make: NodeFactory, root: Path, MODEL: str, where: str) -> None:
    """``--rehost``: see the module docstring."""
    nodes = [make("h0"), make("s1", "--standby")]
    api = make("api", "--no-model")
    try:
        t_setup = time.perf_counter()
        nodes[0].start()
        nodes[1].args += ["--join", nodes[0].invite()]
        nodes[1].start(wait=False)
        api.args += ["--join", nodes[0].invite()]
        api.start()
        nodes[1].wait_ready()
        ids = {n.status()["node_id"]: n for n in nodes}
        wait_hosts_seen(api, [next(i for i, n in ids.items() if n is nodes[0])], MODEL)
        ok, _, err, message = chat_once(api.api_port, MODEL, STREAM_TIMEOUT_S)
        if not ok:
            raise SystemExit(f"the model does not answer before any kill: {err} {message}")
        print(f"one host + a standby + API node ready in {time.perf_counter() - t_setup:.1f} s ({where}; {root})")
        rounds: list[RehostRound] = []
        for rnd in range(args.rounds):
            st = api.wait_status(
                lambda st: (
                    sum(p["state"] == "alive" for p in st["peers"] if p["id"] in ids) == 2
                    and sum(p["state"] == "alive" and MODEL in p["models"] for p in st["peers"] if p["id"] in ids) == 1
                ),
                timeout=MESH_TIMEOUT_S,
                what="one host of the model and one standby, both alive, seen by the API node",
            )
            host_id = next(p["id"] for p in st["peers"] if p["id"] in ids and MODEL in p["models"])
            spare_id = next(i for i in ids if i != host_id)
            spare_events = ContinuedEvents(ids[spare_id].console_port, ("model.rehosting", "model.rehosted"))
            time.sleep(0.5)  # the event stream is subscribed before the kill
            t_kill = time.perf_counter()
            ids[host_id].kill_all()  # kill -9 of its process group: the node and its runner
            attempts, errors, t_ok, served, t_err, first_error = 0, Counter[str](), None, None, None, ""
            while time.perf_counter() - t_kill < REHOST_DEADLINE_S:
                attempts += 1
                ok, served, err, message = chat_once(api.api_port, MODEL, REHOST_DEADLINE_S)
                if ok:
                    t_ok = time.perf_counter()
                    break
                if not errors:
                    first_error = f"{err}: {message[:240]}"
                errors[err] += 1
                t_err = time.perf_counter()
                time.sleep(REHOST_RETRY_S)
            deadline = time.perf_counter() + 30
            while spare_events.first_named("model.rehosted", t_kill) is None and time.perf_counter() < deadline:
                time.sleep(0.1)
            rehosting = spare_events.first_named("model.rehosting", t_kill)
            rehosted = spare_events.first_named("model.rehosted", t_kill)
            load = rehosted[1].get("load_s") if rehosted else None
            rounds.append(
                RehostRound(
                    answer_s=None if t_ok is None else t_ok - t_kill,
                    rehosting_s=None if rehosting is None else rehosting[0] - t_kill,
                    rehosted_s=None if rehosted is None else rehosted[0] - t_kill,
                    load_s=float(load) if isinstance(load, (int, float)) else None,
                    attempts=attempts,
                    errors=errors,
                    last_error_s=None if t_err is None else t_err - t_kill,
                    first_error=first_error,
                    served_by_standby=served == spare_id,
                )
            )
            r = rounds[-1]
            print(
                f"  round {rnd + 1}: kill -9 {ids[host_id].home.name}; answered after "
                f"{'-' if r.answer_s is None else f'{r.answer_s:.2f} s'} by "
                f"{ids[spare_id].home.name if r.served_by_standby else served} "
                f"({attempts} attempts, {dict(errors) or 'no errors'}"
                f"{'' if r.last_error_s is None else f', the last {r.last_error_s:.2f} s after the kill'})"
            )
            if first_error:
                print(f"    the first failed attempt: {first_error}")
            if t_ok is None:
                break
            # the killed node comes back as the next round's standby
            node = ids[host_id]
            if "--standby" not in node.args:
                node.args.append("--standby")
            node.join_with(ids[spare_id].invite())
            node.start()

        def fmt(xs: list[float]) -> str:
            return f"{percentile(xs, 50):.2f} / {max(xs):.2f} s" if xs else "-"

        answers = [r.answer_s for r in rounds if r.answer_s is not None]
        loads = [r.load_s for r in rounds if r.load_s is not None]
        # the goal per round: answer <= 10 s + that round's load time, i.e. answer - load <= 10 s
        beyond = [r.answer_s - r.load_s for r in rounds if r.answer_s is not None and r.load_s is not None]
        # the new host loaded -> the API node routes to it (its announcement reached the API node)
        seen = [r.answer_s - r.rehosted_s for r in rounds if r.answer_s is not None and r.rehosted_s is not None]
        figures = {
            "where": where,
            "rounds": len(rounds),
            "answered": len(answers),
            "answer_s": [round(x, 2) for x in answers],
            "rehosting_s": [None if r.rehosting_s is None else round(r.rehosting_s, 2) for r in rounds],
            "rehosted_s": [None if r.rehosted_s is None else round(r.rehosted_s, 2) for r in rounds],
            "load_s": [round(x, 2) for x in loads],
            "served_by_standby": sum(r.served_by_standby for r in rounds),
            "attempts": [r.attempts for r in rounds],
            "errors_while_waiting": [dict(r.errors) for r in rounds],
            "last_error_s": [None if r.last_error_s is None else round(r.last_error_s, 2) for r in rounds],
            "answer_minus_load_s": [round(x, 2) for x in beyond],
            "rehosted_to_answer_s": [round(x, 2) for x in seen],
            "goal": "answer - load <= 10 s",
            "rounds_within_goal": sum(x <= REHOST_GOAL_S for x in beyond),
        }
        rows = [
            ("rounds (kill -9 of the model's only host)", f"{len(rounds)}, answered again in {len(answers)}"),
            ("answered by the standby", f"{figures['served_by_standby']} / {len(rounds)}"),
            ("kill -> first successful answer p50 / max", fmt(answers)),
            ("kill -> standby's model.rehosting p50 / max", fmt([r.rehosting_s for r in rounds if r.rehosting_s])),
            ("kill -> standby's model.rehosted p50 / max", fmt([r.rehosted_s for r in rounds if r.rehosted_s])),
            ("standby's load time (model.rehosted load_s) p50 / max", fmt(loads)),
            ("model.rehosted -> first answer via the API node p50 / max", fmt(seen)),
            ("answer - load time p50 / max (goal <= 10 s)", fmt(beyond)),
            ("rounds within the goal", f"{figures['rounds_within_goal']} / {len(rounds)}"),
            (
                "attempts per round (errors while waiting)",
                "; ".join(
                    f"{r.attempts} ({dict(r.errors)}"
                    f"{'' if r.last_error_s is None else f', last at {r.last_error_s:.2f} s'})"
                    for r in rounds
                ),
            ),
        ]
        print()
        width = max(len(r[0]) for r in rows)
        for name, value in rows:
            print(f"  {name:<{width}}  {value}")
        print(json.dumps(figures))
    finally:
        for n in (*nodes, api):
            n.kill_all()


if __name__ == "__main__":
    main()
