"""Growing back: host a model again when the mesh has fewer live hosts of it than wanted (trio layer).

Every :data:`REHOST_TICK_S` the service builds the election's view from the mesh (the members'
announcements and states, and this node's own), runs the pure planner
(:mod:`hydra_node.runtime.hosting.rehost_plan`) and acts on its decision for this node:

* **claim**: announce ``extra.rehosting`` at once (others count it as a host), then resolve the
  model to a file (the bundled id: the bundled file; else the model cache by sha256, then by id;
  else a verified fetch from a peer that holds it, only when its sha256 is known), check the
  file's sha256 and identity against the wanted ones when known, load it
  (:meth:`ModelRuntime.load`) and wait until it is ready. A failure (no verifiable file, fetch,
  load, identity mismatch) unloads it, drops the claim and announces ``extra.rehost_failed`` with a
  back-off (30 s doubling to 10 min): the next candidate is elected meanwhile.
* **release**: our claim lost a race, or the hosts came back: drop the claim and unload it.

Events on ``/api/events``: ``model.rehosting`` {model, reason, rank, candidates},
``model.rehosted`` {model, load_s, fetch_bytes}, ``model.rehost_failed`` {model, error,
retry_after_s}, ``model.rehost_released`` {model}. Announced (``announce_extra``): ``spare``,
``standby``, ``keep_hosted``, ``model_files``, ``rehosting``, ``rehost_failed``
(protocol/README.md "Re-hosting"). ``/api/status`` ``rehost``: :meth:`RehostService.status`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from hydra_node.eventlog import EmitFn
from hydra_node.models import ModelRef
from hydra_node.runtime.artifacts.kv_identity import FileDigests, model_ident
from hydra_node.runtime.fetch import DownloadError, ModelShare, RemoteModel
from hydra_node.runtime.fetch.peer_wire import held_from_extra
from hydra_node.runtime.hosting.rehost_plan import (
    HOSTING_STATES,
    Action,
    Decision,
    MemberView,
    RehostPlanner,
    merge_wanted,
    own_wishes,
)
from hydra_node.runtime.hosting.rehost_wire import (
    MAX_KEEP_HOSTED,
    ModelFile,
    Spare,
    Wanted,
    parse_rehost_extra,
    rehost_extra,
)
from hydra_node.runtime.hosting.service import ModelConflict, ModelRuntime, TooManyModels
from hydra_node.runtime.peers import PeerView
from hydra_node.runtime.runner.records import RunnerState

__all__ = ["REHOST_TICK_S", "RehostService", "RehostSettings", "RehostStatus", "spare_bytes"]

log = logging.getLogger("hydra.rehost")

#: How often the election runs.
REHOST_TICK_S = 1.0
#: Back-off after a failed re-host of a model: doubling from the first to the last.
BACKOFF_FIRST_S = 30.0
BACKOFF_MAX_S = 600.0
#: How long a re-hosted model may take to become ready.
READY_TIMEOUT_S = 300.0
#: Announced ``spare.free_bytes`` moves only when the real figure moved by more than this share of
#: it (or a model came or went): free memory changes all the time, and a changed ``extra`` is a new
#: announcement.
SPARE_HYSTERESIS = 0.125


@dataclass(frozen=True)
class RehostSettings:
    node_id: str
    enabled: bool = True
    standby: bool = False
    min_hosts: Mapping[str, int] = field(default_factory=dict)
    keep_recent_s: float = 600.0
    settle_s: float = 3.0
    max_models: int = 2
    #: this node offers room at all (False for a client, or a node without a model runtime)
    offers: bool = True


@dataclass(frozen=True)
class WantedRow:
    model: str
    min_hosts: int
    live_hosts: int
    reason: str  # "min_hosts" (someone's config) or "recent" (the recent-use policy)
    short_for_s: float | None


@dataclass(frozen=True)
class RehostStatus:
    """``/api/status`` ``rehost``."""

    enabled: bool
    standby: bool
    spare: Mapping[str, int] | None
    wanted: tuple[WantedRow, ...]
    claims: tuple[str, ...]
    backoff: Mapping[str, float]
    last: Mapping[str, Any] | None
    counters: Mapping[str, int]


def spare_bytes(previous: int | None, now: int) -> int:
    """The ``spare.free_bytes`` to announce: ``previous`` unless ``now`` moved away from it by more
    than :data:`SPARE_HYSTERESIS` of it."""
    if previous is None or abs(now - previous) > SPARE_HYSTERESIS * max(previous, 1):
        return now
    return previous


class RehostService:
    """See the module docstring."""

    def __init__(
        self,
        settings: RehostSettings,
        *,
        runtime: ModelRuntime,
        mesh: PeerView | None,
        share: ModelShare,
        digests: FileDigests,
        bundled: tuple[str, Callable[[], Path]],
        on_event: EmitFn | None = None,
        wall: Callable[[], float] = time.time,
        projector: Callable[[str], Path | None] = lambda _model: None,
    ) -> None:
        """``bundled``: the bundled model's id and a callable giving its file. ``digests``:
        the file-digest table the model identities keep (routing/identity.py, shared): a file hashed
        there is not hashed again. ``projector``: the projector GGUF this node pairs with a model id
        (``serve --mmproj``), so a model re-hosted here keeps its images (docs/vision.md)."""
        self.settings = settings
        self.runtime = runtime
        self.mesh = mesh
        self.share = share
        self._digests = digests
        self.bundled_id, self._bundled_path = bundled
        self._emit = on_event or (lambda _t, _f: None)
        self._wall = wall
        self._projector = projector
        self.min_hosts: dict[str, int] = dict(settings.min_hosts)
        self.planner = RehostPlanner(settings.node_id, settle_s=settings.settle_s, bundled_id=self.bundled_id)
        self.claims: dict[str, str] = {}  # model → "loading" | "hosted"
        self._members: list[MemberView] = []  # the view the last tick elected from
        self.failed: dict[str, float] = {}  # model → retry after (unix s)
        self._failures: dict[str, int] = {}
        self._recent: dict[str, float] = {}  # model → last requested through our API (unix s)
        self._known: dict[str, Wanted] = {}  # model → the last ident / sha256 / size seen of it
        self._files: dict[Path, tuple[str, int]] = {}  # our hosted files → (sha256, size)
        self._seen_anns: dict[str, tuple[int, int]] = {}
        self._spare: int | None = None
        self._decisions: list[Decision] = []
        self._wanted: dict[str, Wanted] = {}
        self._reasons: dict[str, str] = {}
        self.last: dict[str, Any] | None = None
        self.counters = {"malformed_extras": 0, "rehosting": 0, "rehosted": 0, "failed": 0, "released": 0}

    # ---- inputs ------------------------------------------------------------------------
    def observe_request(self, obs: Any) -> None:
        """A finished attempt routed by this node (routing/live.py ``RequestObservation``)."""
        self._recent[obs.target.model] = self._wall()

    def set_min_hosts(self, model: str, n: int) -> None:
        """``[rehost].min_hosts`` of ``model`` on the running node (0: never re-host it)."""
        self.min_hosts[model] = n

    # ---- what we announce ----------------------------------------------------------------
    def own_wanted(self) -> dict[str, Wanted]:
        """What this node asks the mesh to keep hosted: its ``min_hosts`` (above 0), then the models
        requested through its API within ``keep_recent_s``, the most recent first."""
        now = self._wall()
        wishes = own_wishes(
            self.min_hosts, self._recent, now_unix=now, keep_recent_s=self.settings.keep_recent_s, limit=MAX_KEEP_HOSTED
        )
        self._recent = {m: t for m, t in self._recent.items() if t >= now - self.settings.keep_recent_s}
        self._reasons = {m: reason for m, (_, reason) in wishes.items()}
        return {m: self._fill(Wanted(m, n)) for m, (n, _) in wishes.items()}

    def _own_files(self) -> list[ModelFile]:
        out = []
        for mid, runner in list(self.runtime.runners.items()):
            known = self._files.get(Path(runner.model.path))
            if known is not None:
                out.append(ModelFile(mid, known[0], known[1]))
        return out

    def _own_spare(self) -> Spare | None:
        if not (self.settings.enabled and self.settings.offers):
            return None
        free = spare_bytes(self._spare, self.runtime.host_free_bytes())
        self._spare = free
        return Spare(free, max(0, self.settings.max_models - len(self.claims)))

    def announce_extra(self) -> dict[str, Any]:
        """Our announcement's re-host keys (rehost_wire.py)."""
        now = self._wall()
        self.failed = {m: t for m, t in self.failed.items() if t > now}
        return rehost_extra(
            spare=self._own_spare(),
            standby=self.settings.standby and self.settings.enabled,
            keep=list(self.own_wanted().values()),
            files=self._own_files(),
            claims=sorted(self.claims),
            failed=self.failed,
        )

    # ---- the view ------------------------------------------------------------------------
    def _own_view(self) -> MemberView:
        hosting = frozenset(mid for mid, r in self.runtime.runners.items() if str(r.state) in HOSTING_STATES)
        for f in self._own_files():  # what we host is what our keep_hosted entries describe
            self._learn(Wanted(f.model, 0, ident=model_ident(f.sha256), sha256=f.sha256, size_bytes=f.size_bytes))
        extra = self.announce_extra()
        return MemberView(
            self.settings.node_id,
            role="host" if self.settings.offers else "client",
            hosting=hosting | frozenset(m for m, s in self.claims.items() if s == "loading"),
            held=frozenset(held_from_extra(self.share.announce_extra()))
            | frozenset(sha for sha, _ in self._files.values()),
            rehost=parse_rehost_extra(extra),
        )

    def view(self) -> list[MemberView]:
        """The election's input: every member the mesh knows (alive or not), and this node."""
        out = [self._own_view()]
        mesh = self.mesh
        if mesh is None:
            return out
        states = mesh.member_states(trio.current_time())
        for peer_id, ann in mesh.members().items():
            extra = dict(ann.extra)
            rh = parse_rehost_extra(extra)
            if rh.malformed and self._seen_anns.get(peer_id) != (ann.incarnation, ann.seq):
                self.counters["malformed_extras"] += rh.malformed
            self._seen_anns[peer_id] = (ann.incarnation, ann.seq)
            held = held_from_extra(extra)
            for entry in ann.models:
                if entry.ident:
                    self._learn(Wanted(entry.id, 0, ident=entry.ident))
            for f in rh.files:
                self._learn(Wanted(f.model, 0, sha256=f.sha256, size_bytes=f.size_bytes))
            out.append(
                MemberView(
                    peer_id,
                    role=ann.role,
                    alive=states.get(peer_id) == "alive",
                    hosting=frozenset(e.id for e in ann.models if e.state in HOSTING_STATES),
                    held=frozenset(held) | frozenset(held.values()),
                    rehost=rh,
                )
            )
        return out

    def _learn(self, w: Wanted) -> None:
        had = self._known.get(w.model, Wanted(w.model, 0))
        self._known[w.model] = Wanted(
            w.model, 0, w.ident or had.ident, w.sha256 or had.sha256, w.size_bytes or had.size_bytes
        )

    # ---- the loop --------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[RehostService] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            task_status.started(self)
            while True:
                await self._hash_own_files()
                self.tick(nursery)
                await trio.sleep(REHOST_TICK_S)

    def tick(self, nursery: trio.Nursery) -> list[Decision]:
        """One election: start the claims and releases it decides for this node."""
        self._check_claims(nursery)
        members = self._members = self.view()
        wanted = {m: self._fill(w) for m, w in merge_wanted(members, self.own_wanted()).items()}
        self._wanted = wanted
        refuse = frozenset(m for m, n in self.min_hosts.items() if n == 0)
        if not (self.settings.enabled and self.settings.offers):
            refuse = frozenset(wanted) | refuse
        decisions = self.planner.step(members, wanted, now=trio.current_time(), now_unix=self._wall(), refuse=refuse)
        self._decisions = decisions
        for d in decisions:
            if d.action is Action.CLAIM and d.model not in self.claims:
                self.claims[d.model] = "loading"
                self.counters["rehosting"] += 1
                reason = self._reason_of(d.model)
                fields = {"model": d.model, "reason": reason, "rank": d.rank, "candidates": list(d.candidates)}
                log.info("event=model_rehosting model=%s reason=%s rank=%s", d.model, reason, d.rank)
                self._emit("model.rehosting", {**fields, "node_id": self.settings.node_id})
                nursery.start_soon(self._rehost, wanted.get(d.model, Wanted(d.model, 1)))
            elif d.action is Action.RELEASE and self.claims.get(d.model) == "hosted":
                nursery.start_soon(self._release, d.model)
        return decisions

    def _fill(self, w: Wanted) -> Wanted:
        """``w`` with what we saw of its file where its announcer knew nothing."""
        k = self._known.get(w.model)
        return w if k is None else w.filled(k)

    def _check_claims(self, nursery: trio.Nursery) -> None:
        """A model we re-hosted whose runner failed (or went) is a failed re-host: it holds no slot."""
        for model, st in list(self.claims.items()):
            runner = self.runtime.runners.get(model)
            if st == "hosted" and (runner is None or runner.state == RunnerState.FAILED):
                self._failed(model, "the re-hosted runner failed" if runner is not None else "it was unloaded")
                if runner is not None:
                    nursery.start_soon(self._unload_quietly, model)

    def _reason_of(self, model: str) -> str:
        """Why ``model`` is wanted: this node's ``min_hosts``, its recent use, else a peer's wish."""
        return "min_hosts" if self.min_hosts.get(model, 0) > 0 else self._reasons.get(model, "min_hosts")

    async def _hash_own_files(self) -> None:
        """sha256 and size of our hosted files, from the identities' digest table (hashed once)."""
        for runner in list(self.runtime.runners.values()):
            path = Path(runner.model.path)
            if path in self._files or runner.state != RunnerState.READY:
                continue
            try:
                self._files[path] = await trio.to_thread.run_sync(self._digest, path)
            except OSError as exc:
                log.warning("event=rehost_digest_failed path=%s error=%r", path, str(exc))

    def _digest(self, path: Path) -> tuple[str, int]:
        """Blocking: the file's sha256 (from the table the model identities keep, when it is there) and size."""
        return self._digests.sha256(path), path.stat().st_size

    # ---- acting ------------------------------------------------------------------------------
    async def _rehost(self, want: Wanted) -> None:
        model = want.model
        started = trio.current_time()
        fetched = 0
        try:
            path, fetched, verified = await self._resolve(want)
            if verified is None:  # the bundled file: its digest from the identities' table (hashed once)
                sha, size = await trio.to_thread.run_sync(self._digest, path)
            else:  # a cache record: verified when it was stored
                sha, size = verified, path.stat().st_size
            if want.sha256 and sha != want.sha256:
                raise RehostFailed(
                    f"the file found for {model} has sha256 {sha[:16]}…, the mesh's has {want.sha256[:16]}…"
                )
            if want.ident and model_ident(sha) != want.ident:
                raise RehostFailed(
                    f"the file found for {model} has identity {model_ident(sha)}, the mesh's is {want.ident}"
                )
            self._files[path] = (sha, size)
            await self.runtime.load(ModelRef(model, path, self._projector(model)))
            state = await self.runtime.wait_ready(model, READY_TIMEOUT_S)
            if state != RunnerState.READY:
                await self._unload_quietly(model)
                raise RehostFailed(f"{model} did not become ready (state {state})")
        except (RehostFailed, DownloadError, ModelConflict, TooManyModels, OSError) as exc:
            self._failed(model, str(getattr(exc, "message", None) or exc))
            return
        except Exception as exc:  # any other load failure is this model's back-off, never the node's end
            log.exception("event=model_rehost_error model=%s", model)
            await self._unload_quietly(model)
            self._failed(model, f"{type(exc).__name__}: {exc}")
            return
        if self.claims.get(model) is None:  # released while it loaded
            await self._unload_quietly(model)
            return
        self.claims[model] = "hosted"
        self._failures.pop(model, None)
        load_s = round(trio.current_time() - started, 2)
        self.counters["rehosted"] += 1
        self.last = {
            "model": model,
            "outcome": "rehosted",
            "load_s": load_s,
            "fetch_bytes": fetched,
            "at": self._wall(),
        }
        log.info("event=model_rehosted model=%s load_s=%s fetch_bytes=%d", model, load_s, fetched)
        self._emit(
            "model.rehosted",
            {"model": model, "load_s": load_s, "fetch_bytes": fetched, "node_id": self.settings.node_id},
        )

    async def _resolve(self, want: Wanted) -> tuple[Path, int, str | None]:
        """The file to load for ``want``, the bytes fetched for it (0: it was here) and its sha256
        when the model cache verified it (None: the bundled file, not recorded there)."""
        if want.model == self.bundled_id:
            return self._bundled_path(), 0, None
        cache = self.share.cache
        rec = (cache.by_sha256(want.sha256) if want.sha256 else None) or cache.lookup(want.model)
        if rec is not None and (not want.sha256 or rec.sha256 == want.sha256):
            return rec.path(cache.root), 0, rec.sha256
        if not want.sha256:
            raise RehostFailed(
                f"{want.model} is not here, and no host announced its sha256: no file to verify a fetch against"
            )
        remote = RemoteModel(
            want.model,
            (),
            f"{want.sha256[:16]}.gguf",
            size_bytes=want.size_bytes or None,
            sha256=want.sha256,
            sha256_origin="mesh",
        )
        rec = await self.share.fetch(remote)
        return rec.path(cache.root), rec.size_bytes, rec.sha256

    def _failed(self, model: str, error: str) -> None:
        n = self._failures.get(model, 0)
        self._failures[model] = n + 1
        back_off = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * (2**n))
        self.failed[model] = self._wall() + back_off
        self.claims.pop(model, None)
        self.counters["failed"] += 1
        self.last = {"model": model, "outcome": "failed", "error": error[:300], "at": self._wall()}
        log.warning("event=model_rehost_failed model=%s error=%r retry_after_s=%s", model, error, back_off)
        self._emit(
            "model.rehost_failed",
            {"model": model, "error": error[:300], "retry_after_s": back_off, "node_id": self.settings.node_id},
        )

    async def _release(self, model: str) -> None:
        self.claims.pop(model, None)
        self.counters["released"] += 1
        self.last = {"model": model, "outcome": "released", "at": self._wall()}
        log.info("event=model_rehost_released model=%s", model)
        self._emit("model.rehost_released", {"model": model, "node_id": self.settings.node_id})
        await self._unload_quietly(model)

    async def _unload_quietly(self, model: str) -> None:
        if model in self.runtime.hosted:
            await self.runtime.unload(model)

    # ---- status ---------------------------------------------------------------------------------
    def status(self) -> RehostStatus:
        now = trio.current_time()
        live: dict[str, int] = {}
        for m in self._members:  # the last election's view (a status read changes nothing)
            if m.alive:
                for model in m.hosting | m.rehost.claims:
                    live[model] = live.get(model, 0) + 1
        rows = tuple(
            WantedRow(
                w.model,
                w.min_hosts,
                live.get(w.model, 0),
                self._reason_of(w.model),
                None if (s := self.planner.short_for(w.model, now)) is None else round(s, 1),
            )
            for w in sorted(self._wanted.values(), key=lambda w: w.model)
        )
        spare = self._own_spare()
        return RehostStatus(
            enabled=self.settings.enabled,
            standby=self.settings.standby,
            spare=None if spare is None else {"free_bytes": spare.free_bytes, "models": spare.models},
            wanted=rows,
            claims=tuple(sorted(self.claims)),
            backoff=dict(self.failed),
            last=self.last,
            counters=dict(self.counters),
        )


class RehostFailed(Exception):
    """A re-host could not go on (the message says why)."""
