"""Discovery latency benchmark (prints figures; asserts nothing).

(a) Nostr: publisher start -> a discoverer sees the listing, through nostr-sdk's LocalRelay on
    loopback: "live" (discoverer already subscribed) and "cold" (discoverer starts after the
    publish: connect + REQ + verify).
(b) mDNS: N services started together on loopback (test group/port) -> every one sees the
    other N-1; and, as root, the same across network namespaces on a bridge (lan_probe processes).

Usage: .venv/bin/python bench/discovery.py [--runs 10] [--nodes 3] [--no-netns]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import trio
from nostr_sdk import Keys, LocalRelayBuilder, RateLimit

from hydra_node.discovery.nostr import _uniffi_trio
from hydra_node.discovery.mdns.probe import make_advert
from hydra_node.discovery.mdns.service import MdnsConfig, MdnsService
from hydra_node.discovery.nostr.events import ListingContent
from hydra_node.discovery.nostr.relay import RelayConfig
from hydra_node.discovery.nostr.services import DiscovererConfig, NostrDiscoverer, NostrPublisher, PublisherConfig

ROOT = Path(__file__).resolve().parent.parent
RELAY_CFG = RelayConfig(connect_timeout_s=2.0, disconnect_timeout_s=0.5, backoff_base_s=0.05, backoff_cap_s=0.5)


def summary(name: str, samples: list[float]) -> None:
    ms = sorted(s * 1000 for s in samples)
    print(f"{name:<46} n={len(ms):<3} median={statistics.median(ms):8.1f} ms  min={ms[0]:8.1f}  max={ms[-1]:8.1f}")


async def bench_nostr(runs: int) -> None:
    _uniffi_trio.install()
    relay = LocalRelayBuilder().addr("127.0.0.1").rate_limit(RateLimit(max_reqs=1000, notes_per_minute=100_000)).build()
    await relay.run()
    url = str(await relay.url())
    live, cold = [], []
    try:
        for i in range(runs):
            content = ListingContent(mesh_id=f"bench-{i}", invite_token="invite", serving=("SmolLM2-135M",))
            keys = Keys.generate()
            pub = NostrPublisher(keys, lambda c=content: c, PublisherConfig(relays=(url,), relay=RELAY_CFG))
            disc = NostrDiscoverer(DiscovererConfig(relays=(url,), relay=RELAY_CFG))
            pk = keys.public_key().to_hex()
            mine = lambda ls, pk=pk: any(x.pubkey == pk for x in ls)  # noqa: E731
            async with trio.open_nursery() as nursery:
                await nursery.start(disc.run)
                with trio.fail_after(10):
                    while not disc.statistics().relays[0].connected:
                        await trio.sleep(0.005)
                    await trio.sleep(0.05)  # let the REQ reach the relay
                    t0 = trio.current_time()
                    await nursery.start(pub.run)
                    await disc.wait_for(mine)
                    live.append(trio.current_time() - t0)
                    late = NostrDiscoverer(DiscovererConfig(relays=(url,), relay=RELAY_CFG))
                    t1 = trio.current_time()
                    await nursery.start(late.run)
                    await late.wait_for(mine)
                    cold.append(trio.current_time() - t1)
                nursery.cancel_scope.cancel()
    finally:
        relay.shutdown()
    summary("nostr publish -> seen (live subscription)", live)
    summary("nostr discoverer start -> listing seen (cold)", cold)


async def bench_mdns_loopback(runs: int, n: int) -> None:
    samples = []
    for _ in range(runs):
        cfg = MdnsConfig(port=random.randrange(20000, 60000), interface="127.0.0.1")
        services = [MdnsService(cfg, make_advert(f"n{i}", "127.0.0.1", 9337 + i, "bench", b"s")) for i in range(n)]
        async with trio.open_nursery() as nursery:
            t0 = trio.current_time()
            for s in services:
                await nursery.start(s.run)
            with trio.fail_after(15):
                for s in services:
                    await s.wait_for(lambda ads: len(ads) >= n - 1)
            samples.append(trio.current_time() - t0)
            nursery.cancel_scope.cancel()
    summary(f"mdns loopback: {n} services -> full view", samples)


def bench_mdns_netns(runs: int, n: int) -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("mdns netns: skipped (needs root and iproute2)")
        return
    tag = secrets.token_hex(3)
    bridge, hosts = f"hdb{tag}", [f"hdh{tag}{i}" for i in range(1, n + 1)]
    made: list[str] = []

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)

    inside, wall = [], []
    try:
        ip("netns", "add", bridge)
        made.append(bridge)
        ip("-n", bridge, "link", "add", "br0", "type", "bridge")
        ip("-n", bridge, "link", "set", "br0", "up")
        for i, ns in enumerate(hosts, start=1):
            ip("netns", "add", ns)
            made.append(ns)
            ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{i}", "netns", bridge)
            ip("-n", ns, "addr", "add", f"10.79.0.{i}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", bridge, "link", "set", f"p{i}", "master", "br0")
            ip("-n", bridge, "link", "set", f"p{i}", "up")
        for _ in range(runs):
            port = str(random.randrange(20000, 60000))
            t0 = time.monotonic()
            procs = [
                subprocess.Popen(
                    [
                        "ip",
                        "netns",
                        "exec",
                        ns,
                        sys.executable,
                        "-m",
                        "hydra_node.discovery.mdns.probe",
                        "--interface",
                        f"10.79.0.{i}",
                        "--port",
                        port,
                        "--expect",
                        str(n - 1),
                        "--timeout",
                        "15",
                        "--linger",
                        "1.5",
                    ],
                    stdout=subprocess.PIPE,
                    cwd=ROOT,
                )
                for i, ns in enumerate(hosts, start=1)
            ]
            results = [json.loads(p.communicate(timeout=30)[0].decode().strip().splitlines()[-1]) for p in procs]
            wall.append(time.monotonic() - t0 - 1.5)
            if all(r["ok"] for r in results):
                inside.append(max(r["elapsed_s"] for r in results))
    finally:
        for ns in reversed(made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
    if inside:
        summary(f"mdns netns: {n} hosts, service start -> full view", inside)
    summary(f"mdns netns: {n} hosts, incl. process start (wall)", wall)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--no-netns", action="store_true")
    args = p.parse_args()
    trio.run(bench_nostr, args.runs)
    trio.run(bench_mdns_loopback, args.runs, args.nodes)
    if not args.no_netns:
        bench_mdns_netns(max(1, args.runs // 3), args.nodes)


if __name__ == "__main__":
    main()
