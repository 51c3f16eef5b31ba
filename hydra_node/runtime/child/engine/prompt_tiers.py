"""The prompt cache's llama.cpp and file side (runner child, engine thread): save a slot's KV state into
the tiers, restore one into a slot, keep the disk tier's ``kv_state`` files (docs/prompt-cache.md).

* :meth:`PromptTiers.save`: a slot's cached prefix is about to be lost (the scheduler's
  ``take_dropped``): its state (``llama_state_seq_get_data``, :func:`~hydra_node.runtime.child.engine.kv_seq.save_cells`)
  goes into the RAM tier, and is queued for the disk tier's writer thread (not a prefix holding
  image positions, engine/media.py: the file's identity does not name the projector that computed
  them, so such a state stays in RAM, for this runner's life);
* :meth:`PromptTiers.restore`: an admission the scheduler planned from a tier hit: the state is loaded
  into the slot (``llama_state_seq_set_data``, :func:`~hydra_node.runtime.child.engine.kv_seq.load_cells`),
  then the cells past the prompt's common prefix are dropped.  A state read from disk is checked first:
  its header's identity must be this runner's for those tokens (:class:`~hydra_node.runtime.artifacts.kv_identity.KvIdentity`:
  model sha256, build, tokenizer, context and RoPE parameters, KV types, shape, prefix), its sha256 must
  match and its llama.cpp cell table must be one sequence at ``0..n-1``
  (:func:`~hydra_node.runtime.artifacts.kv_cells.check_cells`); anything else and the file is removed,
  never loaded, and the prompt is prefilled as without the cache;
* :class:`DiskTier`: ``DIR/<prefix sha256>.hykv`` files in the ``kv_state`` format (protocol/kv_state.md),
  written atomically (temporary sibling, fsync, rename) by one writer thread, so the engine never waits
  for the disk; at start, once the model file's sha256 is known (hashed in a thread, remembered in
  ``HOME/kv/digests.json``), the directory is read back: every file whose header is not this runner's
  identity (another model, KV type or context), truncated, or misnamed is removed.
"""

from __future__ import annotations

import ctypes
import os
import queue
import sys
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from hydra_node.runtime.artifacts.errors import ChecksumMismatch
from hydra_node.runtime.artifacts.kv_cells import check_cells
from hydra_node.runtime.artifacts.kv_identity import FileDigests, KvIdentity
from hydra_node.runtime.artifacts.kv_state import KvStateInvalid, open_kv_state, write_kv_state
from hydra_node.runtime.child.engine.kv_seq import KvCellsError, load_cells, save_cells
from hydra_node.runtime.child.engine.media import is_media
from hydra_node.runtime.child.engine.prompt_store import PromptStore, TierHit, prompt_key

__all__ = ["SUFFIX", "DiskTier", "PromptTiers"]

#: A disk tier file's name: ``<prefix sha256><SUFFIX>``.
SUFFIX = ".hykv"
#: Most bytes of states queued for the disk writer at once; beyond it a save skips the disk (counted).
MAX_PENDING_BYTES = 1 << 30
#: How long a stopping runner waits for the writer to finish the queued files.
FLUSH_TIMEOUT_S = 2.0

_Buffer = tuple[ctypes.Array, int]  # (state buffer, bytes used)
_Written = tuple[str, tuple[int, ...], int, int, str]  # key, tokens, file bytes, state bytes, error or ""


def _has_media(tokens: tuple[int, ...]) -> bool:
    return any(is_media(t) for t in tokens)


def _log(line: str) -> None:
    print(f"hydra-runner: prompt cache: {line}", file=sys.stderr, flush=True)


class DiskTier:
    """The files of one runner's disk tier.  The model file is hashed in a thread from construction
    (before the model loads: usually done by the time it is); ``identity_of(sha256)``: this runner's
    :class:`KvIdentity` (empty prefix), set once the engine exists; until both are there the tier is
    not ready (saves skip it)."""

    def __init__(
        self,
        directory: Path,
        model_path: Path,
        digests: Path | None,
        identity_of: Callable[[str], KvIdentity] | None = None,
    ) -> None:
        self.dir = directory
        self.identity_of = identity_of
        self.identity: KvIdentity | None = None
        self._sha: list[str | BaseException] = []  # the digest thread's answer
        self._jobs: queue.Queue = queue.Queue()
        self._done: deque[_Written] = deque()
        self.pending_bytes = 0
        self.write_failures = 0
        self.removed = 0  # files removed as corrupt, foreign or misnamed
        self.off = False  # the model file could not be hashed: no disk tier for this runner
        self._idle = threading.Event()
        self._idle.set()
        self._lock = threading.Lock()
        self._queued = 0

        def digest() -> None:
            try:
                self._sha.append(FileDigests(digests).sha256(model_path))
            except BaseException as exc:  # reported once, the tier stays off
                self._sha.append(exc)

        threading.Thread(target=digest, name="prompt-cache-digest", daemon=True).start()
        threading.Thread(target=self._writer, name="prompt-cache-writer", daemon=True).start()

    # ---- start: the model's digest, then the index ---------------------------------------
    def poll_ready(self, store: PromptStore) -> bool:
        """True once the tier serves; the first time, reads the directory into ``store.disk``."""
        if self.identity is not None:
            return True
        if not self._sha or self.off or self.identity_of is None:
            return False
        sha = self._sha[0]
        if isinstance(sha, BaseException):
            _log(f"disk tier off: cannot hash the model file: {type(sha).__name__}: {sha}")
            self.off = True
            return False
        self.identity = self.identity_of(sha)
        self._scan(store)
        return True

    def _scan(self, store: PromptStore) -> None:
        assert self.identity is not None
        self.dir.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # prompts' token ids: the operator's only
        self.dir.mkdir(exist_ok=True, mode=0o700)
        found = []
        for p in self.dir.iterdir():
            if p.name.startswith(".") and p.name.endswith(".tmp"):  # a write a killed runner left
                self.unlink(p, "an unfinished write")
                continue
            if not p.name.endswith(SUFFIX) or not p.is_file():
                continue
            try:
                with open_kv_state(p) as r:
                    h = r.header
            except (OSError, KvStateInvalid) as exc:
                self.unlink(p, f"unreadable: {exc}")
                continue
            why = self.mismatch(p, h.identity, h.tokens)
            if why:
                self.unlink(p, why)
                continue
            found.append((p.stat().st_mtime_ns, p, h.tokens, h.file_bytes))
        for _, p, tokens, size in sorted(found, key=lambda f: f[0]):  # oldest first: least recently used
            for k, _size in store.disk.put(prompt_key(tokens), tokens, size, size):
                self.unlink(self.path(k), "over the disk tier's size")
        if found:
            _log(f"disk tier: {len(store.disk)} states, {store.disk.bytes} bytes in {self.dir}")

    def mismatch(self, path: Path, identity: KvIdentity, tokens: tuple[int, ...]) -> str:
        """Why a file must not be loaded here ("" if it may): a name that is not its prefix's, or an
        identity that is not this runner's for those tokens."""
        assert self.identity is not None
        if path.name != prompt_key(tokens) + SUFFIX:
            return "its name is not its prefix's sha256"
        fields = self.identity.with_prefix(tokens).mismatches(identity)
        return f"another runner's state (differs in {', '.join(fields)})" if fields else ""

    def path(self, key: str) -> Path:
        return self.dir / (key + SUFFIX)

    def unlink(self, p: Path, why: str) -> None:
        try:
            p.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            _log(f"cannot remove {p}: {exc}")
            return
        self.removed += 1
        _log(f"removed {p.name}: {why}")

    # ---- the writer thread --------------------------------------------------------------------
    def write(self, key: str, tokens: tuple[int, ...], state: _Buffer) -> bool:
        """Queue a file for ``tokens``; False when the writer is too far behind (nothing queued)."""
        if self.identity is None or self.pending_bytes + state[1] > MAX_PENDING_BYTES:
            return False
        self.pending_bytes += state[1]
        self._enqueue(("write", key, tokens, state, self.identity.with_prefix(tokens)))
        return True

    def remove(self, key: str, why: str) -> None:
        self._enqueue(("rm", key, why))

    def _enqueue(self, job: tuple) -> None:
        with self._lock:
            self._queued += 1
            self._idle.clear()
        self._jobs.put(job)

    def completed(self) -> list[_Written]:
        """Writes finished since the last call (their bytes no longer pending)."""
        out = []
        while self._done:
            out.append(self._done.popleft())
            self.pending_bytes -= out[-1][3]
        return out

    def flush(self, timeout_s: float = FLUSH_TIMEOUT_S) -> bool:
        return self._idle.wait(timeout_s)

    def _writer(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job[0] == "write":
                    _, key, tokens, (buf, size), identity = job
                    try:
                        h = write_kv_state(self.path(key), identity, tokens, memoryview(buf)[:size])
                        self._done.append((key, tokens, h.file_bytes, size, ""))
                    except Exception as exc:  # a full disk, a removed directory: this state stays in RAM only
                        self._done.append((key, tokens, 0, size, f"{type(exc).__name__}: {exc}"))
                else:
                    self.unlink(self.path(job[1]), job[2])
            finally:
                with self._lock:
                    self._queued -= 1
                    if not self._queued:
                        self._idle.set()

    def read(self, key: str, n_tokens: int) -> _Buffer:
        """The state of ``key``, checked (identity, length, sha256, cell table); :class:`KvStateInvalid`,
        :class:`ChecksumMismatch` or ``OSError`` when it must not be loaded."""
        p = self.path(key)
        with open_kv_state(p) as r:
            h = r.header
            why = self.mismatch(p, h.identity, h.tokens)
            if why or len(h.tokens) != n_tokens:
                raise KvStateInvalid(why or f"it holds {len(h.tokens)} tokens, the index says {n_tokens}")
            buf = (ctypes.c_uint8 * h.state_bytes)()
            r.read_state_into(buf)
        check_cells(buf, n_tokens)
        try:
            os.utime(p)  # the file's mtime is its LRU order at the next start
        except OSError:
            pass
        return buf, h.state_bytes


class PromptTiers:
    """The engine's prompt cache (RAM tier, optional disk tier) over :class:`PromptStore`'s bookkeeping."""

    def __init__(self, engine, store: PromptStore[_Buffer], disk: DiskTier | None) -> None:
        self.engine = engine
        self.store = store
        self.disk = disk
        self.saves = 0
        self.failures = 0  # states that could not be saved or restored (the prompt was prefilled)
        self.disk_skipped = 0  # saves the disk writer was too far behind for

    def _poll(self) -> bool:
        """Take the writer's finished files into the disk index; True when the disk tier serves."""
        if self.disk is None or self.store.disk.capacity == 0 or not self.disk.poll_ready(self.store):
            return False
        for key, tokens, size, _state_bytes, error in self.disk.completed():
            if error:
                self.disk.write_failures += 1
                _log(f"cannot write {self.disk.path(key)}: {error}")
                continue
            for k, _ in self.store.disk.put(key, tokens, size, size):
                self.disk.remove(k, "least recently used, over the disk tier's size")
        return True

    def lookup(self, prompt: tuple[int, ...], limit: int, better_than: int) -> TierHit | None:
        self._poll()
        return self.store.lookup(prompt, limit, better_than)

    def save(self, slot: int, tokens: tuple[int, ...], kept: int) -> None:
        """``slot`` is about to lose ``tokens`` (it keeps the first ``kept``): save its state if worth it."""
        on_disk = self._poll()
        if not self.store.worth_saving(tokens, kept):
            return
        try:
            state = save_cells(self.engine, slot, len(tokens))
        except KvCellsError as exc:
            self.failures += 1
            _log(f"cannot save slot {slot}'s {len(tokens)} tokens: {exc}")
            return
        self.saves += 1
        key = prompt_key(tokens)
        for k in self.store.superseded(tokens, "ram"):
            self.store.ram.pop(k)
        self.store.ram.put(key, tokens, state[1], state)
        # never to disk with image positions: the kv_state identity names no projector (whose rows
        # the cells hold) and its token ids are unsigned (protocol/kv_state.md)
        if on_disk and self.disk is not None and self.store.disk.fits(state[1]) and not _has_media(tokens):
            for k in self.store.superseded(tokens, "disk"):
                self.store.disk.pop(k)
                self.disk.remove(k, "a longer state holds its prefix")
            if not self.disk.write(key, tokens, state):
                self.disk_skipped += 1

    def restore(self, slot: int, hit: TierHit) -> bool:
        """Load ``hit`` into ``slot`` (an admission's, its old cells dropped) and keep its first
        ``hit.common`` cells; False (the slot empty, the entry dropped) when it cannot be."""
        state = self.store.ram.get(hit.key) if hit.tier == "ram" else None
        if state is None and hit.tier == "disk" and self.disk is not None:
            try:
                state = self.disk.read(hit.key, hit.n_tokens)
            except (OSError, KvStateInvalid, ChecksumMismatch) as exc:
                self.store.disk.pop(hit.key)
                self.disk.unlink(self.disk.path(hit.key), f"cannot be loaded: {exc}")
            else:
                self.store.ram.put(hit.key, self.store.disk.tokens(hit.key), state[1], state)
        ok = state is not None
        if state is not None:
            try:
                load_cells(self.engine, slot, [], state[0], state[1], hit.n_tokens)
            except KvCellsError as exc:
                _log(f"llama.cpp refused a saved state of {hit.n_tokens} tokens: {exc}")
                ok = False
                self.store.ram.pop(hit.key)
        if ok:
            ll = self.engine._ll
            ll.llama_memory_seq_rm(self.engine.mem, slot, hit.common, -1)
        else:
            self.failures += 1
            self.engine._ll.llama_memory_seq_rm(self.engine.mem, slot, 0, -1)
        self.store.restored(hit, ok)
        return ok

    def persist(self, held: list[tuple[int, tuple[int, ...]]]) -> None:
        """The runner stops: save what the free slots hold (``held``: slot, tokens) and let the writer
        finish (bounded: a stopping runner is killed after a grace period).  A prefix holding image
        positions is not saved: it could only go to the RAM tier, which ends with the runner."""
        for slot, tokens in held:
            if not _has_media(tokens):
                self.save(slot, tokens, 0)
        if self.disk is not None:
            self.disk.flush()

    def statistics(self) -> dict[str, int]:
        self._poll()
        st = asdict(self.store.statistics())
        return {
            **{f"prompt_cache_{k}": v for k, v in st.items()},
            "prompt_cache_saves": self.saves,
            "prompt_cache_failures": self.failures
            + (self.disk.write_failures + self.disk.removed + self.disk_skipped if self.disk else 0),
        }
