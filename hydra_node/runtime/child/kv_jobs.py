"""KV state export and import in the runner child, worked between engine steps (docs/kv-reuse.md).

Channel messages (``hydra_node/runtime/child/main.py``):

* ``{"op": "kv_export", "id", "req": GenerationRequest, "path", "model_sha256"}``: the request's
  prompt tokens (chat template and all, exactly as a generation would see them) are the prefix.
  A free slot already holding them is cut to them; otherwise the engine prefills them as a
  one-token greedy generation (its delta and done frames are swallowed here) and the slot it
  releases holds them.  The slot's state is written to ``path`` (:mod:`~hydra_node.runtime.artifacts.kv_state`)
  and answered ``{"op": "kv_exported", "id", "tokens", "bytes", "identity"}``.  The slot keeps the
  prefix: the prompt cache still serves it here.
* ``{"op": "kv_import", "id", "path", "model_sha256"}``: the file's header is checked (format,
  prefix) and its identity compared with this runner's, field by field: any difference is refused,
  ``{"op": "error", "code": "identity_mismatch", "status": 422, "fields": [...]}``, nothing loaded;
  then the state is read (its sha256 checked), its llama.cpp cell table checked (one sequence at
  positions ``0..n-1``: :func:`~hydra_node.runtime.artifacts.kv_cells.check_cells`; 422
  ``kv_state_invalid`` otherwise, nothing loaded) and loaded into a free slot that becomes that slot's
  resident prefix, so the next prompt starting with those tokens skips their prefill:
  ``{"op": "kv_imported", "id", "tokens", "bytes", "slot"}``.  With every slot busy the import
  waits for one (its buffer held: the node sends one KV operation at a time).
* a prompt holding images (placeholder ids, engine/media.py) is not exported: 400
  ``unsupported_parameter`` (the file's token ids are unsigned and its identity names no projector);
  an imported state holds text tokens only.
* a ``cancel`` of the id drops a waiting export or import (an export whose prefill runs is
  cancelled in the engine and answered by it, ``error`` 499).

A load llama.cpp fails empties the slot entirely and checks it is empty (:meth:`KvJobs._clear`),
answered 500 ``kv_load_failed`` with the lines llama.cpp logged meanwhile.  Every error answered
here is also written to stderr, the runner log (``HOME/logs/runner-MODEL.log``).

Files are read and written on the engine thread: a state of tens of MB costs tens of milliseconds
of pause for the running sequences, a multi-GB one seconds (a known cost; docs/kv-reuse.md).
"""

from __future__ import annotations

import ctypes
import re
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeGuard, cast

from hydra_node.runtime.child.process import TokenClock
from hydra_node.runtime.artifacts.errors import ChecksumMismatch
from hydra_node.runtime.artifacts.kv_cells import check_cells
from hydra_node.runtime.artifacts.kv_identity import KvIdentity
from hydra_node.runtime.artifacts.kv_state import (
    KvStateInvalid,
    open_kv_state,
    write_kv_state,
)
from hydra_node.runtime.child.engine.kv_seq import KvCellsError, load_cells, save_cells
from hydra_node.runtime.child.engine.media import is_media
from hydra_node.runtime.child.engine.slots import Rejected
from hydra_node.runtime.child.chat_prompt import InvalidPrompt

__all__ = ["KvJobs"]

_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass
class _Import:
    rid: int
    tokens: tuple[int, ...]
    buf: ctypes.Array
    size: int
    file_bytes: int


class KvJobs:
    """The runner's KV operations.  ``identity(model_sha256)``: this runner's :class:`KvIdentity`
    for an empty prefix (``runner/kv_probe.py``); ``send``: the channel's (an ``OSError`` from it
    propagates: the channel is gone)."""

    def __init__(
        self,
        engine,
        prompt_tokens: Callable[[dict], list[int]],
        send: Callable[[dict], None],
        identity: Callable[[str], KvIdentity],
    ) -> None:
        self.engine = engine
        self._prompt_tokens = prompt_tokens
        self._send = send
        self._identity = identity
        self._base: KvIdentity | None = None
        self._exports: dict[int, tuple[tuple[int, ...], str, str]] = {}  # rid -> (tokens, path, sha), prefilling
        self._ready: deque[int] = deque()  # exports whose prefill ended
        self._imports: deque[_Import] = deque()

    @property
    def busy(self) -> bool:
        """Work that needs :meth:`step` although the engine may be idle."""
        return bool(self._ready or self._imports)

    def own(self, model_sha256: str) -> KvIdentity:
        if self._base is None:
            self._base = self._identity(model_sha256)
        elif self._base.model_sha256 != model_sha256:
            self._base = replace(self._base, model_sha256=model_sha256)
        return self._base

    # ---- frames ------------------------------------------------------------------------
    def wrap(self, send: Callable[[dict], None]) -> Callable[[dict], None]:
        """The engine's ``send``: an export's prefill frames are ours (its error goes to the node)."""

        def engine_send(msg: dict) -> None:
            rid = msg.get("id")
            if rid in self._exports and msg["op"] in ("delta", "done"):
                if msg["op"] == "done":
                    self._ready.append(rid)
                return
            if rid in self._exports and msg["op"] == "error":
                del self._exports[rid]
            send(msg)

        return engine_send

    def take(self, msg: dict) -> bool:
        """Handle ``msg`` if it is ours (a kv_export, a kv_import, or a cancel of one waiting)."""
        op, rid = msg["op"], cast(int, msg.get("id"))  # the parent numbers every request (an int)
        if op == "kv_export":
            self._export_request(rid, msg)
        elif op == "kv_import":
            self._import_request(rid, msg)
        elif op == "cancel" and any(j.rid == rid for j in self._imports):
            self._imports = deque(j for j in self._imports if j.rid != rid)
            self._error(rid, 499, "cancelled", "cancelled")
        elif op == "cancel" and rid in self._ready:
            self._ready.remove(rid)
            del self._exports[rid]
            self._error(rid, 499, "cancelled", "cancelled")
        else:
            return False  # a cancel of a prefilling export reaches the engine, which answers it
        return True

    def step(self) -> None:
        """Finish exports whose prefill ended; load waiting imports into free slots."""
        while self._ready:
            rid = self._ready.popleft()
            tokens, path, sha = self._exports.pop(rid)
            self._save(rid, tokens, path, sha)
        for job in list(self._imports):
            if self._load(job):
                self._imports.remove(job)

    # ---- export ------------------------------------------------------------------------
    def _export_request(self, rid: int, msg: dict) -> None:
        req, path, sha = msg.get("req"), msg.get("path"), msg.get("model_sha256")
        if not isinstance(req, dict) or not isinstance(path, str) or not path or not _digest(sha):
            return self._error(rid, 400, "bad_message", "kv_export needs 'req', 'path' and 'model_sha256'")
        try:
            tokens = tuple(self._prompt_tokens(req))
        except InvalidPrompt as exc:
            return self._error(rid, exc.status, exc.code, str(exc))
        except Exception as exc:
            return self._error(rid, 500, "runner_error", f"cannot tokenise the prompt: {type(exc).__name__}: {exc}")
        if not 0 < len(tokens) < self.engine.n_ctx:
            return self._error(
                rid,
                400,
                "context_length_exceeded",
                f"the prefix is {len(tokens)} tokens; this runner's context is {self.engine.n_ctx}",
            )
        if any(is_media(t) for t in tokens):
            return self._error(
                rid,
                400,
                "unsupported_parameter",
                "a prompt with images cannot be exported: a kv_state file holds token ids only and its "
                "identity does not name the vision projector whose embeddings the cells hold "
                "(protocol/kv_state.md); export the text before the first image instead",
            )
        if self.engine.sched.holding(tokens) >= 0:
            return self._save(rid, tokens, path, sha)
        self._exports[rid] = (tokens, path, sha)  # prefill it: a one-token greedy generation
        self.engine.submit(rid, {"temperature": 0.0, "max_tokens": 1}, list(tokens), TokenClock())

    def _save(self, rid: int, tokens: tuple[int, ...], path: str, sha: str) -> None:
        slot = self.engine.sched.holding(tokens)
        if slot < 0:
            return self._error(
                rid,
                503,
                "kv_prefix_lost",
                "the prefix's cells were dropped before they could be "
                "saved (the context is full, or the runner keeps no cached prefixes)",
            )
        try:
            buf, size = save_cells(self.engine, slot, len(tokens))
            identity = self.own(sha).with_prefix(tokens)
            header = write_kv_state(path, identity, tokens, memoryview(buf)[:size])
        except KvCellsError as exc:
            self.engine.sched.forget(slot)
            return self._error(rid, 500, "runner_error", f"cannot save the KV state: {exc}")
        except OSError as exc:
            return self._error(rid, 500, "kv_write_failed", f"cannot write {path}: {exc}")
        except Exception as exc:  # our bug or llama.cpp's: this export fails, the runner goes on
            return self._error(rid, 500, "runner_error", f"cannot export: {type(exc).__name__}: {exc}")
        self._send(
            {
                "op": "kv_exported",
                "id": rid,
                "tokens": len(tokens),
                "bytes": header.file_bytes,
                "identity": identity.to_mapping(),
            }
        )

    # ---- import ------------------------------------------------------------------------
    def _import_request(self, rid: int, msg: dict) -> None:
        path, sha = msg.get("path"), msg.get("model_sha256")
        if not isinstance(path, str) or not path or not _digest(sha):
            return self._error(rid, 400, "bad_message", "kv_import needs 'path' and 'model_sha256'")
        try:
            with open_kv_state(path) as reader:
                h = reader.header
                fields = self.own(sha).with_prefix(h.tokens).mismatches(h.identity)
                if fields:
                    _log(f"kv operation {rid} failed: 422 identity_mismatch: {path} differs in {', '.join(fields)}")
                    return self._send(
                        {
                            "op": "error",
                            "id": rid,
                            "code": "identity_mismatch",
                            "status": 422,
                            "fields": fields,
                            "message": "the KV state was computed by an "
                            "incompatible context; it differs in: " + ", ".join(fields),
                        }
                    )
                buf = (ctypes.c_uint8 * h.state_bytes)()
                reader.read_state_into(buf)
            check_cells(buf, len(h.tokens))  # one sequence at 0..n-1: llama.cpp never sees other cells
        except FileNotFoundError:
            return self._error(rid, 404, "kv_state_not_found", f"no kv_state file at {path}")
        except (KvStateInvalid, ChecksumMismatch) as exc:
            return self._error(rid, 422, exc.code, str(exc))
        except OSError as exc:
            return self._error(rid, 500, "kv_read_failed", f"cannot read {path}: {exc}")
        except Exception as exc:  # MemoryError for the buffer, a bug: this import fails, the runner goes on
            return self._error(rid, 500, "runner_error", f"cannot import: {type(exc).__name__}: {exc}")
        job = _Import(rid, h.tokens, buf, h.state_bytes, h.file_bytes)
        if not self._load(job):
            self._imports.append(job)

    def _load(self, job: _Import) -> bool:
        """Load ``job`` if a slot is free (True: answered, either way)."""
        try:
            slot, evicted = self.engine.sched.adopt(job.tokens)
        except Rejected as exc:
            if exc.code == "no_free_slot" and not self.engine.idle:
                return False  # a running sequence will free one
            self._error(job.rid, exc.status, exc.code, str(exc))
            return True
        from hydra_node.runtime.child.rpc_coordinator import LlamaLogCapture

        llama_log = LlamaLogCapture()
        try:
            with llama_log:
                load_cells(self.engine, slot, evicted, job.buf, job.size, len(job.tokens))
        except Exception as exc:
            self._clear(slot)
            said = " | ".join(line.strip() for line in llama_log.lines if line.strip())[-500:]
            if isinstance(exc, KvCellsError):
                why = f"llama.cpp refused the state: {exc}"
            else:
                why = f"cannot load the state: {type(exc).__name__}: {exc}"
            self._error(job.rid, 500, "kv_load_failed", why + (f" (llama.cpp: {said})" if said else ""))
            return True
        self._send(
            {"op": "kv_imported", "id": job.rid, "tokens": len(job.tokens), "bytes": job.file_bytes, "slot": slot}
        )
        return True

    def _clear(self, slot: int) -> None:
        """Empty ``slot`` after a failed load, in the cache and the scheduler, and check it is empty.
        ``p0 = -1`` is 0 in ``llama_memory_seq_rm``: cells at negative positions cannot be removed,
        which is why :func:`check_cells` keeps them from llama.cpp; should any remain, the runner
        stops (its supervisor restarts it with an empty cache) rather than serve with them."""
        ll = self.engine._ll
        ll.llama_memory_seq_rm(self.engine.mem, slot, -1, -1)
        self.engine.sched.forget(slot)
        span = (
            int(ll.llama_memory_seq_pos_min(self.engine.mem, slot)),
            int(ll.llama_memory_seq_pos_max(self.engine.mem, slot)),
        )
        if span != (-1, -1):
            _log(f"kv_import: slot {slot} still holds positions {span} after a failed load; the runner stops")
            raise RuntimeError(f"KV slot {slot} cannot be emptied (positions {span} remain)")

    def _error(self, rid: int, status: int, code: str, message: str) -> None:
        _log(f"kv operation {rid} failed: {status} {code}: {message}")
        self._send({"op": "error", "id": rid, "code": code, "status": status, "message": message})


def _log(line: str) -> None:
    """One line to stderr: the runner log (``HOME/logs/runner-MODEL.log``)."""
    print(f"hydra-runner: {line}", file=sys.stderr, flush=True)


def _digest(v: object) -> TypeGuard[str]:
    return isinstance(v, str) and bool(_HEX64.fullmatch(v))
