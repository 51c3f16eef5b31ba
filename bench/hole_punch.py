"""Hole punching across real NAT: how fast a relayed link moves to a punched direct path, and what it buys.

Root only (network namespaces, iptables; tests/natlab.py). Relay R1 is public; A and B each sit behind
their own MASQUERADE router. Every host's public interface delays what it sends by ``--delay-ms``
(netem), so a relayed packet (A → NAT1 → R1 → NAT2 → B) pays two public hops and a punched one
(A → NAT1 → NAT2 → B) one. Two runs side by side, the same homes and lab:

1. A and B with ``--hole-punch off``: their link stays relayed. Sampled for ``--sample-s``: the link's
   RTT (its PING/PONG, every 5 s) and the bytes R1 relays per second (their gossip and pings).
2. A and B restarted with hole punching on: the time from R1 opening their circuit (the relayed
   link) to the first ``event=hole_punch_ok`` (from the logs), then the same samples.

Prints RTT relayed / punched and the relay's bytes/s in both runs (punched: 0, the circuit is gone).

Run: sudo .venv/bin/python bench/hole_punch.py [--delay-ms 10] [--sample-s 16]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from hydra_node.mesh.identity import load_or_create_identity  # noqa: E402
from hydra_node.mesh.keyfile import save_mesh_key  # noqa: E402
from hydra_node.mesh.wire.ids import MeshSecret  # noqa: E402
from hydra_node.mesh.wire.token import issue_invite  # noqa: E402
from natlab import NatLab, _run, ensure_iptables, serve_argv  # noqa: E402


def status(lab: NatLab, name: str) -> dict | None:
    return lab.status(name)


def row(lab: NatLab, name: str, peer_id: str) -> dict:
    return next((p for p in (status(lab, name) or {}).get("peers", []) if p["id"] == peer_id), {})


def wait(pred, timeout_s: float, what: str, interval_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval_s)
    raise SystemExit(f"timed out: {what}")


def sample(lab: NatLab, ids: dict, seconds: float) -> tuple[list[float], float]:
    """B's link RTT to A (each new PING/PONG value) and R1's relayed bytes per second over ``seconds``."""
    before, t0 = status(lab, "R1")["mesh"]["relays"]["server"]["bytes_relayed"], time.monotonic()
    rtts: list[float] = []
    while time.monotonic() - t0 < seconds:
        rtt = row(lab, "B", ids["A"]).get("rtt_ms")
        if rtt is not None and (not rtts or rtt != rtts[-1]):
            rtts.append(rtt)
        time.sleep(0.5)
    after, t1 = status(lab, "R1")["mesh"]["relays"]["server"]["bytes_relayed"], time.monotonic()
    return rtts, (after - before) / (t1 - t0)


def _stamps(log: Path, event: str) -> list[datetime]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if f"event={event} " in line and line.startswith("ts="):
            out.append(datetime.fromisoformat(line.split()[0][3:].replace("Z", "+00:00")))
    return out


def punch_latency(root: Path) -> float:
    """Seconds from R1 opening the A–B circuit (the relayed link) to the first ``hole_punch_ok``, from the
    logs (one clock: one machine). Only circuits of the hole-punching run count (after A-off ended)."""
    ok = min(_stamps(root / "A-on.log", "hole_punch_ok") + _stamps(root / "B-on.log", "hole_punch_ok"))
    circuit = max(t for t in _stamps(root / "R1.log", "relay_circuit_open") if t <= ok)
    return (ok - circuit).total_seconds()


def start_nated(lab: NatLab, homes: dict, root: Path, token: str, punch: str) -> None:
    lab.spawn(
        "A",
        serve_argv(lab, "A", homes["A"], "--no-model", "--join", token, "--hole-punch", punch),
        root / f"A-{punch}.log",
    )
    lab.spawn(
        "B",
        serve_argv(lab, "B", homes["B"], "--join", token, "--hole-punch", punch, command="client"),
        root / f"B-{punch}.log",
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--delay-ms", type=float, default=10.0, help="one-way delay added on every public interface")
    ap.add_argument("--sample-s", type=float, default=16.0, help="seconds of RTT and relay-byte sampling per run")
    args = ap.parse_args()
    why = ensure_iptables()
    if why:
        print(f"skipped: {why}")
        return 0
    root = Path(tempfile.mkdtemp(prefix="hole-punch-bench-"))
    homes = {n: root / n for n in ("R1", "A", "B")}
    mesh = MeshSecret.generate()
    for h in homes.values():
        save_mesh_key(h / "mesh" / "mesh.key", mesh)
    with NatLab() as lab:
        try:
            for host in ("R1", "NAT1", "NAT2") if args.delay_ms > 0 else ():
                _run(
                    "ip",
                    "netns",
                    "exec",
                    lab.ns[host],
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    "pub0",
                    "root",
                    "netem",
                    "delay",
                    f"{args.delay_ms}ms",
                )
        except subprocess.CalledProcessError as exc:
            print(f"note: no netem here ({exc.stderr.strip()}): no delay added")
            args.delay_ms = 0.0
        token = issue_invite(
            load_or_create_identity(homes["R1"]).signing_key,
            mesh.mesh_id,
            [f"{lab.addr('R1')}:9338"],
            3600,
            time.time(),
        )
        lab.spawn("R1", serve_argv(lab, "R1", homes["R1"], "--no-model"), root / "R1.log")
        ids = {"R1": wait(lambda: status(lab, "R1"), 90, "R1 up")["node_id"]}
        results = {}
        for punch in ("off", "on"):
            start_nated(lab, homes, root, token, punch)
            for n in ("A", "B"):
                ids[n] = wait(lambda n=n: status(lab, n), 90, f"{n} up")["node_id"]
            seen = wait(lambda: row(lab, "B", ids["A"]).get("path"), 60, "a link between A and B")
            if punch == "on":
                wait(lambda: row(lab, "B", ids["A"]).get("path") == "punched", 60, "the punched link")
                results["punch_s"] = punch_latency(root)
                results["first_path"] = seen
            else:
                assert seen == "relayed", seen
            rtts, relay_bps = sample(lab, ids, args.sample_s)
            path = row(lab, "B", ids["A"]).get("path")
            results[punch] = (path, rtts, relay_bps)
            lab.kill("A")
            lab.kill("B")
    (p_off, rtt_off, bps_off), (p_on, rtt_on, bps_on) = results["off"], results["on"]
    med_off = statistics.median(rtt_off) if rtt_off else float("nan")
    med_on = statistics.median(rtt_on) if rtt_on else float("nan")
    print(f"one-way delay per public interface: {args.delay_ms:g} ms; sampled {args.sample_s:g} s per run")
    print(f"hole_punch off: path={p_off} rtt_ms={[round(r, 1) for r in rtt_off]} relay_bytes_per_s={bps_off:.0f}")
    print(
        f"hole_punch on:  path={p_on} rtt_ms={[round(r, 1) for r in rtt_on]} relay_bytes_per_s={bps_on:.0f} "
        f"(first seen in status: {results['first_path']}; "
        f"punched {results['punch_s']:.3f} s after R1 opened the circuit)"
    )
    print(f"rtt punched / relayed = {med_on / med_off:.2f} (median {med_on:.1f} ms / {med_off:.1f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
