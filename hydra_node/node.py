"""The node: the composition root.  It owns the root nursery and the shutdown order, and it is
the only module that knows every service and wires them together.

Each service gets narrow, typed inputs (settings dataclasses, callables, small Protocols such as
the mesh views in ``runtime/peers.py``) and never the ``Node``.  What crosses services is declared
here and nowhere else: the management route table (``Node.management_routes``), the
``/api/status`` sections (``Node.status_sections``, typed statistics rendered by
``hydra_node/admin/status_json.py``), the mesh's tunnel handlers, what goes into our announcement,
the router's target sources and the scheduler's listeners.

Start-up order (``Node.run``): identity (in ``__init__``) → pid file and stale clean-up → every
listener bound but not yet served (OpenAI API, management API, peer links, tunnel data port: a
port in use stops the start here, before any model or mesh work; ``hydra_node/listen.py``) → the
models that fit locally, each ready → management API → OpenAI API → mesh (joined by the
``--join`` plan; with discovery on it starts unjoined) → discovery (chooses and joins a mesh, then
announces it) → scheduler sampling → speculation (draft server, draft tunnel port) → model
runtime (RPC worker, models that wait for the mesh) → state ``serving`` and ports.json.
Shutdown (SIGINT/SIGTERM or :meth:`Node.request_stop`): hand over (admit no new generation, let
local ones finish within ``[node].handover_grace_s``, end the others with ``draining`` so their
routers continue them on other hosts, wait for our own clients' continued streams: bounded;
routing/handover.py), drain the APIs (streams still in flight end with a final SSE error event),
leave the mesh (bounded), cancel the root nursery
(runners and workers: terminate → grace → kill), remove the pid files.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import os
import signal
import time
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

import trio

from hydra_node import __version__
from hydra_node.http.server import HttpServer
from hydra_node.admin.events import EventsRoute
from hydra_node.admin.history import HistorySampler
from hydra_node.http.guard import GuardSettings
from hydra_node.admin.management import Handler, ManagementApi
from hydra_node.admin.invites import invite_routes
from hydra_node.admin.metrics import MetricsSources, NodeMetrics, RunnerSample
from hydra_node.anthropic.routes import MessagesApi
from hydra_node.api.port import InferencePort
from hydra_node.api.images import ImagePolicy
from hydra_node.http.limits import INFERENCE_BODY_BYTES, HttpLimits
from hydra_node.moa.answers import MoaApi
from hydra_node.moa.mixture import MixtureOfAgents, scheduler_quality
from hydra_node.openai.embeddings import EmbeddingsApi
from hydra_node.openai.llama_server import LlamaServerApi
from hydra_node.openai.routes import OpenAIApi
from hydra_node.responses.routes import ResponsesApi
from hydra_node.admin.runtime import runtime_routes
from hydra_node.admin.models import models_routes
from hydra_node.admin.placement import placement_routes
from hydra_node.admin.kv import kv_routes, kv_status
from hydra_node.admin.rehost import rehost_routes
from hydra_node.admin.status_json import to_json
from hydra_node.config import NodeConfig
from hydra_node.listen import ListenPurpose
from hydra_node.mesh.identity import load_or_create_identity
from hydra_node.models import BUNDLED_MODEL_ID, ModelNotFound, ModelRef, bundled_model_path, resolve_model
from hydra_node.models import resolve_mmproj
from hydra_node.pidfile import reap_stale, read_pidfile, remove_pidfile, write_pidfile
from hydra_node.mesh.announcer import AnnouncementContent
from hydra_node.mesh.membership import Hardware, ModelEntry
from hydra_node.discovery.service import DiscoveryService, NodeFacts
from hydra_node.eventlog import EventLog
from hydra_node.mesh.joining import JoinPlan
from hydra_node.mesh.service import MeshService
from hydra_node.routing.identity import ModelIdentities
from hydra_node.routing.handover import ANNOUNCED_STATE, Handover, HandoverRouter
from hydra_node.routing.remote import RemoteGeneration
from hydra_node.routing.remote_embed import RemoteEmbeddings
from hydra_node.routing.remote_tokenize import TOKENIZE_KIND, RemoteTokenizer
from hydra_node.runtime.hosting.caps_wire import caps_extra
from hydra_node.routing.live import LiveScheduling
from hydra_node.runtime.hosting.rehost import RehostService, RehostSettings
from hydra_node.runtime.hosting.service import HostMemory, ModelRuntime, RuntimeSettings
from hydra_node.runtime.rpc.tunnel import TUNNEL_SERVICE
from hydra_node.runtime.fetch import FETCH_KIND, BadModelSource, DownloadError, ModelShare, fetch_for_serve
from hydra_node.runtime.fetch.catalogue import load_catalogue, resolve_remote
from hydra_node.runtime.fetch.serve_fetch import PEER_WAIT_S, SETTLE_S, wait_for_holders
from hydra_node.runtime.artifacts.manifest import signer
from hydra_node.runtime.artifacts.peer import ARTIFACT_FETCH_KIND
from hydra_node.runtime.artifacts.peer_wire import merge_held_extras
from hydra_node.runtime.artifacts.placed_model import KIND as PLACED_KIND
from hydra_node.runtime.artifacts.placed_model import placed_model, placed_name
from hydra_node.runtime.artifacts.service import PlacementService
from hydra_node.runtime.speculative.service import DRAFT_SERVICE, SpeculationService
from hydra_node.runtime.runner.records import RunnerSettings, RunnerState
from hydra_node.runtime.runner.supervisor import RunnerSupervisor
from hydra_node.config.runner_settings import runner_settings_from
from hydra_node.pidfile import NodeAlreadyRunning
from hydra_node.routing.local import LocalRunners
from hydra_node.routing.target import TargetState
from hydra_node.runtime.hosting.meminfo import read_meminfo

log = logging.getLogger("hydra.node")

#: How long in-flight HTTP work may take to wind down after a stop request.
DRAIN_GRACE_S = 5.0
#: How long the hand-over may take to end the local generations and answer the peers' streams.
HANDOVER_CLOSE_S = 2.0
#: How long a stopping node waits, after its hand-over, for its own API clients' streams (continued
#: on peers through its router and links) before the API drain ends them.
HANDOVER_STREAMS_WAIT_S = 10.0
#: The HTTP listeners, as a port-in-use error names them (the mesh and the runtime name their own ports).
API_PORT = ListenPurpose("the OpenAI API", "--port")
CONSOLE_PORT = ListenPurpose("the management API and console", "--console")


class NodeState(enum.StrEnum):
    """The node's life, as ``/api/status`` (``node_state``) and ``/health`` (while not serving) say it."""

    STARTING = "starting"  # loading models, starting services, joining the mesh
    SERVING = "serving"  # everything is up; ports.json is written
    STOPPING = "stopping"  # draining
    STOPPED = "stopped"


class Node:
    def __init__(self, config: NodeConfig):
        self.config = config
        self.home = config.home
        self.identity = load_or_create_identity(self.home)
        self.node_id = self.identity.node_id
        self.started_at = time.time()
        self.state = NodeState.STARTING
        self.scheduling = LiveScheduling(config.file.scheduler, self.node_id)
        self.events = EventLog(clock=time.time, first_id=int(self.started_at * 1000))  # GET /api/events
        #: The stop's hand-over of local generations to other hosts (routing/handover.py).
        self.handover = Handover(self.node_id)
        self.router = HandoverRouter(
            self.node_id,
            scheduling=self.scheduling,
            on_event=self.events.emit,
            max_continuations=config.file.scheduler.max_continuations,
            target_wait_s=config.file.scheduler.target_wait_s,
            handover=self.handover,
        )
        #: model id → runner supervisor: the model runtime fills it, the router and status read it.
        self.runners: MutableMapping[str, RunnerSupervisor] = {}
        #: the hosted files' identities (a continuation resumes only on the same one: routing/identity.py)
        self.identities = ModelIdentities(self.home / "kv" / "digests.json")
        self.local = LocalRunners(
            self.node_id,
            self.runners,
            identity=self.identities.of,
            handover=self.handover,
            hosted_elsewhere=self._hosted_elsewhere,
        )
        self.router.add_source(self.local)
        refs = config.models or (() if config.fetch_models else (None,))  # None: the bundled model
        #: ``--mmproj``: model id → projector GGUF served beside it (docs/vision.md)
        self.projectors: dict[str, str] = dict(config.mmproj)
        self.models: list[ModelRef] = (
            []
            if config.no_model or config.standby
            else [self.with_projector(resolve_model(m)) for m in refs if placed_name(m) is None]
        )
        self.placed_models = [n for n in map(placed_name, config.models) if n is not None]  # materialised in run
        self._check_projector_ids()
        self.api_server: HttpServer | None = None
        self.console_server: HttpServer | None = None
        self.requests_total: dict[str, int] = {}
        self._stop = trio.Event()
        self.pidfile = self.home / "run" / "node.pid"
        self.mesh: MeshService | None = None
        self.remote: RemoteGeneration | None = None
        if config.mesh is not None:
            self.mesh = MeshService(
                signing_key=self.identity.signing_key,
                state_dir=self.home / "mesh",
                settings=config.mesh,
                announcement=self.announcement_content,
                name=config.name or self.node_id[:8],
                on_event=self.events.emit,
            )
            self.embeddings = RemoteEmbeddings(self.mesh, node_id=self.node_id, local_embed=self._local_embed)
            self.tokenizer = RemoteTokenizer(self.mesh, node_id=self.node_id, local_tokenize=self._local_tokenize)
            self.remote = RemoteGeneration(
                self.mesh,
                node_id=self.node_id,
                local_open=self._local_open,
                embed_remote=self.embeddings.embed_remote,
                tokenize_remote=self.tokenizer.tokenize_remote,
            )
            self.remote.admission = self.handover.refusal  # a stopping node admits no peer's new stream
            self.router.add_source(self.remote)
            self.mesh.handle_stream("generate", self.handover.serving(self.remote.serve))
            self.mesh.handle_stream("embed", self.embeddings.serve)
            self.mesh.handle_stream(TOKENIZE_KIND, self.tokenizer.serve)
        f = config.file
        self.placement = PlacementService.for_node(
            f.placement,
            home=self.home,
            signing_key=self.identity.signing_key,
            node_id=self.node_id,
            mesh=self.mesh,  # docs/placement.md
            on_materialised=self.scheduling.observe_materialised,
        )
        # models to and from peers, in placement's cache: one cache (docs/models.md)
        self.model_share = ModelShare.for_home(self.home, self.mesh, f, self.placement.cache)
        # [defaults.speculative]: draft server, draft tunnel port, runner arguments
        self.speculation = SpeculationService(
            f.defaults.speculative,
            log_dir=self.home / "logs",
            threads=f.defaults.throughput.threads,
            mesh=self.mesh,
            run_dir=self.home / "run",
        )
        # hosted models: placement, splits, RPC worker, hot swap
        self.runtime = ModelRuntime(
            RuntimeSettings(
                node_id=self.node_id,
                home=self.home,
                force_split=config.force_split,
                stall_timeout_s=config.split_stall_timeout_s,
                rpc_worker=config.rpc_worker and config.role != "client",
                tunnel_port=config.tunnel_port,
                max_memory_bytes=config.max_memory_bytes,
            ),
            runners=self.runners,
            runner_settings=self.runner_settings,
            host_memory=self.host_memory,
            mesh=self.mesh,
            on_event=self.events.emit,
        )
        self.runtime.on_kv_transfer = self.scheduling.observe_kv  # docs/kv-reuse.md: KV transfer cost
        # making room in the cache never evicts a file a hosted model runs from
        self.model_share.cache.serving_paths = lambda: [
            p for h in self.runtime.hosted.values() for p in (h.model.path, h.model.mmproj) if p is not None
        ]
        # [rehost]: a model the mesh lost is hosted again (docs/models.md "Growing back")
        self.rehost = RehostService(
            RehostSettings(
                node_id=self.node_id,
                enabled=f.rehost.enabled,
                standby=config.standby,
                min_hosts=f.rehost.min_hosts,
                keep_recent_s=f.rehost.keep_recent_s,
                settle_s=f.rehost.settle_s,
                max_models=f.rehost.max_models,
                offers=config.role == "host",
            ),
            runtime=self.runtime,
            mesh=self.mesh,
            share=self.model_share,
            digests=self.identities.digests,  # the model identities' table (routing/identity.py), shared
            bundled=(BUNDLED_MODEL_ID, bundled_model_path),
            on_event=self.events.emit,
            projector=self.projector_path,  # a model re-hosted here keeps the projector it was served with
        )
        self.metrics = NodeMetrics(
            MetricsSources(
                http_requests=lambda: self.requests_total,
                runners=self._runner_samples,
                routing=self.router.statistics,
                scheduling=self.scheduling.statistics,
                gossip=self.mesh.gossip_statistics if self.mesh is not None else lambda: None,
                links=self._link_statistics,
            )
        )
        self.history = HistorySampler(
            config.file.scheduler.history_interval_ms / 1000,
            runners=self.runners.values,
            links=self.mesh.open_links if self.mesh is not None else list,
        )  # GET /api/history
        self.scheduling.listeners += [self.metrics.observe, self.history.observe, self.rehost.observe_request]
        if self.mesh is not None:
            self.mesh.handle_tunnel(DRAFT_SERVICE, self.speculation.handle_stream)
            self.mesh.handle_tunnel(TUNNEL_SERVICE, self.runtime.tunnel_server.handle)
            self.mesh.handle_stream(FETCH_KIND, self.model_share.serve)
            # placement's artifacts and our cached models (as model_weights sha256:HEX), one stream
            offered = self.model_share.artifact_share(self.placement.cache, signer(self.identity.signing_key))
            self.mesh.handle_stream(ARTIFACT_FETCH_KIND, offered.serve)
        #: The management API's routes besides /health and /api/status: (method, path) → handler.
        self.management_routes: dict[tuple[str, str], Handler] = {
            **invite_routes(self.mesh),  # POST /api/invite, GET /api/invites, POST /api/invite/revoke
            ("GET", "/metrics"): self.metrics.handle,
            ("GET", "/api/events"): EventsRoute(self.events).handle,
            ("GET", "/api/history"): self.history.handle,
            **runtime_routes(self.runtime),
            **models_routes(self.model_share),  # POST /api/models/fetch
            **placement_routes(self.placement),  # /api/placement/... (docs/placement.md)
            **kv_routes(self.runners, self.home / "kv" / "exports", self.placement),  # /api/kv/... (docs/kv-reuse.md)
            **rehost_routes(self.rehost),  # GET /api/rehost, POST /api/rehost/min-hosts
        }
        #: Sections of /api/status beyond the node's own fields: name → typed statistics.
        self.status_sections: dict[str, Callable[[], Any]] = {
            "speculation": self.speculation.status,
            "network_costs": self.scheduling.network_costs,
            "scheduler": self.scheduling.status,
            "splits": self.runtime.splits_status,
            "rpc_worker": self.runtime.worker_status,
            "rehost": self.rehost.status,
            "model_share": self.model_share.status,
            "placement": self.placement.status,
            "kv_cache": kv_status(self.runners),
            "events": self.events.statistics,
            "invites": self.mesh.invites.statistics if self.mesh is not None else lambda: None,
            "config": lambda: {
                "reserved_keys": list(self.config.file.reserved_keys),
                "files": list(self.config.config_files),
                "api": {
                    "cors_origins": list(self.config.file.api.cors_origins),
                    "allow_hosts": list(self.config.file.api.allow_hosts),
                },
            },
        }
        #: How the mesh is entered: the --join invites (TokenError here for a bad one), or our own mesh.
        self.join_plan = JoinPlan.from_tokens(config.mesh.join, time.time()) if config.mesh is not None else None
        self.discovery: DiscoveryService | None = None  # mDNS / Nostr / --auto: chooses and joins the mesh
        if self.mesh is not None and config.discovery is not None:
            self.discovery = DiscoveryService(
                self.mesh,
                NodeFacts(
                    node_id=self.node_id,
                    name=config.name or self.node_id[:8],
                    configured_models=frozenset(m.id for m in self.models),
                    ready_models=lambda: sorted(
                        r.model.id for r in self.runners.values() if r.state == RunnerState.READY
                    ),
                    serving_models=lambda: [m.id for m in self.router.models()],
                    spare_slots=self._spare_slots,
                ),
                config.discovery,
                home=self.home,
                plan=self.join_plan,
            )
            self.status_sections["discovery"] = self.discovery.status

    # ---- public surface used by the APIs ------------------------------------------
    def health(self) -> tuple[int, dict]:
        """``/health`` on both ports: 200 ``ok`` while serving with every hosted model usable; 503
        ``degraded`` naming the models in state failed (they retry after ``failed_retry_s``);
        503 with the node's state while it starts or stops."""
        if self.state != NodeState.SERVING:
            return 503, {"status": str(self.state)}
        failed = sorted(r.model.id for r in self.runners.values() if r.state == RunnerState.FAILED)
        if failed:
            return 503, {"status": "degraded", "failed_models": failed}
        return 200, {"status": "ok"}

    def host_memory(self) -> HostMemory:
        """Total RAM and what placement may fill: MemAvailable less ``safety_margin_gb``, capped by ``--max-memory``."""
        ram, avail = read_meminfo()
        margin = int(self.config.file.defaults.hardware.safety_margin_gb * (1 << 30))
        return HostMemory.budget(ram, avail, safety_margin_bytes=margin, max_memory_bytes=self.config.max_memory_bytes)

    # ---- what the root hands from one service to another ------------------------------
    def announcement_content(self) -> AnnouncementContent:
        """What our mesh announcement says: hosted models and their load, hardware, the RPC worker's
        capacity, and ``extra`` from the speculation service (our draft), the scheduler (telemetry
        summary) and the model runtime (RPC protocol and lease holder)."""
        runners = list(self.runners.values())
        rpc, rpc_extra = self.runtime.rpc_announcement()
        mem = self.host_memory()
        return AnnouncementContent(
            models=tuple(
                ModelEntry(
                    r.model.id,
                    str(r.state) if self.handover.admitting else ANNOUNCED_STATE,  # stopping: route elsewhere
                    r.free_slots,
                    self.identities.of(r.model.path),
                )
                for r in runners
            ),
            hardware=Hardware(
                cores=os.cpu_count() or 1,
                ram_bytes=mem.ram_bytes,
                vram_bytes=self.runtime.vram_bytes(),
                usable_bytes=mem.usable_bytes,
            ),
            queue_depth=sum(r.queue_depth + r.in_flight for r in runners),
            throughput_milli=tuple(
                (r.model.id, int(r.stats.tokens_per_s * 1000)) for r in runners if r.stats.tokens_per_s > 0
            ),
            api_port=self.api_server.port if self.api_server else None,
            console_port=self.console_server.port if self.console_server else None,
            rpc=rpc,
            # one artifacts_held list: placement's first, then the cached models that fit (not a ** overwrite)
            extra=merge_held_extras(
                {
                    **self.speculation.announce_extra(),
                    **self.scheduling.announce_extra(),
                    **rpc_extra,
                    **self.rehost.announce_extra(),
                    **caps_extra((r.model.id, r.caps) for r in runners),  # runtime/hosting/caps_wire.py
                },
                placement=self.placement.announce_extra(),
                models=self.model_share.announce_extra(),
            ),
        )

    def _ready_model_paths(self) -> list[Path]:
        """The files of the runners that are ready (their identities are hashed: routing/identity.py)."""
        return [r.model.path for r in self.runners.values() if r.state == RunnerState.READY]

    def _local_embed(self, model_id: str):
        """How a peer's ``embed`` stream runs on a model hosted here (None: not hosted)."""
        runner = self.runners.get(model_id)
        return runner.embeddings.embed if runner is not None else None

    def _local_tokenize(self, model_id: str):
        """How a peer's ``tokenize`` stream runs on a model hosted here (None: not hosted)."""
        runner = self.runners.get(model_id)
        return runner.tokenize if runner is not None else None

    def _local_open(self, model_id: str):
        """How a peer's ``generate`` stream runs on a model hosted here (None: not hosted)."""
        runner = self.runners.get(model_id)
        return self.handover.open(runner.generate) if runner is not None else None

    def _hosted_elsewhere(self, model_id: str) -> bool:
        """A peer announces ``model_id`` ready (a stopping node then routes new requests there)."""
        return self.remote is not None and any(
            t.model == model_id and t.state == TargetState.READY for t in self.remote.targets()
        )

    def _spare_slots(self) -> int:
        """Free request-queue slots of our ready models (published in our Nostr listing)."""
        queue_size = self.config.file.defaults.throughput.queue_size
        return sum(
            max(0, queue_size - r.queue_depth - r.in_flight)
            for r in self.runners.values()
            if r.state == RunnerState.READY
        )

    def _runner_samples(self) -> list[RunnerSample]:
        return [
            RunnerSample(
                model=r.model.id,
                queue_depth=r.queue_depth,
                in_flight=r.in_flight,
                tokens_per_s=r.stats.tokens_per_s,
                restarts=r.restarts,
                ready=r.state == RunnerState.READY,
                engine=r.engine_stats,
            )
            for r in self.runners.values()
        ]

    def _link_statistics(self) -> list:
        return [link.statistics() for link in self.mesh.open_links()] if self.mesh is not None else []

    def runner_settings(self) -> RunnerSettings:
        return runner_settings_from(self.config.file, self.speculation.runner_argv())

    def status(self) -> dict:
        """``/api/status``: the node's own fields, then each of :attr:`status_sections` as JSON."""
        runners = list(self.runners.values())
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
            "models": [to_json(r.status()) for r in runners],
            "serving_models": [r.model.id for r in runners if r.state == RunnerState.READY],
            "available_models": [m.id for m in self.router.models()],
            # what each model can do, as this node's router knows it (routing/router.py capabilities)
            "model_caps": {m.id: to_json(m.caps) for m in self.router.models()},
            "peers": to_json(self.mesh.peers()) if self.mesh else [],
            "mesh": self._mesh_status(),
            "inflight_requests": sum(r.in_flight for r in runners),
            "queue_depth": sum(r.queue_depth for r in runners),
            "runner_restarts": sum(r.restarts for r in runners),
            "requests": dict(self.requests_total),
            "routing": to_json(self.router.statistics()),
            "home": str(self.home),
        }
        for name, section in self.status_sections.items():
            st[name] = to_json(section())
        return st

    def _mesh_status(self) -> dict | None:
        if self.mesh is None:
            return None
        st = self.mesh.status()
        if self.remote is not None:
            st = dataclasses.replace(st, counters={**st.counters, **self.remote.statistics().counters()})
        return to_json(st)

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
            raise NodeAlreadyRunning(
                f"a node is already running with home {self.home} (pid {rec.pid}); "
                f"stop it with `hydra-node stop --home {self.home}` or use another --home"
            )
        write_pidfile(self.pidfile, os.getpid(), ["hydra-node", "serve"], kind="node")

    def projector_path(self, model_id: str) -> Path | None:
        """The projector ``--mmproj`` pairs with ``model_id`` (checked: a projector GGUF), or None."""
        ref = self.projectors.get(model_id)
        return None if ref is None else resolve_mmproj(ref)

    def with_projector(self, model: ModelRef) -> ModelRef:
        """``model`` with its projector (:meth:`projector_path`), if it has one."""
        path = self.projector_path(model.id)
        return model if path is None else dataclasses.replace(model, mmproj=path)

    def _check_projector_ids(self) -> None:
        """A projector paired with an id this node does not serve is refused (never silently dropped)."""
        if not self.projectors:
            return
        served = {m.id for m in self.models} | set(self.placed_models)
        for ref in self.config.fetch_models:  # --model NAME --join: fetched once joined
            try:
                served.add(resolve_remote(ref, load_catalogue()).model_id)
            except BadModelSource:
                pass  # its fetch reports it
        unknown = sorted(set(self.projectors) - served)
        if unknown:
            raise ModelNotFound(
                f"--mmproj: no model served here has the id {unknown[0]!r} (served: {', '.join(sorted(served)) or '-'})"
            )

    async def run(self, *, task_status: trio.TaskStatus[Node] = trio.TASK_STATUS_IGNORED) -> None:
        self._claim_home()
        log.info("event=config_files files=%s", ",".join(self.config.config_files) or "-")  # lowest first
        if self.config.file.reserved_keys:  # set in the file, not acted on yet (docs/config.md)
            log.warning("event=config_reserved_keys keys=%s", ",".join(self.config.file.reserved_keys))
        try:
            await self._bind_listeners()  # before any other work: a port in use fails the start here
            async with trio.open_nursery() as root:
                root.start_soon(self._watch_signals, root.cancel_scope)
                await root.start(self.placement.run)  # the artifact cache and operations (docs/placement.md)
                from_peers = await self._materialise_placed()  # what is not here yet waits for the mesh
                for model in self.models:  # a model that needs a split waits for the mesh (runtime.run)
                    log.info("event=model_loading model=%s path=%s", model.id, model.path)
                    await self.runtime.start_model(root, model)
                await self._start_services(root)
                root.start_soon(self.identities.run, self._ready_model_paths)
                await root.start(self.history.run)  # a point of GET /api/history every interval
                if self.mesh is not None:  # joined by the plan, or by discovery (which may choose the mesh)
                    await root.start(self.mesh.run, self.join_plan if self.discovery is None else None)
                    if self.discovery is not None:
                        await root.start(self.discovery.run)
                    await root.start(self.scheduling.run, self.mesh)  # RTT samples, peer hints
                    for ref in self.config.fetch_models:  # --model NAME --join: from a peer first, then the internet
                        await self._start_fetched(root, ref)
                    for name in from_peers:  # --model placement:NAME --join: from a peer that holds it
                        await self._start_placed_from_peers(root, name)
                await root.start(
                    self.speculation.run
                )  # draft server, draft tunnel port (runtime/speculative/service.py)
                await root.start(self.runtime.run)  # RPC worker, split models, hot swap (runtime/hosting/)
                if self.mesh is not None:
                    await root.start(self.rehost.run)  # models the mesh lost, hosted again (runtime/hosting/rehost.py)
                self.state = NodeState.SERVING
                self._write_ports()
                assert self.api_server is not None and self.console_server is not None  # built by _bind_listeners
                log.info(
                    "event=node_ready node_id=%s api=http://%s:%s/v1 console=http://%s:%s models=%s",
                    self.node_id,
                    self.config.api_host,
                    self.api_server.port,
                    self.config.api_host,
                    self.console_server.port,
                    ",".join(m.id for m in self.models) or "-",
                )
                task_status.started(self)
                await self._stop.wait()
                self.state = NodeState.STOPPING
                log.info("event=node_stopping")
                with trio.CancelScope(shield=True):
                    await self._hand_over()
                    with trio.move_on_after(DRAIN_GRACE_S + 1):
                        async with trio.open_nursery() as drain:
                            drain.start_soon(self.api_server.drain, DRAIN_GRACE_S)
                            drain.start_soon(self.console_server.drain, 1.0)
                    if self.mesh is not None:
                        await self.mesh.leave()
                root.cancel_scope.cancel()
        finally:
            for bound in (self.api_server, self.console_server, self.mesh, self.runtime):
                if bound is not None:
                    bound.close_unserved()  # what a start that failed early bound and never served
            self.state = NodeState.STOPPED
            remove_pidfile(self.pidfile)
            remove_pidfile(self.home / "run" / "ports.json")
            log.info("event=node_stopped")

    async def _hand_over(self) -> None:
        """The stop's first steps (docs/scheduler.md "Hand-over on stop"): admit no new generation
        (announced ``stopping`` at the next announcement check; peers' new streams refused with 503
        ``draining``), let local generations finish within ``[node].handover_grace_s``, end the others
        with ``draining`` (their requesters' routers continue them elsewhere), then wait (bounded) for
        this node's own clients' streams, continued on peers, before the API drain cuts them. When no
        peer hosts any of our models nothing could take them: the stop goes on as without a mesh."""
        if not any(self._hosted_elsewhere(model_id) for model_id in list(self.runners)):
            log.info("event=node_handover skipped=no_other_host")
            return
        self.handover.stop_admitting()
        grace = self.config.file.node.handover_grace_s
        with trio.move_on_after(grace):
            await self.handover.wait_local_idle()
        running = self.handover.open_generations
        self.handover.hand_over()
        log.info("event=node_handover grace_s=%s handed_over=%d", grace, running)
        with trio.move_on_after(HANDOVER_CLOSE_S):  # runners told, peers' error events sent
            await self.handover.wait_local_idle()
            await self.handover.wait_peers_answered()
        with trio.move_on_after(HANDOVER_STREAMS_WAIT_S):  # continued on peers: to their last byte
            await self.handover.wait_routed_idle()
            if self.api_server is not None:
                await self.api_server.wait_streams_done()

    async def _materialise_placed(self) -> list[str]:
        """Materialise every ``placement:NAME`` model from the cache or the namespaces; when one is in
        neither and the node joins a mesh, its name is returned: a peer may hold it (asked once joined)."""
        later = []
        for name in self.placed_models:
            try:
                model = await placed_model(self.placement, name)
            except ModelNotFound as exc:
                if self.mesh is None or self.config.mesh is None or not self.config.mesh.join:  # (both or neither)
                    raise
                log.info("event=placed_model_deferred model=%s reason=%r action=ask_peers_once_joined", name, str(exc))
                later.append(name)
                continue
            self.models.append(self.with_projector(model))  # (a bad projector: the start fails, not deferred)
        return later

    async def _start_placed_from_peers(self, root: trio.Nursery, name: str) -> None:
        """``placement:NAME`` from the nearest peer that announces it (bounded wait for the
        announcements), then load it; ModelNotFound naming every source tried when none has it."""
        with trio.move_on_after(PEER_WAIT_S):
            await wait_for_holders(
                lambda: bool(self.placement.materialiser.holders(PLACED_KIND, name)), self.mesh, trio.current_time
            )
        try:
            model = await placed_model(self.placement, name)
        except ModelNotFound as exc:  # once more after the view had time to fill (the signer's record)
            log.info("event=placed_model_retry model=%s reason=%r after_s=%s", name, str(exc), SETTLE_S)
            await trio.sleep(SETTLE_S)
            model = await placed_model(self.placement, name)
        model = self.with_projector(model)
        log.info("event=model_loading model=%s path=%s source=placement_after_join", model.id, model.path)
        self.models.append(model)
        await self.runtime.start_model(root, model)

    async def _start_fetched(self, root: trio.Nursery, ref: str) -> None:
        """Fetch ``ref`` (runtime/fetch/serve_fetch.py: a peer that holds it, else its URL), then load it."""
        try:
            model, source = await fetch_for_serve(self.model_share, ref, self.config.fetch_settings)
        except (DownloadError, BadModelSource) as exc:
            raise ModelNotFound(f"model {ref!r}: {getattr(exc, 'code', 'bad_source')}: {exc}") from None
        model = self.with_projector(model)
        log.info("event=model_loading model=%s path=%s source=%s", model.id, model.path, source)
        self.models.append(model)
        await self.runtime.start_model(root, model)

    def _write_ports(self) -> None:
        assert self.api_server is not None and self.console_server is not None  # built by _bind_listeners
        path = self.home / "run" / "ports.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "api_port": self.api_server.port,
                    "console_port": self.console_server.port,
                    "pid": os.getpid(),
                    "node_id": self.node_id,
                }
            )
        )
        os.replace(tmp, path)

    async def _bind_listeners(self) -> None:
        """Build the two HTTP servers and bind every port the node listens on (served later: the HTTP
        ports by :meth:`_start_services`, the link port once in a mesh, the tunnel data port by the
        runtime); :class:`~hydra_node.listen.PortInUse` names the port and its option."""
        api, console = self._build_servers()
        await api.bind(API_PORT)
        await console.bind(CONSOLE_PORT)
        if self.mesh is not None:
            await self.mesh.bind()
        await self.runtime.bind()

    async def _start_services(self, nursery: trio.Nursery) -> None:
        """Serve the management API and the OpenAI API (bound by :meth:`_bind_listeners`)."""
        for server in (self.console_server, self.api_server):
            if server is not None:
                await nursery.start(server.run)

    def _build_servers(self) -> tuple[HttpServer, HttpServer]:
        """The OpenAI API's and the management API's servers (:attr:`api_server`, :attr:`console_server`)."""
        c = self.config
        # Every API of the inference port, built here: "mesh" (the mixture of agents) answers in each dialect.
        quality = scheduler_quality(self.scheduling, self.node_id)
        moa = MoaApi(MixtureOfAgents(self.router, c.file.moa, quality=quality, own_node=self.node_id))
        # how image URLs are fetched (docs/vision.md)
        images = ImagePolicy(c.file.api.image_fetch_private, c.file.api.image_fetch_timeout_s)
        openai = OpenAIApi(self.router, moa=moa, images=images)
        embeddings, llama = EmbeddingsApi(self.router), LlamaServerApi(openai)
        api = InferencePort(
            [
                ("/v1/responses", ResponsesApi(self.router, moa=moa, images=images).handle),
                ("/v1/embeddings", embeddings.handle),
                (
                    "/v1/messages",
                    MessagesApi(
                        self.router, claude_model=c.file.api.claude_model or None, moa=moa, images=images
                    ).handle,
                ),
                ("/v1", openai.handle),
                # llama-server's paths: the OpenAI routes without /v1, and its own (docs/api.md)
                *((p, openai.handle) for p in ("/models", "/chat/completions", "/completions")),
                ("/embeddings", embeddings.handle),
                *((p, llama.handle) for p in ("/tokenize", "/detokenize", "/infill")),
            ],
            api_key=c.api_key,
            health=self.health,
            on_request=self._count_request,
        )
        mgmt = ManagementApi(
            health=self.health,
            status=self.status,
            routes=self.management_routes,
            headless=c.headless,
            api_key=c.api_key if c.listen_all else None,
            openai=api.handle,
        )
        # Host (DNS rebinding) on loopback listeners, Origin/Content-Type (CSRF) on the management
        # port, CORS on the OpenAI port, the key before any body is read (docs/security.md).
        loopback = not c.listen_all
        self.console_server = HttpServer(
            mgmt.handle,
            c.api_host,
            c.console_port,
            name="console",
            guard=GuardSettings(
                check_host=loopback,
                allowed_hosts=c.file.api.allow_hosts,
                csrf=True,
                api_key=mgmt.api_key,
                public_paths=mgmt.public_paths,
            ),
        )
        self.api_server = HttpServer(
            api.handle,
            c.api_host,
            c.api_port,
            name="api",
            guard=GuardSettings(
                check_host=loopback,
                allowed_hosts=c.file.api.allow_hosts,
                cors_origins=c.file.api.cors_origins,
                api_key=c.api_key,
            ),
            # images as base64 (docs/vision.md); each route keeps its text to TEXT_BODY_BYTES
            limits=HttpLimits(max_body_bytes=INFERENCE_BODY_BYTES),
            on_refused=self._count_request,
        )
        return self.api_server, self.console_server

    async def _watch_signals(self, root_scope: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                if self._stop.is_set():
                    log.warning("event=second_signal action=exit_now")
                    raise KeyboardInterrupt
                log.info("event=signal signal=%s", signal.Signals(signum).name)
                self.request_stop()
                if self.state == NodeState.STARTING:  # nothing to drain yet: stop loading now
                    root_scope.cancel()


async def serve(config: NodeConfig, on_ready: Callable[[Node], None] | None = None) -> None:  # on_ready: cli/banner.py
    node = Node(config)
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        if on_ready is not None:
            on_ready(node)
