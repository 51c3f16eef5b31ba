"""The node: owns the root nursery and the shutdown order; the only module that knows every service.

Start-up order: identity → pid file / stale clean-up → model runners (ready) →
management API → OpenAI API.  Shutdown (SIGINT/SIGTERM or :meth:`request_stop`):
stop accepting, end idle connections, end in-flight streams with a final SSE
error event, stop runners (terminate → grace → kill), remove pid files.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time

import trio

from hydra_node import __version__
from hydra_node.api.http import HttpServer
from hydra_node.api.management import ManagementApi
from hydra_node.api.openai import OpenAIApi
from hydra_node.config import NodeConfig
from hydra_node.identity import load_or_create_identity
from hydra_node.models import ModelRef, resolve_model
from hydra_node.pidfile import reap_stale, read_pidfile, remove_pidfile, write_pidfile
from hydra_node.mesh.service import MeshService
from hydra_node.router import Router, Target
from hydra_node.routing.live import LiveScheduling
from hydra_node.routing.wiring import wire_scheduling
from hydra_node.runtime.supervisor import RunnerSettings, RunnerSupervisor

log = logging.getLogger("hydra.node")

#: How long in-flight HTTP work may take to wind down after a stop request.
DRAIN_GRACE_S = 5.0


def _meminfo() -> tuple[int, int]:
    """(total, available) bytes; MemAvailable counts reclaimable page cache, unlike free pages."""
    total = avail = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name == "MemTotal":
                    total = int(rest.split()[0]) * 1024
                elif name == "MemAvailable":
                    avail = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return total, avail


class NodeAlreadyRunning(Exception):
    pass


def check_rpc_support() -> None:
    """Refuse to start with a llama-cpp-python that was built without RPC."""
    import llama_cpp

    if not llama_cpp.llama_supports_rpc():
        raise RuntimeError("this llama-cpp-python was built without RPC support; run `make install`, which "
                           "builds llama-cpp-python 0.3.36 with CMAKE_ARGS=-DGGML_RPC=on")


class LocalRunners:
    """Target source for the models this node hosts."""

    def __init__(self, node_id: str):
        self.node_id = node_id
        self.runners: dict[str, RunnerSupervisor] = {}

    def targets(self) -> list[Target]:
        return [Target(model=r.model.id, node_id=self.node_id, local=True, open=r.generate,
                       queue_depth=r.queue_depth + r.in_flight, state=r.state if r.state != "restarting" else "loading")
                for r in self.runners.values()]


class Node:
    def __init__(self, config: NodeConfig):
        self.config = config
        self.home = config.home
        self.identity = load_or_create_identity(self.home)
        self.node_id = self.identity.node_id
        self.started_at = time.time()
        self.state = "starting"
        self.router = Router(self.node_id, LiveScheduling(config.file.scheduler, self.node_id))
        self.local = LocalRunners(self.node_id)
        self.router.add_source(self.local)
        self.models: list[ModelRef] = [] if config.no_model else [resolve_model(m) for m in (config.models or (None,))]
        self.api_server: HttpServer | None = None
        self.console_server: HttpServer | None = None
        self.requests_total: dict[str, int] = {}
        self._stop = trio.Event()
        self.pidfile = self.home / "run" / "node.pid"
        self._extra_routes: dict = {("POST", "/api/invite"): self._api_invite}
        self._status_sections: dict = {}
        self.mesh: MeshService | None = None
        if config.mesh is not None:
            self.mesh = MeshService(self, config.mesh)
            self.router.add_source(self.mesh)
        from hydra_node.runtime.speculative.mesh import SpeculationService
        self.speculation = SpeculationService(self)  # [defaults.speculative]: draft server, draft tunnel, runner args
        self.metrics = wire_scheduling(self)  # /api/status sections, GET /metrics, gossip summary
        from hydra_node.runtime.hosting import ModelRuntime
        self.runtime = ModelRuntime(self)  # hosted models: placement, splits, RPC worker, hot swap
        self.discovery = None  # mDNS / Nostr / --auto around the mesh start (hydra_node/discovery/node_glue.py)
        if self.mesh is not None and config.discovery is not None:
            from hydra_node.discovery.node_glue import NodeDiscovery
            self.discovery = NodeDiscovery(self, config.discovery)

    # ---- public surface used by the APIs ------------------------------------------
    def healthy(self) -> bool:
        return self.state == "serving"

    def management_routes(self) -> dict:
        return self._extra_routes

    def add_status_section(self, name: str, fn) -> None:
        self._status_sections[name] = fn

    def hardware(self) -> dict:
        cores = os.cpu_count() or 1
        ram, avail = _meminfo()
        usable = avail
        if self.config.max_memory_bytes:
            usable = min(usable, self.config.max_memory_bytes) if usable else self.config.max_memory_bytes
        return {"cores": cores, "ram_bytes": ram, "vram_bytes": 0, "usable_bytes": usable}

    async def _api_invite(self, request):
        from hydra_node.api.http import Response
        from hydra_node.mesh.token import parse_invite
        if self.mesh is None or self.mesh.mesh is None:
            return Response.json(503, {"error": {"message": "this node is not in a mesh", "type": "server_error",
                                                 "param": None, "code": "no_mesh"}})
        try:
            body = request.json() if request.body else {}
            ttl = float(body.get("ttl_s", self.mesh.settings.invite_ttl_s))
            if not (60 <= ttl <= 30 * 24 * 3600):
                raise ValueError("ttl_s must be between 60 s and 30 days")
        except (ValueError, TypeError, AttributeError) as exc:
            return Response.json(400, {"error": {"message": f"bad invite request: {exc}", "type":
                                                 "invalid_request_error", "param": "ttl_s", "code": "invalid_value"}})
        token = self.mesh.invite(ttl)
        tok = parse_invite(token, time.time())
        return Response.json(200, {"token": token, "mesh_id": tok.mesh_id, "expires_at": tok.expires_at,
                                   "addresses": list(tok.addrs)})

    def runner_settings(self) -> RunnerSettings:
        f = self.config.file
        mf, tp, hw, rn = f.defaults.model_fit, f.defaults.throughput, f.defaults.hardware, f.runner
        return RunnerSettings(n_ctx=mf.ctx_size, n_batch=mf.batch, threads=tp.threads, threads_batch=tp.threads_batch,
                              mlock=hw.mlock, prompt_cache=mf.prompt_cache, warmup=hw.warmup, queue_size=tp.queue_size, load_timeout_s=rn.load_timeout_s,
                              backoff_initial_s=rn.restart_backoff_initial_s, backoff_max_s=rn.restart_backoff_max_s,
                              crash_loop_restarts=rn.crash_loop_restarts, crash_loop_window_s=rn.crash_loop_window_s,
                              inject_token_delay_ms=rn.inject_token_delay_ms,
                              extra_argv=self.speculation.runner_argv())

    def status(self) -> dict:
        runners = list(self.local.runners.values())
        st = {
            "node_id": self.node_id,
            "name": self.config.name or self.node_id[:8],
            "version": __version__,
            "node_state": self.state,
            "is_host": bool(runners),
            "is_client": self.config.role == "client",
            "role": self.config.role,
            "api_port": self.api_server.port if self.api_server else None,
            "console_port": self.console_server.port if self.console_server else None,
            "uptime_s": round(time.time() - self.started_at, 1),
            "models": [r.status() for r in runners],
            "serving_models": [r.model.id for r in runners if r.state == "ready"],
            "available_models": [m.id for m in self.router.models()],
            "peers": self.mesh.peers() if self.mesh else [],
            "token": self.mesh.token() if self.mesh and self.mesh.mesh else None,
            "mesh": self.mesh.status() if self.mesh else None,
            "inflight_requests": sum(r.in_flight for r in runners),
            "queue_depth": sum(r.queue_depth for r in runners),
            "runner_restarts": sum(r.restarts for r in runners),
            "requests": dict(self.requests_total),
            "routing": {"retries": self.router.retries, "no_target": self.router.no_target},
            "home": str(self.home),
        }
        for name, fn in self._status_sections.items():
            st[name] = fn()
        return st

    def request_stop(self) -> None:
        self._stop.set()

    def _count_request(self, path: str, status: int) -> None:
        key = f"{path} {status}"
        if len(self.requests_total) < 256 or key in self.requests_total:
            self.requests_total[key] = self.requests_total.get(key, 0) + 1

    # ---- lifecycle ----------------------------------------------------------------
    def _claim_home(self) -> None:
        for action in reap_stale(self.home / "run"):
            log.info("event=cleanup %s", action)
        rec = read_pidfile(self.pidfile)
        if rec is not None and rec.alive() and rec.pid != os.getpid():
            raise NodeAlreadyRunning(f"a node is already running with home {self.home} (pid {rec.pid}); "
                                     f"stop it with `hydra-node stop --home {self.home}` or use another --home")
        write_pidfile(self.pidfile, os.getpid(), ["hydra-node", "serve"], kind="node")

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self._claim_home()
        try:
            async with trio.open_nursery() as root:
                root.start_soon(self._watch_signals, root.cancel_scope)
                for model in self.models:  # a model that needs a split waits for the mesh (runtime.run)
                    log.info("event=model_loading model=%s path=%s", model.id, model.path)
                    await self.runtime.start_model(root, model)
                await self._start_services(root)
                if self.mesh is not None:
                    await root.start(self.discovery.run if self.discovery is not None else self.mesh.run)
                    await root.start(self.router.scheduling.run, self.mesh)  # RTT samples, peer hints
                await root.start(self.speculation.run)  # draft server, draft tunnel port (speculative/mesh.py)
                await root.start(self.runtime.run)  # RPC worker, split models, hot swap (runtime/hosting.py)
                self.state = "serving"
                self._write_ports()
                log.info("event=node_ready node_id=%s api=http://%s:%s/v1 console=http://%s:%s models=%s",
                         self.node_id, self.config.api_host, self.api_server.port, self.config.api_host,
                         self.console_server.port, ",".join(m.id for m in self.models) or "-")
                task_status.started(self)
                await self._stop.wait()
                self.state = "stopping"
                log.info("event=node_stopping")
                with trio.CancelScope(shield=True):
                    with trio.move_on_after(DRAIN_GRACE_S + 1):
                        async with trio.open_nursery() as drain:
                            drain.start_soon(self.api_server.drain, DRAIN_GRACE_S)
                            drain.start_soon(self.console_server.drain, 1.0)
                    if self.mesh is not None:
                        await self.mesh.leave()
                root.cancel_scope.cancel()
        finally:
            self.state = "stopped"
            remove_pidfile(self.pidfile)
            remove_pidfile(self.home / "run" / "ports.json")
            log.info("event=node_stopped")

    def _write_ports(self) -> None:
        path = self.home / "run" / "ports.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"api_port": self.api_server.port, "console_port": self.console_server.port,
                                   "pid": os.getpid(), "node_id": self.node_id}))
        os.replace(tmp, path)

    async def _start_services(self, nursery: trio.Nursery) -> None:
        c = self.config
        mgmt = ManagementApi(self, headless=c.headless, api_key=c.api_key if c.listen_all else None)
        self.console_server = HttpServer(mgmt.handle, c.api_host, c.console_port, name="console")
        await nursery.start(self.console_server.run)
        api = OpenAIApi(self.router, api_key=c.api_key, on_request=self._count_request)
        self.api_server = HttpServer(api.handle, c.api_host, c.api_port, name="api")
        await nursery.start(self.api_server.run)

    async def _watch_signals(self, root_scope: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                if self._stop.is_set():
                    log.warning("event=second_signal action=exit_now")
                    raise KeyboardInterrupt
                log.info("event=signal signal=%s", signal.Signals(signum).name)
                self.request_stop()
                if self.state == "starting":  # nothing to drain yet: stop loading now
                    root_scope.cancel()


async def serve(config: NodeConfig) -> None:
    node = Node(config)
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
