"""Tokens/s of a split model vs the same model unsplit, interleaved in one run.

    .venv/bin/python bench/split.py [--rounds 5] [--tokens 64] [--threads 1]

Modes (each a model runner in its own process, with its own RPC workers, since a
ggml RPC worker serves one coordinator at a time):

* ``local``        – unsplit, llama.cpp on this process's CPU;
* ``split-direct`` – plain llama.cpp RPC over loopback to 2 workers;
* ``split-tunnel`` – the same, but each worker is reached as in a mesh: leased over an
  encrypted peer link (``hydra_node.runtime.rpc.tunnel``), bytes on an encrypted tunnel
  data connection (``dataconn.py``, native pump), with one process per worker node
  (``RpcTunnelServer`` on a ``LinkListener``) and one coordinator-node process holding
  the leases and the loopback tunnel ports (``RemoteWorkerTunnel``);
* ``split-link``   – as ``split-tunnel`` but the worker nodes offer no data port, so the
  bytes ride the link's streams (the fall-back when a data port is unreachable).

Every split mode uses the same plan, including the output projection on the host
(``SplitPlan.output_on_host``); the greedy texts of all modes are compared.

A mode is a name plus a function returning the (endpoint, pid) of the workers its
runner should use; the pids also count the tunnel processes, so CPU per token includes
encryption and pumping.  We also print tunnel/direct ratios (goal: >= 0.85).  Besides tokens/s we
print CPU milliseconds per token summed over the runner and its workers: on a busy
machine wall-clock rates mostly measure contention, CPU cost does not.  Rounds run the modes in rotated order so drift in
machine load hits all of them alike; we print medians and the ratio to ``local``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from hydra_node.models import bundled_model_path

PROMPT = "Once upon a time, in a small village by the sea,"
N_LAYERS = 30  # SmolLM2-135M
#: Memory each side advertises: the host and one worker cannot hold the model, so the plan uses two.
SMALL_BYTES = 40_000_000
READY_TIMEOUT_S = 120.0


# ---------------------------------------------------------------- runner process
def serve(spec: dict) -> None:
    """Child: load the model for one mode, then answer ``run`` lines with timings."""
    import llama_cpp

    from hydra_node.runtime.rpc import Capacity, WorkerInfo, plan_split, probe_worker
    from hydra_node.runtime.child.rpc_coordinator import (
        llama_kwargs_for_plan,
        output_projection_on_host,
        register_rpc_servers,
    )

    model = spec["model"]
    kwargs: dict = {"n_gpu_layers": 0}
    plan_status, output_on_host = None, False
    if spec["endpoints"]:
        workers = [
            WorkerInfo(f"w{i}", ep, probe_worker(ep).proto, SMALL_BYTES, float(i))
            for i, ep in enumerate(spec["endpoints"])
        ]
        plan = plan_split(Path(model).stat().st_size, N_LAYERS, Capacity(SMALL_BYTES), workers)
        register_rpc_servers(list(plan.rpc_endpoints))
        kwargs, plan_status = llama_kwargs_for_plan(plan), plan.to_status()
        output_on_host = plan.output_on_host and not spec.get("logits_remote")
    with output_projection_on_host(output_on_host):
        llm = llama_cpp.Llama(model, n_ctx=512, n_threads=spec["threads"], seed=0, verbose=False, **kwargs)
    print(json.dumps({"ready": True, "plan": plan_status}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        t0 = time.perf_counter()
        out = llm.create_completion(PROMPT, max_tokens=spec["tokens"], temperature=0.0)
        dt = time.perf_counter() - t0
        print(
            json.dumps({"tokens": out["usage"]["completion_tokens"], "seconds": dt, "text": out["choices"][0]["text"]}),
            flush=True,
        )


# ---------------------------------------------------------------- driver
class Procs(contextlib.ExitStack):
    def start(self, argv: list[str], **kw) -> subprocess.Popen:
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, **kw)
        self.callback(_stop, p)
        return p


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def _line(p: subprocess.Popen) -> dict:
    line = p.stdout.readline()
    if not line:
        raise RuntimeError(f"process {p.args[:4]} exited with {p.wait()}")
    return json.loads(line)


def start_workers(procs: Procs, n: int, threads: int) -> list[tuple[str, int]]:
    """Start ``n`` loopback workers; return their (endpoint, pid)."""
    from hydra_node.runtime.rpc.supervisor import free_loopback_port

    ws = [
        procs.start(
            [
                sys.executable,
                "-m",
                "hydra_node.runtime.rpc.worker",
                "--port",
                str(free_loopback_port()),
                "--threads",
                str(threads),
            ],
            stderr=subprocess.DEVNULL,
        )
        for _ in range(n)
    ]
    return [(_line(w)["endpoint"], w.pid) for w in ws]


# ---------------------------------------------------------------- tunnel processes
class _OneLink:
    """What RemoteWorkerTunnel needs from MeshService: ``link_to(peer)``."""

    def __init__(self, link):
        self.link = link

    async def link_to(self, peer_id: str):
        return self.link


async def _tunnel_main(spec: dict) -> None:
    import trio
    from nacl.signing import SigningKey

    from hydra_node.mesh.link.endpoints import LinkListener, open_link
    from hydra_node.mesh.wire.ids import MeshSecret
    from hydra_node.mesh.link.peer_link import LinkSettings
    from hydra_node.runtime.rpc.tunnel import RemoteWorkerTunnel, RpcTunnelServer

    mesh = MeshSecret(bytes.fromhex(spec["mesh"]))
    if spec["side"] == "worker":  # a worker node: serves tunnel streams to its loopback worker
        w = spec["worker"]
        server = RpcTunnelServer("bench", lambda: (w["endpoint"], w["proto"], w["free_bytes"], w["device"]))

        async def on_stream(link, header, stream):
            await server.handle(link, header, stream)

        listener = LinkListener(LinkSettings(identity=SigningKey.generate(), mesh=mesh, on_stream=on_stream))
        async with trio.open_nursery() as nursery:
            if not spec.get("link_only"):
                await nursery.start(server.serve_data, "127.0.0.1")
            port = await nursery.start(listener.serve, "127.0.0.1", 0)
            print(json.dumps({"url": f"ws://127.0.0.1:{port}"}), flush=True)
            await trio.sleep_forever()
    async with trio.open_nursery() as nursery:  # the coordinator node: leases + tunnel ports
        endpoints = []
        for url in spec["urls"]:
            link = await nursery.start(
                _hold_link, open_link, url, LinkSettings(identity=SigningKey.generate(), mesh=mesh)
            )
            info = await nursery.start(RemoteWorkerTunnel(_OneLink(link), link.peer_id, tag="bench").run)
            endpoints.append(info.endpoint)
        print(json.dumps({"endpoints": endpoints}), flush=True)
        await trio.sleep_forever()


async def _hold_link(open_link, url, settings, *, task_status) -> None:
    import trio

    async with open_link(url, settings) as link:
        task_status.started(link)
        await trio.sleep_forever()


def start_tunnelled_workers(procs: "Procs", n: int, threads: int, link_only: bool = False) -> list[tuple[str, int]]:
    """``n`` loopback workers, each behind its own worker-node tunnel process, reached from one
    coordinator-node tunnel process; returns (tunnel endpoint, pid) with every pid involved.
    ``link_only``: the worker nodes offer no data port, so bytes ride the link streams."""
    from hydra_node.runtime.rpc.supervisor import free_loopback_port

    mesh = os.urandom(32).hex()
    ws = [
        procs.start(
            [
                sys.executable,
                "-m",
                "hydra_node.runtime.rpc.worker",
                "--port",
                str(free_loopback_port()),
                "--threads",
                str(threads),
            ],
            stderr=subprocess.DEVNULL,
        )
        for _ in range(n)
    ]
    ready = [_line(w) for w in ws]
    sides = [
        procs.start(
            [
                sys.executable,
                __file__,
                "--tunnel",
                json.dumps({"side": "worker", "mesh": mesh, "worker": r, "link_only": link_only}),
            ]
        )
        for r in ready
    ]
    urls = [_line(p)["url"] for p in sides]
    coord = procs.start(
        [sys.executable, __file__, "--tunnel", json.dumps({"side": "coord", "mesh": mesh, "urls": urls})]
    )
    endpoints = _line(coord)["endpoints"]
    extra = [p.pid for p in sides] + [coord.pid]
    return [(ep, w.pid) for ep, w in zip(endpoints, ws)] + [(None, pid) for pid in extra]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of ``pids`` (from /proc): cost that machine load does not inflate."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


MODES = {
    "local": lambda procs, args: [],
    "split-direct": lambda procs, args: start_workers(procs, 2, args.threads),
    "split-tunnel": lambda procs, args: start_tunnelled_workers(procs, 2, args.threads),
    "split-link": lambda procs, args: start_tunnelled_workers(procs, 2, args.threads, link_only=True),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--tunnel", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(json.loads(args.serve))
    if args.tunnel:
        import trio

        return trio.run(_tunnel_main, json.loads(args.tunnel))

    model = str(bundled_model_path())
    print("load average before: %.1f %.1f %.1f" % os.getloadavg())
    with Procs() as procs:
        runners, pids = {}, {}
        for name, workers_for in MODES.items():
            workers = workers_for(procs, args)
            spec = {
                "model": model,
                "endpoints": [ep for ep, _ in workers if ep],
                "threads": args.threads,
                "tokens": args.tokens,
            }
            runners[name] = procs.start([sys.executable, __file__, "--serve", json.dumps(spec)])
            pids[name] = [runners[name].pid] + [pid for _, pid in workers]
            ready = _line(runners[name])
            if ready["plan"]:
                layout = ", ".join(f"{d['name']}:{d['layers'][0]}-{d['layers'][1]}" for d in ready["plan"]["devices"])
                print(f"{name}: layers {layout}")
        rates: dict[str, list[float]] = {n: [] for n in MODES}
        cpu_per_token: dict[str, list[float]] = {n: [] for n in MODES}
        texts: dict[str, str] = {}
        names = list(MODES)
        for r in range(args.rounds + 1):  # round 0 warms up
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                cpu0 = cpu_seconds(pids[name])
                runners[name].stdin.write("run\n")
                runners[name].stdin.flush()
                res = _line(runners[name])
                texts[name] = res["text"]
                if r:
                    rates[name].append(res["tokens"] / res["seconds"])
                    cpu_per_token[name].append(1000 * (cpu_seconds(pids[name]) - cpu0) / res["tokens"])
        base = statistics.median(rates["local"])
        base_cpu = statistics.median(cpu_per_token["local"])
        print(
            f"{'mode':<14} {'tok/s median':>12} {'min':>7} {'max':>7} {'ratio':>6} {'cpu ms/tok':>10} {'cpu ratio':>9}"
        )
        for name in names:
            med, cpu = statistics.median(rates[name]), statistics.median(cpu_per_token[name])
            print(
                f"{name:<14} {med:12.1f} {min(rates[name]):7.1f} {max(rates[name]):7.1f} {med / base:6.2f} "
                f"{cpu:10.2f} {cpu / base_cpu:9.2f}"
            )
        if "split-tunnel" in rates:
            ratio = statistics.median(rates["split-tunnel"]) / statistics.median(rates["split-direct"])
            cpu_ratio = statistics.median(cpu_per_token["split-tunnel"]) / statistics.median(
                cpu_per_token["split-direct"]
            )
            per_round = [t / d for t, d in zip(rates["split-tunnel"], rates["split-direct"])]
            print(
                f"tunnel/direct tok/s ratio: {ratio:.2f} (per round {min(per_round):.2f}-{max(per_round):.2f}; "
                f"goal >= 0.85)   CPU per token ratio: {cpu_ratio:.2f}"
            )
            link = statistics.median(rates["split-link"]) / statistics.median(rates["split-direct"])
            print(f"link-stream fall-back (no data port)/direct tok/s ratio: {link:.2f}")
        same = all(t == texts["local"] for t in texts.values())
        print(f"greedy output identical across modes: {same}")
        print("load average after: %.1f %.1f %.1f" % os.getloadavg())


if __name__ == "__main__":
    main()
