"""The runner child's main loop when it runs the continuous-batching engine.

The reader thread (:func:`hydra_node.runtime.child.main._reader`) puts ``generate`` and
``cancel`` frames on ``work`` (``None`` when the channel closes).  This loop, on the main
thread, takes everything waiting, hands it to the :class:`~hydra_node.runtime.child.engine.batch.BatchEngine`
(a new request joins the running batch at the next step) and runs one engine step; when no
sequence is active it blocks on ``work`` instead of spinning.  With a ``cadence``
(:class:`~hydra_node.runtime.child.stats.StatsCadence`) it also sends the engine's figures,
``{"op": "stats", ...}`` (:meth:`BatchEngine.statistics`), when the cadence says one is due.
"""

from __future__ import annotations

import queue
import time
from typing import Callable

from hydra_node.runtime.child.process import TokenClock
from hydra_node.runtime.child.chat_prompt import InvalidPrompt

__all__ = ["run_engine_loop", "work_queue_bound"]

#: Frames the reader may queue ahead of the engine: the node admits at most ``parallel``
#: generations, each may be followed by its cancel, plus slack for the channel's control frames.
WORK_QUEUE_SLACK = 8


def work_queue_bound(parallel: int) -> int:
    return 2 * parallel + WORK_QUEUE_SLACK


def run_engine_loop(
    engine,
    work: "queue.Queue",
    prompt_tokens: Callable[[dict], list[int]],
    send: Callable[[dict], None],
    *,
    cadence=None,
    now: Callable[[], float] = time.monotonic,
    embed=None,
    kv=None,
) -> int:
    """Run until the channel closes (returns 0); an ``OSError`` from ``send`` propagates.
    ``cadence``: when to send a stats frame (None: never); ``now`` is its clock; ``embed``: the
    runner's :class:`~hydra_node.runtime.child.embed.Embedder` (None: no embeddings); ``kv``: its
    :class:`~hydra_node.runtime.child.kv_jobs.KvJobs` (None: no KV export/import)."""
    steps = 0
    while True:
        waiting = (embed is not None and embed.busy) or (kv is not None and kv.busy)
        msgs = [work.get()] if engine.idle and not waiting else []
        while True:
            try:
                msgs.append(work.get_nowait())
            except queue.Empty:
                break
        for msg in msgs:
            if msg is None:
                return 0
            if kv is not None and kv.take(msg):  # KV export/import: runner/kv_jobs.py
                continue
            if embed is not None and embed.take(msg):  # embeds and their cancels: runner/embed.py
                continue
            if msg["op"] == "cancel":
                engine.cancel(msg["id"])
            elif msg["op"] == "generate":
                _submit(engine, msg, prompt_tokens, send)
        if not engine.idle:
            try:
                engine.step()
            except OSError:
                raise
            except Exception as exc:  # a bug or a llama.cpp failure: fail what runs, keep serving
                engine.fail_all(f"{type(exc).__name__}: {exc}")
            steps += 1
            if cadence is not None and cadence.due(steps, now(), idle=engine.idle):
                send(engine.statistics().to_wire())
                cadence.sent(steps, now())
        if kv is not None and kv.busy:
            kv.step()  # exports whose prefill ended, imports waiting for a free slot
        if embed is not None and embed.busy:
            embed.step()  # one bounded embedding step between engine steps


def _submit(engine, msg: dict, prompt_tokens: Callable[[dict], list[int]], send: Callable[[dict], None]) -> None:
    rid = msg["id"]
    clock = TokenClock()  # TTFT counts from here: tokenising is part of it
    try:
        tokens = prompt_tokens(msg["req"])
    except InvalidPrompt as exc:  # the client's fault (a token outside the vocabulary, ...): 400
        send({"op": "error", "id": rid, "code": exc.code, "status": exc.status, "message": str(exc)})
        return
    except Exception as exc:
        send(
            {
                "op": "error",
                "id": rid,
                "code": "runner_error",
                "status": 500,
                "message": f"cannot tokenise the prompt: {type(exc).__name__}: {exc}",
            }
        )
        return
    engine.submit(rid, msg["req"], tokens, clock)
