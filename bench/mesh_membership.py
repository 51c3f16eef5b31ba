"""Membership at scale with real node processes on this machine (loopback).

Starts N `--no-model` nodes joined through the first one's invite, then measures:
  - join: until every node sees all N-1 peers alive;
  - stability (``--stable-s``): suspect/dead transitions any node logs while nothing fails;
  - steady state: link bytes per node per second (encrypted frames, both directions / 2);
  - kill -9 of one node: until every other node no longer counts it alive, and until every
    other node has declared it dead (goal: within 10 s; upstream Mesh LLM takes about 41 s);
  - the nodes' own counters (dials, handshakes, gossip send failures, event-loop lag), summed.

Two ways to start:
  default         nodes join one after another (each waits for the previous to be ready);
  --simultaneous  a mass restart: every process is spawned at the same instant. The seed must
                  exist once to issue the invite (the token names its identity, mesh key and
                  address), so it is started alone on a fixed mesh port, asked for an invite and
                  stopped; then all N processes (the seed again, same home and port) are spawned
                  in one burst. Joiners retry the invite until the seed answers, as after a
                  power cut.

Membership state is followed in the nodes' logs (``--log-format json``: membership events with
their time stamps), which costs the nodes nothing; /api/status is read every 3 s while waiting
for the full view (the logs can miss a suspect's quiet return to alive), for the counters and
for the views at the end.

Without a full view within ``--converge-timeout-s`` the rest is measured anyway (how unstable,
and whether a kill still shows). ``--profile`` runs node n1 under cProfile (CPU time) and prints
where it spent; ``--node-args`` passes extra serve flags to every node (e.g. '--relay off').

Run: .venv/bin/python bench/mesh_membership.py [--nodes 30] [--simultaneous] [--stable-s 300]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import NodeProcess

#: How often the logs are read (a few kB per node per second: cheap).
POLL_S = 0.5
#: How often /api/status of every node is read while waiting for the full view.
STATUS_POLL_S = 3.0
#: Membership log events → the state the logging node now holds for the peer.
STATE_OF_EVENT = {
    "membership_peerjoined": "alive",
    "membership_peerrecovered": "alive",
    "membership_peersuspected": "suspect",
    "membership_peerdied": "dead",
    "membership_peerleft": "left",
}
#: Counters of /api/status mesh.counters summed over the nodes in the report (when present).
COUNTERS = (
    "dials",
    "dial_failures",
    "dials_deferred",
    "duplicate_links_closed",
    "loop_lag_max_ms",
    "loop_lag_late_wakes",
)


class LogView:
    """One node's membership view, rebuilt from its log as it grows."""

    def __init__(self, node: NodeProcess) -> None:
        self.node = node
        self.offset = 0
        self.node_id: str | None = None
        self.states: dict[str, str] = {}  # peer id prefix (16 hex) → state
        self.transitions: list[tuple[float, str, str]] = []  # (ts, event, peer prefix)
        self._partial = b""

    def read(self) -> None:
        try:
            with open(self.node.log_path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        self.offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if not line.startswith(b"{"):
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            fields = dict(kv.split("=", 1) for kv in rec.get("msg", "").split() if "=" in kv)
            event = fields.get("event")
            if event == "node_ready":
                self.node_id = fields.get("node_id")
            elif event in STATE_OF_EVENT and "peer" in fields:
                self.states[fields["peer"]] = STATE_OF_EVENT[event]
                self.transitions.append((rec["ts"], event, fields["peer"]))

    def alive(self) -> int:
        return sum(1 for s in self.states.values() if s == "alive")

    def first(self, events: tuple[str, ...], peer: str, after: float) -> float | None:
        return next((ts for ts, ev, p in self.transitions if ev in events and p == peer and ts >= after), None)


class ProfiledNode(NodeProcess):
    """A node run under cProfile (``--profile``): its statistics land in HOME/profile.out when it stops."""

    def command_line(self) -> list[str]:
        # CPU time, not wall time: on a loaded host a wall-clock profile charges the time the
        # process waited for a core to whatever it was running.
        wrapper = (
            "import cProfile, runpy, sys, time\n"
            "prof = cProfile.Profile(time.process_time)\n"
            "sys.argv = ['hydra-node'] + sys.argv[2:]\n"
            "try:\n    prof.runcall(runpy.run_module, 'hydra_node.cli', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "finally:\n    prof.dump_stats(sys.argv_out)\n"
        )
        wrapper = wrapper.replace("sys.argv_out", repr(str(self.home / "profile.out")))
        return [
            sys.executable,
            "-c",
            wrapper,
            "--",
            self.command,
            "--home",
            str(self.home),
            "--port",
            "0",
            "--console",
            "0",
            "--mesh-host",
            "127.0.0.1",
            "--mesh-port",
            "0",
            *self.args,
        ]


def print_profile(node: NodeProcess) -> None:
    import pstats

    try:
        node.stop(timeout=120.0)  # a loaded node takes a while to stop and write its profile
    except subprocess.TimeoutExpired:
        print(f"{node.home.name} did not stop within 120 s: no profile")
        return
    out = node.home / "profile.out"
    if out.exists():
        print(f"--- profile of {node.home.name} (the whole run), by own time ---")
        pstats.Stats(str(out)).sort_stats("tottime").print_stats(25)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred, timeout_s: float, what: str):
    """pred()'s first true value, or [inf] (printed as such) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (value := pred()):
        if time.monotonic() > deadline:
            print(f"timed out after {timeout_s:.0f} s waiting for {what}")
            return [float("inf")]
        time.sleep(POLL_S)
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=30)
    ap.add_argument("--simultaneous", action="store_true", help="spawn every node at the same instant")
    ap.add_argument(
        "--stable-s",
        type=float,
        default=None,
        help="after the full view, watch this long for suspect/dead flaps (default 300 with --simultaneous, else 0)",
    )
    ap.add_argument("--steady-s", type=float, default=10.0, help="window for the link bytes per node per second")
    ap.add_argument("--converge-timeout-s", type=float, default=180.0)
    ap.add_argument("--keep", action="store_true", help="keep the nodes' homes (logs) after the run")
    ap.add_argument("--profile", action="store_true", help="run node n1 under cProfile and print where it spent")
    ap.add_argument("--node-args", default="", help="extra serve flags for every node, e.g. '--relay off'")
    args = ap.parse_args()
    stable_s = args.stable_s if args.stable_s is not None else (300.0 if args.simultaneous else 0.0)
    extra = [
        "--no-model",
        "--headless",
        "--log-format",
        "json",
        "--no-rpc-worker",
        "--no-mdns",
        *shlex.split(args.node_args),
    ]
    root = Path(tempfile.mkdtemp(prefix="hydra-bench-members-"))
    seed_port = free_port()
    seed_args = [*extra, "--mesh-port", str(seed_port)]
    seed = NodeProcess(root / "n0", *seed_args).start()
    token = seed.invite()
    nodes = [seed] + [
        (ProfiledNode if args.profile and i == 1 else NodeProcess)(
            root / f"n{i}", *extra, "--join", token, "--join-timeout", "120"
        )
        for i in range(1, args.nodes)
    ]
    pool = ThreadPoolExecutor(4)
    views = [LogView(n) for n in nodes]
    load0 = os.getloadavg()
    try:
        if args.simultaneous:
            seed.stop()
            seed.kill_all()
            nodes[0] = seed = NodeProcess(root / "n0", *seed_args)
            views[0] = LogView(seed)
            for v in views[1:]:
                v.offset = 0
            t_start = time.monotonic()
            for n in nodes:
                n.start(wait=False)
            for n in nodes:
                n.wait_ready(timeout=args.converge_timeout_s)
        else:
            t_start = time.monotonic()
            for n in nodes[1:]:
                n.start(wait=True)
        t_up, cpu_up = time.monotonic(), cpu_seconds(nodes)
        print(
            f"{args.nodes} nodes up {t_up - t_start:.1f} s after the first spawn "
            f"({'all at once' if args.simultaneous else 'one after another'})",
            flush=True,
        )
        want = args.nodes - 1

        last_status = [0.0]

        def converged() -> bool:
            for v in views:
                v.read()
            if min(v.alive() for v in views) >= want:
                return True
            # Some state changes reach the view without a logged event (e.g. a suspect refuted by a
            # merged record), so the logs may under-count: ask the nodes themselves now and then.
            if time.monotonic() - last_status[0] >= STATUS_POLL_S:
                last_status[0] = time.monotonic()
                return min(pool.map(status_alive, nodes)) >= want
            return False

        deadline, full = time.monotonic() + args.converge_timeout_s, True
        while not converged():
            if time.monotonic() > deadline:  # measure the rest anyway: how bad is it, and does a kill show?
                full = False
                print(
                    f"NO full view {args.converge_timeout_s:.0f} s after the last node was up: alive counts "
                    f"{sorted(v.alive() for v in views)}",
                    flush=True,
                )
                break
            time.sleep(POLL_S)
        t_full, cpu_full = time.monotonic(), cpu_seconds(nodes)
        if full:
            print(
                f"full view everywhere: {t_full - t_start:.1f} s after the first spawn, "
                f"{t_full - t_up:.1f} s after the last node was up",
                flush=True,
            )
            checked = list(pool.map(status_alive, nodes))
            if min(checked) < want:
                print(f"warning: /api/status disagrees with the logs: alive counts {sorted(checked)}")

        stable_from = time.time()
        t_end = time.monotonic() + stable_s
        while time.monotonic() < t_end:
            time.sleep(min(5.0, max(0.0, t_end - time.monotonic())))
            for v in views:
                v.read()
        flaps = Counter(
            ev
            for v in views
            for ts, ev, _ in v.transitions
            if ts >= stable_from and ev in ("membership_peersuspected", "membership_peerdied")
        )
        stable_end = time.time()
        # The tail of the start-up storm may still flap after the first full view: the last
        # suspicion or death in the window, and how long every view then stayed quiet.
        last_flap = max(
            (
                ts
                for v in views
                for ts, ev, _ in v.transitions
                if ts >= stable_from and ev in ("membership_peersuspected", "membership_peerdied")
            ),
            default=None,
        )
        wall_start = stable_end - (time.monotonic() - t_start)
        min_alive_end = min(v.alive() for v in views)
        status_end = sorted(pool.map(status_alive, nodes))  # the cores' own views (-1: no answer)
        cpu_stable = (cpu_seconds(nodes) - cpu_full) / max(stable_s, 1e-9)

        b0 = sum(pool.map(link_bytes, nodes))
        time.sleep(args.steady_s)
        b1 = sum(pool.map(link_bytes, nodes))
        per_node = (b1 - b0) / 2 / args.nodes / args.steady_s
        totals = report_counters(pool, nodes, views, t_start, quiet=True)

        victim = views[-1]
        rest = [v for v in views[:-1] if v.node.proc.poll() is None]  # a node that exited sees nothing
        vid = victim.node_id[:16]
        for v in rest:
            v.read()
        before = {id(v): v.states.get(vid) for v in rest}  # a non-converged view may already hold it down
        t_kill = time.time()
        os.killpg(victim.node.proc.pid, signal.SIGKILL)
        victim.node.proc.wait()

        def all_saw(events, already):
            for v in rest:
                v.read()
            times = [t_kill if before[id(v)] in already else v.first(events, vid, t_kill) for v in rest]
            return times if all(t is not None for t in times) else None

        noticed = wait_until(
            lambda: all_saw(("membership_peersuspected", "membership_peerdied"), ("suspect", "dead", "left")),
            120,
            "suspicion",
        )
        dead = wait_until(lambda: all_saw(("membership_peerdied",), ("dead", "left")), 120, "death")
        false_after_kill = sum(
            1
            for v in rest
            for ts, ev, p in v.transitions
            if ts >= t_kill
            and p != vid
            and ev in STATE_OF_EVENT
            and ev != "membership_peerjoined"
            and ev != "membership_peerrecovered"
        )
    finally:
        exited = [n.home.name for n in nodes[:-1] if n.proc is not None and n.proc.poll() is not None]
        if args.profile:
            print_profile(nodes[1])
        for n in nodes:
            n.kill_all()
    load1 = os.getloadavg()
    print(
        f"nodes: {args.nodes} real processes on loopback, "
        f"{'spawned at the same instant' if args.simultaneous else 'joined one after another'}"
        f"{', extra flags: ' + args.node_args if args.node_args else ''}"
    )
    if exited:
        print(f"nodes that EXITED during the run (see their stderr.log): {', '.join(exited)}")
    print(f"load average (1 min) before/after: {load0[0]:.2f} / {load1[0]:.2f} on {os.cpu_count()} cores")
    if full:
        print(
            f"join: first spawn -> full view everywhere: {t_full - t_start:.2f} s "
            f"(last node up -> full view: {t_full - t_up:.2f} s)"
        )
    else:
        print(
            f"join: NO full view within {t_full - t_start:.0f} s of the first spawn "
            f"({args.converge_timeout_s:.0f} s after the last node was up)"
        )
    print(
        f"stability over {stable_s:.0f} s after {'the full view' if full else 'that'}: "
        f"{flaps['membership_peersuspected']} suspicions, "
        f"{flaps['membership_peerdied']} deaths (goal 0); smallest view at the end: {min_alive_end}/{want} "
        f"from the logs; alive counts from /api/status: {status_end}"
    )
    if full and last_flap is not None:
        print(
            f"  last suspicion in that window: {last_flap - wall_start:.1f} s after the first spawn; then "
            f"{stable_end - last_flap:.0f} s with no suspicion or death anywhere (goal: a stable full view "
            f"within 60 s of the start, then 300 s without flaps)"
        )
    elif full:
        print(f"  no suspicion in that window: a stable full view {t_full - t_start:.1f} s after the first spawn")
    print(
        f"node CPU: start-up {cpu_up:.1f} s in all; last up -> {'full view' if full else 'timeout'} "
        f"{(cpu_full - cpu_up) / max(t_full - t_up, 1e-9):.2f} cores busy; stability window {cpu_stable:.2f} cores busy"
    )
    print(f"steady state: {per_node:.0f} link bytes per node per second (encrypted frames, in+out / 2)")
    print(f"kill -9 -> every peer stops routing to it (suspect or dead): {max(noticed) - t_kill:.2f} s")
    print(f"kill -9 -> every peer has declared it dead: {max(dead) - t_kill:.2f} s  (goal <= 10 s; upstream ~41 s)")
    print(f"other transitions logged after the kill: {false_after_kill}")
    print("node counters, summed: " + ", ".join(f"{k}={v}" for k, v in totals.items()))
    if args.keep:
        print(f"logs kept under {root}")


def cpu_seconds(nodes) -> float:
    """User + system CPU seconds the node processes have used so far (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for n in nodes:
        try:
            with open(f"/proc/{n.proc.pid}/stat") as f:
                st = f.read()
            fields = st[st.rfind(")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError, AttributeError):
            pass
    return total / tick


def status_alive(n: NodeProcess) -> int:
    try:
        return sum(1 for p in n.status()["peers"] if p["state"] == "alive")
    except Exception:
        return -1


def link_bytes(n: NodeProcess) -> int:
    try:
        m = n.status()["mesh"]
    except Exception:  # an overloaded node that does not answer counts as 0 (both samples alike)
        return 0
    return m["link_bytes_in"] + m["link_bytes_out"]


def report_counters(pool, nodes, views, t_start, quiet: bool = False) -> dict:
    """The nodes' mesh counters summed (max for the lag maximum); printed unless ``quiet``."""
    totals: Counter = Counter()

    def fetch(n):
        try:
            return n.status()["mesh"]
        except Exception:
            return None

    for m in pool.map(fetch, nodes):
        if m is None:
            totals["status_unavailable"] += 1
            continue
        for k in COUNTERS:
            v = (m.get("counters") or {}).get(k)
            if v is not None:
                totals[k] = max(totals[k], v) if k.endswith("_max_ms") else totals[k] + v
        for k, v in (m.get("handshake_failures") or {}).items():
            totals[f"handshake_failed_{k}"] += v
        ms = m.get("membership") or {}
        totals["gossip_failed_sends"] += ms.get("failed_sends", 0)
        totals["gossip_dropped_sends"] += ms.get("dropped_sends", 0)
        totals["refutations"] += ms.get("refutations", 0)
        totals["links"] += m.get("links", 0)
    totals["suspicions_logged"] = sum(
        1 for v in views for _, ev, _ in v.transitions if ev == "membership_peersuspected"
    )
    totals["deaths_logged"] = sum(1 for v in views for _, ev, _ in v.transitions if ev == "membership_peerdied")
    if not quiet:
        print("node counters, summed: " + ", ".join(f"{k}={v}" for k, v in totals.items()), flush=True)
    return dict(totals)


if __name__ == "__main__":
    main()
