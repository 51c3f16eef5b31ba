"""Membership at 100, 300 and 1,000 nodes: the real core in virtual time over a modelled internet.

Each mesh size runs four phases on one simulated network (hydra_node/mesh/membership/sim.py,
link model in simlinks.py):
  wave   - 3 seed nodes, then every other node joins through them at a uniform random moment
           within --wave seconds; reported: seconds from the last join until every node sees
           every other alive;
  bytes  - gossip bytes sent per node per second at steady state (each message's CBOR length,
           announcements carrying a 64-byte signature, plus 100 B assumed for envelope + AEAD;
           relays' forwarding not included; it is reported apart);
  kill   - --kills silent kills (no TCP reset), one at a time, of random nodes (NATed ones too):
           seconds until every live node marks the victim dead (max and mean);
  stress - --stress seconds with 5 % loss on every message and --slow of the hosts loaded (each
           tick and message handled late by exp(50 ms), 1 % of them by a stall of exp(--stall s)):
           false deaths (a live node declared dead by anyone), suspicions, and one more kill.
Topology: every node at a random WAN site (one-way 5-120 ms by distance, log-normal jitter,
1 % Pareto spikes), --nat of them behind NAT with 2 relays each (reachable only through a
relay hop until they dial out). Run:

    .venv/bin/python bench/membership_sim.py [--sizes 100 300 1000] [--seed 1]
"""

from __future__ import annotations

import argparse
import hashlib
import random
import time

from hydra_node.mesh.membership import Announcement, MembershipConfig, ModelEntry, PeerDied, PeerState, PeerSuspected
from hydra_node.mesh.membership.sim import ENVELOPE_OVERHEAD_BYTES, HostProfile, SimNetwork

SIG = bytes(64)  # stands in for the Ed25519 signature every announcement carries (extra.sig)


def node_id(i: int) -> str:
    return hashlib.sha256(f"bench-node-{i}".encode()).hexdigest()  # 64 hex, like a real id


def announcement(nid: str, i: int) -> Announcement:
    return Announcement(
        node_id=nid,
        incarnation=1_764_000_000,
        addresses=(f"198.51.{i // 250}.{i % 250 + 1}:7946",),
        models=(ModelEntry("SmolLM2-135M-Instruct", "ready"),),
        extra={"sig": SIG},
    )


def profiles(ids: list[str], nat_share: float, rng: random.Random) -> dict[str, HostProfile]:
    public = ids[: max(3, round(len(ids) * (1 - nat_share)))]
    out = {}
    for nid in ids:
        nat = nid not in public
        out[nid] = HostProfile(site=rng.random(), nat=nat, relays=tuple(rng.sample(public, 2)) if nat else ())
    return out


def measure(n: int, args: argparse.Namespace) -> dict:
    wall, cpu = time.perf_counter(), time.process_time()
    rng = random.Random(args.seed * 1000 + n)
    ids = [node_id(i) for i in range(n)]
    rng.shuffle(ids)
    prof = profiles(ids, args.nat, rng)
    net = SimNetwork(seed=args.seed + n, measure_bytes=True, decode=False)
    anns = {nid: announcement(nid, i) for i, nid in enumerate(ids)}
    seeds = ids[:3]
    for s in seeds:
        net.add_node(s, seeds=[x for x in seeds if x != s], announcement=anns[s], profile=prof[s])
    net.run_for(2)
    joiners = ids[3:]
    t0 = net.now
    for nid in joiners:  # the wave: random moments within --wave seconds
        at = t0 + rng.uniform(0, args.wave)
        net.schedule(at, lambda nid=nid: net.add_node(nid, seeds=seeds, announcement=anns[nid], profile=prof[nid]))
    net.run_for(args.wave)
    wave_end = net.now
    done = net.run_for(120, until=net.converged, check_every=0.25)
    converge = None if done is None else done - wave_end
    progress(n, f"wave -> full view {converge} s after the last join", cpu)
    net.run_for(args.settle)  # the join wave's records stop being retransmitted

    t1, sent0, relay0 = net.now, sum(net.bytes_sent.values()), sum(net.relay_bytes.values())
    net.run_for(args.steady)
    span = net.now - t1
    per_node = (sum(net.bytes_sent.values()) - sent0) / n / span  # what each core sent itself
    relayed = (sum(net.relay_bytes.values()) - relay0) / span  # forwarded by all relays together
    progress(n, f"steady state {per_node:.0f} B/node/s, relays {relayed:.0f} B/s in all", cpu)

    kills = []
    for _ in range(args.kills):
        victim = rng.choice(net.live())
        kills.append(kill_time(net, victim))
    calm_false = false_deaths(net)
    progress(n, f"kill -> all dead {kills} s, false deaths {calm_false}", cpu)

    net.loss = 0.05
    for nid in rng.sample(net.live(), round(n * args.slow)):
        p = net.profiles[nid]
        net.profiles[nid] = HostProfile(p.site, p.nat, p.relays, slow=0.05, stall_p=0.01, stall_s=args.stall)
    s0 = len(net.events_of(PeerSuspected))
    left = args.stress
    while left > 0:  # in steps, with a progress line each: at 1,000 nodes a stressed second costs minutes of CPU
        step = min(5.0, left)
        net.run_for(step)
        left -= step
        progress(
            n,
            f"stress {args.stress - left:.0f}/{args.stress:.0f} s: false deaths {false_deaths(net) - calm_false}, "
            f"suspicions {len(net.events_of(PeerSuspected)) - s0}",
            cpu,
        )
    stress_false = false_deaths(net) - calm_false
    suspicions = len(net.events_of(PeerSuspected)) - s0
    stress_kill = kill_time(net, rng.choice(net.live()))
    health = max(c.health.score for i, c in net.nodes.items() if i not in net.down)
    return {
        "n": n,
        "converge": converge,
        "bytes": per_node,
        "relayed": relayed,
        "kill_max": max(kills),
        "kill_mean": sum(kills) / len(kills),
        "calm_false": calm_false,
        "stress_false": stress_false,
        "suspicions": suspicions,
        "stress_kill": stress_kill,
        "health": health,
        "unreachable": net.unreachable,
        "wall": time.perf_counter() - wall,
        "cpu": time.process_time() - cpu,
    }


def progress(n: int, text: str, cpu0: float) -> None:
    print(f"  [{n} nodes, cpu {time.process_time() - cpu0:.0f} s] {text}", flush=True)


def kill_time(net: SimNetwork, victim: str) -> float:
    killed = net.now
    net.kill(victim)
    seen = net.run_for(60, until=lambda: net.all_see(victim, (PeerState.DEAD,)), check_every=0.05)
    net.run_for(5)
    return float("inf") if seen is None else seen - killed


def false_deaths(net: SimNetwork) -> int:
    return sum(1 for _, _, e in net.events_of(PeerDied) if e.peer_id not in net.down)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 300, 1000])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--wave", type=float, default=10.0, help="join wave length (s)")
    parser.add_argument("--steady", type=float, default=20.0, help="steady-state span measured (s)")
    parser.add_argument("--settle", type=float, default=20.0, help="quiet time after convergence before measuring")
    parser.add_argument("--kills", type=int, default=2)
    parser.add_argument("--stress", type=float, default=60.0, help="seconds of 5 %% loss + slow hosts")
    parser.add_argument("--nat", type=float, default=0.3, help="share of hosts behind NAT")
    parser.add_argument("--slow", type=float, default=0.1, help="share of hosts loaded in the stress phase")
    parser.add_argument("--stall", type=float, default=0.5, help="mean stall of a loaded host (s), 1 %% of its events")
    args = parser.parse_args()
    cfg = MembershipConfig()
    print(
        f"defaults: probe {cfg.probe_interval}s, timeouts {cfg.probe_timeout}+{cfg.indirect_timeout}s x "
        f"local health, suspicion {cfg.suspicion_mult} x max(1, log10 n) s .. x{cfg.suspicion_max_mult}, "
        f"k={cfg.suspicion_confirmations}, sync {cfg.sync_interval}s in buckets of {cfg.sync_bucket_entries}; "
        f"WAN sites, {args.nat:.0%} NAT (2 relays each), wave {args.wave:g}s; bytes include "
        f"{ENVELOPE_OVERHEAD_BYTES} B/message envelope"
    )
    print(
        f"{'nodes':>5} {'wave->full view s':>17} {'B/node/s':>8} {'relayed B/s':>11} "
        f"{'kill->all dead s max/mean':>25} {'stress: false deaths':>20} {'suspicions':>10} "
        f"{'kill s':>6} {'max LHM':>7} {'cpu s':>6}"
    )
    for n in args.sizes:
        r = measure(n, args)
        conv = "never" if r["converge"] is None else f"{r['converge']:.2f}"
        print(
            f"{r['n']:>5} {conv:>17} {r['bytes']:>8.0f} {r['relayed']:>11.0f} "
            f"{r['kill_max']:>12.2f} / {r['kill_mean']:<10.2f} {r['calm_false']:>6} calm, {r['stress_false']:>3} "
            f"stress {r['suspicions']:>10} {r['stress_kill']:>6.2f} {r['health']:>7} {r['cpu']:>6.0f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
