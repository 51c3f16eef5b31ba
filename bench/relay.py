"""Relayed vs direct: the same generations from one client over a direct link and through a relay.

One process, real links on loopback, the real model runner (the bundled SmolLM2-135M in its
child process): host H serves ``generate`` streams (routing/remote.py's RemoteGeneration, as a
node does); client C holds a direct link to H and a relayed link C → R → H (the same end-to-end
handshake and secure channel, through relay R's splice). Greedy, the same prompts, interleaved
(alternating which path goes first). Prints decode tokens/s and TTFT per path, the direct link's
RTT (median of 1-byte echoes) and the ratios issue 19 asks for:

  tok/s relayed / direct >= 0.9, median added TTFT <= 2 x one RTT.

All three nodes share this process's event loop (the relay's work competes with the host's);
on real machines the relay's CPU is its own. ``--latency-ms`` adds a one-way delay to every
network hop (fault injection on the direct link and on both links to the relay, not on the
end-to-end link inside them): the relay then sits as far from each end as the ends are apart.

Run: .venv/bin/python bench/relay.py [--rounds 5] [--max-tokens 64] [--latency-ms 0]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import trio
from nacl.signing import SigningKey

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hydra_node.inference import GenerationRequest  # noqa: E402
from hydra_node.mesh.link.endpoints import LinkListener, open_link  # noqa: E402
from hydra_node.mesh.link.faults import FaultInjection  # noqa: E402
from hydra_node.mesh.link.peer_link import LinkSettings  # noqa: E402
from hydra_node.mesh.relay.client import accept_relayed, connect_via_relay, hold_reservation  # noqa: E402
from hydra_node.mesh.relay.limits import RelayLimits  # noqa: E402
from hydra_node.mesh.relay.messages import CONNECT_KIND, RESERVE_KIND  # noqa: E402
from hydra_node.mesh.relay.server import RelayServer  # noqa: E402
from hydra_node.mesh.wire.ids import MeshSecret, node_id_from_public_key  # noqa: E402
from hydra_node.models import resolve_model  # noqa: E402
from hydra_node.routing.remote import RemoteGeneration  # noqa: E402
from hydra_node.runtime.runner.records import RunnerSettings  # noqa: E402
from hydra_node.runtime.runner.supervisor import RunnerSupervisor  # noqa: E402

PROMPTS = [
    "def quicksort(arr):\n",
    "The history of the printing press begins",
    "A list of ten fruits:\n1.",
    "Q: Why is the sky blue?\nA:",
]


class OneLink:
    """The slice of the mesh service RemoteGeneration uses, answering with one given link."""

    def __init__(self, link) -> None:
        self._link = link

    async def link_to(self, peer_id):
        return self._link

    def link(self, peer_id):
        return self._link

    def members(self):
        return {}

    def member_states(self, now):
        return {}


async def echo(link, header, stream) -> None:
    while chunk := await stream.receive():
        await stream.send(chunk)


async def rtt_ms(link, n: int = 30) -> float:
    out = []
    async with link.open_stream({"kind": "echo"}) as stream:
        for _ in range(n):
            t0 = time.perf_counter()
            await stream.send(b"x")
            await stream.receive()
            out.append((time.perf_counter() - t0) * 1000)
    return statistics.median(out)


async def one(gen: RemoteGeneration, peer: str, prompt: str, max_tokens: int) -> tuple[float, float | None]:
    req = GenerationRequest(model="m", kind="completion", prompt=prompt, max_tokens=max_tokens, temperature=0.0)
    t0 = time.perf_counter()
    first = last = None
    n = 0
    async with gen.open_remote(peer, req) as events:
        async for ev in events:
            if getattr(ev, "type", "") == "delta":
                now = time.perf_counter()
                first = first or now
                last = now
                n += 1
    tps = (n - 1) / (last - first) if n > 1 and last > first else None
    return (first - t0) * 1000, tps


async def bench(args) -> None:
    home = Path(tempfile.mkdtemp(prefix="hydra-bench-relay-"))
    sup = RunnerSupervisor(resolve_model(None), home, RunnerSettings(n_ctx=1024, parallel=1), node_id="bench")
    mesh = MeshSecret(bytes([0x42]) * 32)
    fault = FaultInjection(latency_s=args.latency_ms / 1000) if args.latency_ms > 0 else None
    ident = {n: SigningKey.generate() for n in "HRC"}
    ids = {n: node_id_from_public_key(bytes(k.verify_key)) for n, k in ident.items()}
    settings = lambda n, **kw: LinkSettings(identity=ident[n], mesh=mesh, fault=fault, **kw)  # noqa: E731
    host = RemoteGeneration(OneLink(None), node_id=ids["H"], local_open=lambda model: sup.generate)
    host_routes = {"generate": host.serve, "echo": echo}

    async def host_stream(link, header, stream):
        await host_routes[header["kind"]](link, header, stream)

    async def host_via_relay(link, header, stream):
        inner = await accept_relayed(
            link, header, stream, LinkSettings(identity=ident["H"], mesh=mesh, on_stream=host_stream), allowed=True
        )
        if inner is not None:
            async with trio.open_nursery() as n:
                await n.start(inner.run)
                await inner.wait_closed()

    relay = RelayServer(RelayLimits(bytes_per_s=100_000_000, burst_bytes=10_000_000))
    relay_routes = {RESERVE_KIND: relay.serve_reserve, CONNECT_KIND: relay.serve_connect}

    async def relay_stream(link, header, stream):
        await relay_routes[header["kind"]](link, header, stream)

    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        h_port = await nursery.start(LinkListener(settings("H", on_stream=host_stream)).serve, "127.0.0.1", 0)
        r_port = await nursery.start(LinkListener(settings("R", on_stream=relay_stream)).serve, "127.0.0.1", 0)
        async with (
            open_link(f"ws://127.0.0.1:{r_port}", settings("H", on_stream=host_via_relay)) as h_relay,
            open_link(f"ws://127.0.0.1:{r_port}", settings("C")) as c_relay,
            open_link(f"ws://127.0.0.1:{h_port}", settings("C")) as direct,
        ):
            await nursery.start(hold_reservation, h_relay)
            # the end-to-end link gets no delay of its own: its frames cross the two delayed relay links
            relayed = await nursery.start(
                partial(connect_via_relay, c_relay, ids["H"], LinkSettings(identity=ident["C"], mesh=mesh))
            )
            paths = {
                "direct": (RemoteGeneration(OneLink(direct), node_id=ids["C"], local_open=lambda m: None), direct),
                "relayed": (RemoteGeneration(OneLink(relayed), node_id=ids["C"], local_open=lambda m: None), relayed),
            }
            rtts = {name: await rtt_ms(link) for name, (_, link) in paths.items()}
            for p in PROMPTS:  # warm-up: the prompt cache and both paths
                for gen, _ in paths.values():
                    await one(gen, ids["H"], p, 8)
            res = {name: {"ttft": [], "tps": []} for name in paths}
            for r in range(args.rounds):
                for i, p in enumerate(PROMPTS):
                    order = ["direct", "relayed"] if (r + i) % 2 == 0 else ["relayed", "direct"]
                    for name in order:
                        ttft, tps = await one(paths[name][0], ids["H"], p, args.max_tokens)
                        res[name]["ttft"].append(ttft)
                        if tps:
                            res[name]["tps"].append(tps)
            stats = relay.statistics()
        nursery.cancel_scope.cancel()
    med = statistics.median
    print(
        f"samples per path: {len(res['direct']['ttft'])}, max_tokens={args.max_tokens}, "
        f"added one-way latency per link: {args.latency_ms} ms, relayed bytes: {stats.bytes_relayed}"
    )
    print(f"RTT ms (median of 30 echoes): direct {rtts['direct']:.2f}, relayed {rtts['relayed']:.2f}")
    print(f"{'':8} {'decode tok/s (median)':>22} {'TTFT ms (median)':>18}")
    for name, v in res.items():
        print(f"{name:8} {med(v['tps']):22.1f} {med(v['ttft']):18.2f}")
    ratio = med(res["relayed"]["tps"]) / med(res["direct"]["tps"])
    added = med([x - y for x, y in zip(res["relayed"]["ttft"], res["direct"]["ttft"])])
    print(f"throughput ratio relayed/direct: {ratio:.3f}  (goal >= 0.9)")
    print(f"median added TTFT: {added:.2f} ms = {added / rtts['direct']:.2f} x direct RTT  (goal <= 2 x RTT)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--latency-ms", type=float, default=0.0)
    trio.run(bench, ap.parse_args())


if __name__ == "__main__":
    main()
