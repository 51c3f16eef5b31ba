"""Membership at 30, 60 and 100 nodes, simulated with the real core in virtual time.

Measures, per mesh size:
  join  - seconds from a new node's join until every node (it included) sees a full view;
  kill  - seconds from a silent kill (no TCP reset) until every live node marks it dead
          (worst of --trials kills of different nodes);
  bytes - gossip bytes sent per node per second at steady state: each wire dict encoded with
          cbor2.dumps(canonical=True) plus 100 bytes assumed for link envelope + AEAD.
The LAN model is 0.3 ms one-way plus exponential jitter of mean 0.3 ms; no loss unless --loss.

    .venv/bin/python bench/membership_sim.py [--sizes 30 60 100] [--trials 3] [--loss 0.0]
"""

from __future__ import annotations

import argparse
import time

from hydra_node.mesh.membership import MembershipConfig, PeerDied, PeerState
from hydra_node.mesh.membership.sim import ENVELOPE_OVERHEAD_BYTES, SimNetwork


def build(n: int, seed: int, loss: float) -> SimNetwork:
    net = SimNetwork(seed=seed, loss=loss, measure_bytes=True)
    net.add_node("n000")
    for i in range(1, n - 1):
        net.run_for(0.01)
        net.add_node(f"n{i:03d}", seeds=["n000"])
    if net.run_for(60, until=net.full_view) is None:
        raise SystemExit(f"{n - 1} nodes did not converge")
    net.run_for(10)  # let the join storm settle
    return net


def measure(n: int, seed: int, trials: int, loss: float) -> dict:
    wall = time.perf_counter()
    net = build(n, seed, loss)
    start = net.now
    net.add_node(f"n{n - 1:03d}", seeds=["n000"])
    joined = net.run_for(60, until=net.full_view, check_every=0.01)
    net.run_for(10)

    bytes0, msgs0, t0 = sum(net.bytes_sent.values()), sum(net.messages_sent.values()), net.now
    net.run_for(30)
    span = net.now - t0
    per_node_bytes = (sum(net.bytes_sent.values()) - bytes0) / n / span
    per_node_msgs = (sum(net.messages_sent.values()) - msgs0) / n / span

    kills = []
    ids = sorted(net.nodes)
    for k in range(trials):
        victim = ids[(k * 7 + 3) % len(ids)]
        killed_at = net.now
        net.kill(victim)
        seen = net.run_for(30, until=lambda v=victim: net.all_see(v, (PeerState.DEAD,)), check_every=0.01)
        kills.append(float("inf") if seen is None else seen - killed_at)
        net.run_for(5)
    false = [e for e in net.events_of(PeerDied) if e[2].peer_id not in net.down]
    return {"n": n, "join_s": None if joined is None else joined - start, "kill_s": max(kills),
            "kill_mean_s": sum(kills) / len(kills), "bytes": per_node_bytes, "msgs": per_node_msgs,
            "false_deaths": len(false), "wall_s": time.perf_counter() - wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[30, 60, 100])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--loss", type=float, default=0.0)
    args = parser.parse_args()
    cfg = MembershipConfig()
    print(f"defaults: probe {cfg.probe_interval}s, probe timeout {cfg.probe_timeout}s, indirect "
          f"{cfg.indirect_probes}x{cfg.indirect_timeout}s, suspicion {cfg.suspicion_timeout}s, "
          f"gossip {cfg.gossip_fanout}/{cfg.gossip_interval}s, sync {cfg.sync_interval}s; "
          f"bound with D=1s: {cfg.detection_bound(1.0):.1f}s; loss {args.loss:.0%}; "
          f"bytes include {ENVELOPE_OVERHEAD_BYTES} B/message assumed envelope+AEAD")
    print(f"{'nodes':>5} {'join->full view s':>18} {'kill->all dead s (max/mean)':>28} "
          f"{'B/node/s':>9} {'msg/node/s':>10} {'false deaths':>12} {'wall s':>7}")
    for n in args.sizes:
        r = measure(n, args.seed + n, args.trials, args.loss)
        join = "never" if r["join_s"] is None else f"{r['join_s']:.2f}"
        print(f"{r['n']:>5} {join:>18} {r['kill_s']:>15.2f} / {r['kill_mean_s']:<10.2f} "
              f"{r['bytes']:>9.0f} {r['msgs']:>10.1f} {r['false_deaths']:>12} {r['wall_s']:>7.1f}", flush=True)


if __name__ == "__main__":
    main()
