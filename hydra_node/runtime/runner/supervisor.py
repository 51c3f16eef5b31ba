"""Supervision of one model runner child process, and the request queue in front of it.

``RunnerSupervisor.run`` (started with ``nursery.start``) spawns the runner through the
node's one child supervisor (:mod:`hydra_node.runtime.supervise`: it dies with the node and
leaves a pid file while it runs), waits for its ``ready`` frame, and restarts it on any exit
with exponential back-off and jitter.  Too many crashes inside a window put it in state
``failed`` (visible in ``/api/status``).  Requests wait in a bounded FIFO queue;
overflow raises :class:`QueueFull` (HTTP 429 with ``Retry-After``).
"""

from __future__ import annotations

import itertools
import logging
import math
import socket
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable, cast

import trio

from hydra_node.backoff import Backoff, CrashLoop
from hydra_node.inference import (
    Finished,
    GenerationError,
    GenerationEvent,
    GenerationRequest,
    MalformedRemoteEvent,
    ModelCaps,
    ModelUnavailable,
    QueueFull,
    TokenizeRequest,
    TokenizeResult,
)
from hydra_node.models import ModelRef
from hydra_node.runtime.runner.argv import runner_argv
from hydra_node.runtime.runner.records import (
    RUNNER_MACHINE,
    RequestStats,
    RequestSummary,
    RunnerCrashed,
    RunnerLoadError,
    RunnerSettings,
    RunnerStalled,
    RunnerState,
    RunnerStatus,
    SplitWorkerLost,
    WorkerLoss,
    death_error,
    exit_how,
    safe_file_part,
)
from hydra_node.runtime.runner.admission import AdmissionLimit
from hydra_node.runtime.runner.embed_call import RunnerEmbeddings
from hydra_node.runtime.runner.kv_call import RunnerKv
from hydra_node.runtime.runner.tokenize_call import RunnerTokenizer
from hydra_node.runtime.child.stats import EngineStatistics
from hydra_node.runtime.child.channel import (
    ChannelError,
    FrameDecoder,
    RunnerProtocolError,
    encode_frame,
    engine_stats_from_wire,
    runner_event_from_wire,
)
from hydra_node.runtime.supervise import (
    ChildExited,
    ChildFailed,
    ChildNotReady,
    ChildOutput,
    ChildSpec,
    ChildSupervisor,
    GiveUp,
)

log = logging.getLogger("hydra.runner")

#: Text deltas buffered per request between the runner reader and the HTTP writer.
DELTA_BUFFER = 256
#: How long a runner told to cancel may stay silent (no frame at all, for any request) before it is
#: killed as stuck: a loaded host's runner that still streams other requests' tokens is busy, not stuck,
#: and one batch step of a long prompt on a loaded 2-core host can itself take several seconds.
CANCEL_ACK_TIMEOUT_S = 15.0
#: The longest a cancel may take to be acknowledged, however busy the runner looks.
CANCEL_ACK_MAX_S = 60.0
#: Grace period between SIGTERM and SIGKILL when stopping a runner.
TERMINATE_GRACE_S = 3.0
#: Lines of runner stderr kept for error messages.
STDERR_TAIL_LINES = 40
#: A runner that stays up this long resets the back-off.
HEALTHY_AFTER_S = 30.0
#: Restart delays are drawn within +-20 % of the back-off.
RESTART_JITTER = 0.2


class RunnerSupervisor:
    """One model, one child process, up to ``parallel`` generations batched in it, a bounded queue."""

    def __init__(
        self,
        model: ModelRef,
        home: Path,
        settings: RunnerSettings,
        node_id: str = "",
        prepare: Callable[[], Awaitable[RunnerSettings]] | None = None,
        on_failed: Callable[[], Awaitable[None]] | None = None,
        lost_worker: Callable[[], Awaitable[WorkerLoss | None]] | None = None,
    ):
        """``prepare``, if given, is awaited before every spawn and returns the settings to
        spawn with (a split model replans its workers there; it may wait, e.g. for workers).
        ``on_failed`` is awaited when a crash loop puts the runner in state failed (a split
        model gives its workers' leases back there).  ``lost_worker`` is awaited when the child
        died or stalled: the RPC worker of its split that was lost, if any (it may wait briefly
        for the signal), so its requests get ``split_worker_lost`` instead of a crash or stall."""
        self.model = model
        self.prepare = prepare
        self.on_failed = on_failed
        self.lost_worker = lost_worker
        self._loss: WorkerLoss | None = None  # the current child lost a split worker (lost_worker said so)
        self.resumed = 0  # generations started here with resume tokens (continuations of another part)
        self.home = home
        self.settings = settings
        self.node_id = node_id
        self._state = RunnerState.STARTING
        self.on_state: Callable[[RunnerSupervisor, RunnerState], None] | None = None  # (self, old state)
        self.info: dict = {}
        self.stats = RequestStats()
        self.speculative: dict | None = None  # the runner's latest speculation figures (its done frames)
        self.engine_stats: EngineStatistics | None = None  # the runner's latest stats frame (this child's)
        self.stats_rejected = 0  # malformed stats frames dropped (the child's bug; logged)
        self._waiting = 0
        self._in_flight = 0
        self._last_frame_at = 0.0  # trio time of the child's last frame (a cancel waits while it talks)
        self._exit_code: int | None = None  # the current child's exit status, once its channel closed
        self._we_killed = False  # this node killed the current child (stalled, stuck)
        self._slot = AdmissionLimit(settings.parallel)  # FIFO-fair; the child's ready frame resizes it
        self._ids = itertools.count(1)
        self._pending: dict[int, trio.MemorySendChannel] = {}
        self._send_lock = trio.Lock()
        self._sock: trio.SocketStream | None = None
        self._decoder = FrameDecoder()
        self._ready = trio.Event()
        self.embeddings = RunnerEmbeddings(self)  # .embed(req): runner/embed_call.py
        self.kv = RunnerKv(self)  # .export(req, dest) / .import_state(path): runner/kv_call.py
        self.tokenizer = RunnerTokenizer(self)  # .tokenize(req): runner/tokenize_call.py
        #: What the model can do, from the latest ready message (None before the first, or from a
        #: runner that sent none or a malformed one: logged). The file decides it, so it is kept
        #: across restarts until the next ready message says otherwise.
        self.caps: ModelCaps | None = None
        self.pidfile = home / "run" / f"runner-{safe_file_part(model.id)}.pid"
        self.logfile = home / "logs" / f"runner-{safe_file_part(model.id)}.log"
        self._output = ChildOutput(self.logfile, tail_lines=STDERR_TAIL_LINES)
        self._stderr_tail = self._output.lines
        self._child = ChildSupervisor(
            f"model runner {model.id!r}",
            self._spec,
            backoff=Backoff(
                initial_s=settings.backoff_initial_s,
                factor=2.0,
                max_s=settings.backoff_max_s,
                jitter=RESTART_JITTER,
                reset_after_s=HEALTHY_AFTER_S,
            ),
            crash_loop=CrashLoop(settings.crash_loop_restarts, settings.crash_loop_window_s),
            fatal_first_start=True,
            on_ready=self._on_ready,
        )

    # ---- state (hosts set it too: "placing" while a split waits for workers, "failed") ----
    @property
    def state(self) -> RunnerState:
        return self._state

    @state.setter
    def state(self, value: RunnerState) -> None:
        """Move to ``value`` (the same state: nothing happens); a move not in ``RUNNER_TRANSITIONS``
        raises InvalidTransition."""
        old = self._state
        if value == old:
            return
        self._state = RUNNER_MACHINE.next(old, value)
        if self.on_state is not None:
            self.on_state(self, old)

    @property
    def restarts(self) -> int:
        return self._child.restarts

    @property
    def pid(self) -> int | None:
        return self._child.pid

    @property
    def last_error(self) -> str | None:
        return self._child.last_error

    @last_error.setter
    def last_error(self, value: str | None) -> None:
        self._child.last_error = value

    # ---- status -------------------------------------------------------------------
    @property
    def queue_depth(self) -> int:
        return self._waiting

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def slots(self) -> int:
        """Sequences this runner decodes together (its engine's ``parallel``, once ready)."""
        return self._slot.capacity

    @property
    def free_slots(self) -> int | None:
        """Sequences this runner could start now (its ``parallel`` minus those admitted; exact, as the
        node admits every generation); None unless ready.  Announced to the mesh per model."""
        if self.state is not RunnerState.READY:
            return None
        return max(0, self._slot.capacity - self._slot.used)

    def status(self) -> RunnerStatus:
        return RunnerStatus(
            id=self.model.id,
            path=str(self.model.path),
            state=self.state,
            pid=self.pid,
            restarts=self.restarts,
            last_error=self.last_error,
            queue_depth=self._waiting,
            queue_capacity=self.settings.queue_size,
            in_flight=self._in_flight,
            n_ctx=self.info.get("n_ctx"),
            size_bytes=self.model.size_bytes,
            requests=RequestSummary.of(self.stats),
            speculative=self.speculative,
            llama=self.info.get("llama"),
            engine=self.info.get("engine"),
            engine_stats=self.engine_stats,
            caps=self.caps,
            mmproj=None if self.model.mmproj is None else str(self.model.mmproj),
        )

    async def tokenize(self, req: TokenizeRequest) -> TokenizeResult:
        """Tokenize or detokenize with this runner's model (runner/tokenize_call.py)."""
        return await self.tokenizer.tokenize(req)

    async def wait_ready(self) -> None:
        await self._ready.wait()

    # ---- supervision --------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the child until cancelled.  Reports started once the first load succeeded.

        If the very first load fails, raises :class:`RunnerLoadError` so ``serve``
        exits with the reason instead of running without its model.
        """
        try:
            while True:
                try:
                    await self._child.run(task_status=task_status)
                except ChildFailed as exc:
                    if exc.reason is not GiveUp.CRASH_LOOP:  # the first load (or the spawn) failed
                        raise RunnerLoadError(exc.last_error) from None
                    await self._failed(exc)
                    task_status = trio.TASK_STATUS_IGNORED  # readiness was reported by the first life
        finally:
            self.state = RunnerState.STOPPED

    async def _failed(self, exc: ChildFailed) -> None:
        """A crash loop: state failed (requests get 503), then, after ``failed_retry_s``, try again."""
        self.state = RunnerState.FAILED
        retry = self.settings.failed_retry_s
        log.error(
            "event=runner_failed model=%s reason=crash_loop crashes=%d window_s=%s retry_in_s=%s last_error=%r",
            self.model.id,
            exc.failures,
            self.settings.crash_loop_window_s,
            retry if retry > 0 else "never",
            self.last_error,
        )
        if self.on_failed is not None:
            await self.on_failed()
        if retry <= 0:
            await trio.sleep_forever()
        await trio.sleep(retry)
        log.info("event=runner_retry model=%s after_s=%s", self.model.id, retry)
        if self._child.crash_loop is not None:
            self._child.crash_loop.reset()
        self.state = RunnerState.LOADING

    async def _spec(self) -> ChildSpec:
        """Before every spawn: the settings (``prepare``), the channel, the argv."""
        if self.prepare is not None:
            try:
                self.settings = await self.prepare()
            except RunnerLoadError as exc:
                raise ChildNotReady(str(exc)) from None
        self.state = RunnerState.LOADING
        self._ready = trio.Event()
        self._decoder = FrameDecoder()
        self.engine_stats = None  # a new child: the old one's figures no longer describe anything
        self._exit_code, self._we_killed, self._loss = None, False, None
        parent_sock, child_sock = socket.socketpair()
        self._sock = trio.SocketStream(trio.socket.from_stdlib_socket(parent_sock))
        return ChildSpec(
            self._argv(child_sock.fileno()),
            ready=self._await_ready,
            kind="runner",
            output=self._output,
            handover=(child_sock,),
            pidfile=self.pidfile,
            watch=self._watch,
            on_exit=self._gone,
            grace_s=TERMINATE_GRACE_S,
        )

    def _argv(self, fd: int) -> list[str]:
        return runner_argv(self.settings, self.model, fd, self.home)

    async def _await_ready(self, proc) -> dict:
        """The readiness reader: the runner's first frame must be ``ready``."""
        try:
            with trio.fail_after(self.settings.load_timeout_s):
                msg = await self._recv(self._decoder, proc)
        except trio.TooSlowError:
            raise ChildNotReady(
                f"model {self.model.id!r} did not load within {self.settings.load_timeout_s:.0f} s"
            ) from None
        except ChildExited as exc:
            raise ChildNotReady(f"model {self.model.id!r} failed to load: {exc}") from None
        if msg["op"] == "fatal":
            raise ChildNotReady(f"model {self.model.id!r} failed to load: {msg.get('message')}")
        if msg["op"] != "ready":
            raise ChildNotReady(f"runner sent {msg['op']!r} before ready")
        return msg

    def _on_ready(self, msg: dict) -> None:
        self.info = msg
        try:
            self.caps = ModelCaps.from_wire(msg.get("caps", {}))
        except MalformedRemoteEvent as exc:  # the child's bug: the model is served, its extras are not
            self.caps = None
            log.warning("event=runner_caps_rejected model=%s reason=%r", self.model.id, str(exc))
        engine = msg.get("engine")
        self._slot.resize(
            engine["parallel"]
            if isinstance(engine, dict) and isinstance(engine.get("parallel"), int) and engine["parallel"] >= 1
            else 1
        )
        self.state = RunnerState.READY
        self._ready.set()
        log.info(
            "event=runner_ready model=%s pid=%s load_s=%.2f n_ctx=%s",
            self.model.id,
            self.pid,
            msg.get("load_s", 0),
            msg.get("n_ctx"),
        )
        gpu = (msg.get("llama") or {}).get("gpu_layers") or {}
        if gpu.get("note"):  # gpu_layers asked for, but llama.cpp has no GPU to put them on
            log.warning(
                "event=gpu_layers_ignored model=%s requested=%s note=%r",
                self.model.id,
                gpu.get("requested"),
                gpu["note"],
            )

    async def _watch(self, proc, _ready: dict) -> None:
        await self._read_loop(self._decoder, proc)

    def _gone(self) -> None:
        """The child is gone: fail what was waiting on it, close our end of the channel."""
        if self.state is not RunnerState.FAILED:
            self.state = RunnerState.RESTARTING
        self._fail_pending(self._death())
        if self._sock is not None:
            self._sock.socket.close()
            self._sock = None

    async def _recv(self, decoder: FrameDecoder, proc) -> dict:
        while True:
            try:
                msg = decoder.next_message()
            except ChannelError as exc:
                raise ChildExited(f"runner sent a bad frame: {exc}") from None
            if msg is not None:
                self._last_frame_at = trio.current_time()
                return msg
            assert self._sock is not None  # set while the child runs (_gone clears it after)
            try:
                data = await self._sock.receive_some(65536)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                with trio.move_on_after(2):
                    await proc.wait()
                tail = " | ".join(list(self._stderr_tail)[-5:])
                code = self._exit_code = proc.returncode
                await self._note_loss()
                how = exit_how(code)
                if self._loss is not None:
                    how += f"; lost its RPC worker on peer {self._loss.peer[:16]}: {self._loss.reason}"
                raise ChildExited(f"runner exited ({how}){': ' + tail if tail else ''}")
            decoder.receive_data(data)

    async def _read_loop(self, decoder: FrameDecoder, proc) -> None:
        while True:
            msg = await self._recv(decoder, proc)
            if msg["op"] == "stats":
                self._take_stats(msg)
                continue
            rid = cast(int, msg.get("id"))  # our request's id (None for a pong: it finds nothing)
            ch = self._pending.get(rid)
            if ch is None:
                continue  # pong, or a late frame for a request already given up
            try:
                await ch.send(msg)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._pending.pop(rid, None)

    def _take_stats(self, msg: dict) -> None:
        """A stats frame: kept if well-formed; a malformed one is the child's bug, logged and dropped
        (it answers no request, and the figures are not worth a restart)."""
        try:
            self.engine_stats = engine_stats_from_wire(msg)
        except RunnerProtocolError as exc:
            self.stats_rejected += 1
            log.warning("event=runner_stats_rejected model=%s pid=%s reason=%r", self.model.id, self.pid, str(exc))

    def _death(self) -> GenerationError:
        """What the requests of a child that died get (:func:`~.records.death_error`):
        ``split_worker_lost`` when its split lost a worker, ``runner_killed`` (not poisonous) for a
        SIGKILL this node did not send, else ``runner_crashed`` (the request may be the cause)."""
        return death_error(self.model.id, self._exit_code, we_killed=self._we_killed, loss=self._loss)

    def _fail_pending(self, err: GenerationError) -> None:
        for rid, ch in list(self._pending.items()):
            try:
                ch.send_nowait({"op": "error", "id": rid, **err.to_wire()})
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            ch.close()
        self._pending.clear()

    async def _send(self, msg: dict) -> None:
        """Send one frame. A message that cannot be encoded is the caller's error (400), sent as
        nothing; a frame is written whole or not at all (a cancelled caller never leaves half a
        frame that would break the channel for every other request)."""
        if self._sock is None:
            raise ModelUnavailable(f"model {self.model.id!r} runner is not running")
        try:
            frame = encode_frame(msg)
        except Exception as exc:  # the codec's EncodeError, UnicodeEncodeError, ...: nothing was sent
            raise GenerationError(
                f"the request cannot be sent to the model runner: {exc}", code="unencodable_request", status=400
            ) from None
        async with self._send_lock:
            try:
                with trio.CancelScope(shield=True):
                    await self._sock.send_all(frame)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise RunnerCrashed(f"lost the runner channel: {exc}") from None

    # ---- requests -----------------------------------------------------------------
    def _check_available(self) -> None:
        if self.state == "failed":
            raise ModelUnavailable(
                f"model {self.model.id!r} is in state failed (crash loop): {self.last_error}", retryable=True
            )
        if self.state != "ready":
            raise ModelUnavailable(f"model {self.model.id!r} is {self.state}; try again shortly")

    @asynccontextmanager
    async def generate(self, req: GenerationRequest) -> AsyncIterator[AsyncIterator[GenerationEvent]]:
        self._check_available()
        if self._waiting >= self.settings.queue_size:
            raise QueueFull(self.model.id, retry_after=max(1.0, math.ceil(self.stats.ttft_ms / 1000 + 1)))
        t0 = trio.current_time()
        self._waiting += 1
        try:
            await self._slot.acquire()
        finally:
            self._waiting -= 1
        rid = next(self._ids)
        send_ch, recv_ch = trio.open_memory_channel(DELTA_BUFFER)
        terminal = False
        self._in_flight += 1
        try:
            self._check_available()
            self._pending[rid] = send_ch
            try:
                await self._send({"op": "generate", "id": rid, "req": req.to_wire()})
            except GenerationError:
                terminal = True  # the child never saw this request: nothing to cancel there
                raise
            if req.resume_tokens:
                self.resumed += 1
            queue_wait_ms = (trio.current_time() - t0) * 1000

            async def next_message() -> dict | None:
                stall = self.settings.stall_timeout_s
                if stall <= 0:
                    try:
                        return await recv_ch.receive()
                    except trio.EndOfChannel:
                        return None
                with trio.move_on_after(stall):
                    try:
                        return await recv_ch.receive()
                    except trio.EndOfChannel:
                        return None
                await self._note_loss()
                self._kill_stalled(stall)
                if self._loss is not None:
                    raise SplitWorkerLost(self.model.id, self._loss, how=f"produced nothing for {stall:.0f} s")
                raise RunnerStalled(
                    f"model runner for {self.model.id!r} produced nothing for {stall:.0f} s "
                    f"(a stalled RPC worker or tunnel); the runner was restarted"
                )

            async def events() -> AsyncIterator[GenerationEvent]:
                nonlocal terminal
                while (msg := await next_message()) is not None:
                    try:  # typed: a delta, a finished event, or the runner's (or a malformed answer's) error
                        ev = runner_event_from_wire(msg, queue_wait_ms=queue_wait_ms, served_by=self.node_id)
                    except GenerationError:
                        terminal = True
                        self.stats.failed += 1
                        raise
                    if isinstance(ev, Finished):
                        terminal = True
                        self.stats.observe(ev)
                        if isinstance(msg.get("speculative"), dict):
                            self.speculative = msg["speculative"]
                        yield ev
                        return
                    yield ev
                terminal = True
                raise self._death()

            yield events()
        except (RunnerStalled, SplitWorkerLost):
            terminal = True
            self.stats.failed += 1
            raise
        finally:
            try:
                if not terminal and rid in self._pending:
                    await self._cancel_and_wait(rid, recv_ch)
            finally:
                self._in_flight -= 1
                self._pending.pop(rid, None)
                send_ch.close()
                self._slot.release()

    def restart(self, reason: str) -> bool:
        """Kill the current child now, because it cannot go on (its split lost a worker); supervision
        restarts it (its ``prepare`` replans).  False when no child is running."""
        if self.pid is None:
            return False
        if not self._child.kill():
            return False
        self._we_killed = True  # the exit is read later, by the reader task
        log.warning("event=runner_restart model=%s pid=%s reason=%r", self.model.id, self.pid, reason)
        self.last_error = reason
        return True

    async def _note_loss(self) -> None:
        """Ask the host whether a worker of this split was lost (once per death: the ``lost_worker`` hook)."""
        if self.lost_worker is not None and self._loss is None:
            self._loss = await self.lost_worker()

    def _kill_stalled(self, stall: float) -> None:
        """The runner is stuck (no RPC timeouts in llama.cpp): kill it; supervision restarts it."""
        log.error("event=runner_stalled model=%s pid=%s stall_s=%.1f action=kill", self.model.id, self.pid, stall)
        self.last_error = f"stalled: no output for {stall:.0f} s"
        self._we_killed = True
        self._child.kill()

    async def _cancel_and_wait(self, rid: int, recv_ch: trio.MemoryReceiveChannel) -> None:
        """Tell the child to stop ``rid`` and wait until it has, so the slot is really free; killed as stuck
        after ``CANCEL_ACK_TIMEOUT_S`` without any frame from it, or ``CANCEL_ACK_MAX_S`` in all."""
        with trio.CancelScope(shield=True):
            start = trio.current_time()
            try:
                await self._send({"op": "cancel", "id": rid})
            except GenerationError:
                return
            while True:
                heard = max(start, self._last_frame_at)
                deadline = min(heard + CANCEL_ACK_TIMEOUT_S, start + CANCEL_ACK_MAX_S)
                with trio.move_on_at(deadline):
                    async for msg in recv_ch:
                        if msg["op"] in ("done", "error"):
                            self.stats.cancelled += 1
                            return
                    return  # the channel closed: the runner is gone already
                if deadline >= start + CANCEL_ACK_MAX_S or self._last_frame_at <= heard:  # silent all along: stuck
                    break
            if self.pid:
                log.error(
                    "event=runner_stuck model=%s pid=%s waited_s=%.1f action=kill",
                    self.model.id,
                    self.pid,
                    trio.current_time() - start,
                )
                self._we_killed = True
                self._child.kill()
