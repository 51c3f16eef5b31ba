"""One llama.cpp model and context with explicit KV-cache positions.

``llama_cpp.Llama`` loads the model and the context; decoding goes through our own
``llama_batch`` so that we choose which positions return logits (all of them for a
verify pass, only the last for a prompt) and can drop the cache past any position
(``llama_memory_seq_rm``) after a rejection.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import llama_cpp
import numpy as np

from hydra_node.runtime.speculative.errors import ContextFull

#: Default context window of speculative sessions (tokens).
DEFAULT_N_CTX = 2048
#: Batches up to this many tokens (a verify pass of k + 1, a draft's catch-up) are decode-like
#: (matrix-vector bound): they run on the decode thread count, not ``n_threads_batch`` (which
#: llama-cpp-python defaults to every core: its threads spin-wait for each other and, on a
#: shared or busy machine, made a verify pass several times slower than a decode step).
SMALL_BATCH_TOKENS = 16


class LlamaEngine:
    """A model, its context and the number of positions held in its KV cache (``n_past``)."""

    def __init__(
        self, model_path: Path | str, *, n_ctx: int = DEFAULT_N_CTX, n_threads: int = 2, n_batch: int = 512
    ) -> None:
        llm = llama_cpp.Llama(
            model_path=str(model_path),
            n_ctx=n_ctx,
            n_batch=n_batch,
            n_ubatch=n_batch,
            n_threads=n_threads,
            n_threads_batch=n_threads,
            verbose=False,
        )
        self._attach(llm, n_batch)

    @classmethod
    def from_llama(cls, llm: "llama_cpp.Llama") -> "LlamaEngine":
        """Decode through an already loaded ``Llama`` (a model runner's).  Its own bookkeeping
        (``n_tokens``) no longer matches the cache afterwards: call ``llm.reset()`` before using
        it directly again."""
        engine = cls.__new__(cls)
        engine._attach(llm, llm.n_batch)
        return engine

    def _attach(self, llm, n_batch: int) -> None:
        self.llm = llm
        self.n_ctx = self.llm.n_ctx()
        self.n_vocab = self.llm.n_vocab()
        self.n_batch = n_batch
        self._vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self._memory = llama_cpp.llama_get_memory(self.llm.ctx)
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self.n_past = 0
        self._threads = (int(llm.n_threads), int(llm.n_threads_batch))
        self._small_batch_threads = False

    def close(self) -> None:
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        self.llm.close()

    # -- text ---------------------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        """The bytes of ``tokens`` (pieces concatenated; may end inside a UTF-8 character)."""
        return self.llm.detokenize(list(tokens))

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, int(token)))

    # -- the KV cache ---------------------------------------------------------------------
    def decode(self, tokens: Sequence[int], all_logits: bool) -> np.ndarray:
        """Evaluate ``tokens`` at positions ``n_past...``; return logits rows (float32).

        With ``all_logits`` one row per token, else one row for the last token.
        """
        n = len(tokens)
        if n == 0:
            raise ValueError("nothing to decode")
        if self.n_past + n > self.n_ctx:
            raise ContextFull(f"{self.n_past} + {n} tokens exceed the context of {self.n_ctx}")
        small = n <= SMALL_BATCH_TOKENS
        if small != self._small_batch_threads and self._threads[0] != self._threads[1]:
            decode_threads, batch_threads = self._threads
            llama_cpp.llama_set_n_threads(self.llm.ctx, decode_threads, decode_threads if small else batch_threads)
            self._small_batch_threads = small
        rows = []
        for start in range(0, n, self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            last_chunk = start + self.n_batch >= n
            b = self._batch
            b.n_tokens = len(chunk)
            for i, tok in enumerate(chunk):
                b.token[i] = int(tok)
                b.pos[i] = self.n_past + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = 0
                b.logits[i] = all_logits or (last_chunk and i == len(chunk) - 1)
            rc = llama_cpp.llama_decode(self.llm.ctx, b)
            if rc != 0:
                self.truncate(self.n_past)
                raise RuntimeError(f"llama_decode returned {rc}")
            self.n_past += len(chunk)
            if all_logits:
                ptr = llama_cpp.llama_get_logits(self.llm.ctx)
                rows.append(np.ctypeslib.as_array(ptr, shape=(len(chunk), self.n_vocab)).copy())
            elif last_chunk:
                ptr = llama_cpp.llama_get_logits_ith(self.llm.ctx, len(chunk) - 1)
                rows.append(np.ctypeslib.as_array(ptr, shape=(1, self.n_vocab)).copy())
        return np.concatenate(rows) if len(rows) > 1 else rows[0]

    def restore_threads(self) -> None:
        """Give the context back its own thread counts (before someone else decodes through it)."""
        if self._small_batch_threads:
            llama_cpp.llama_set_n_threads(self.llm.ctx, *self._threads)
            self._small_batch_threads = False

    def truncate(self, n_past: int) -> None:
        """Forget every cached position from ``n_past`` on."""
        if not 0 <= n_past <= self.n_past:
            raise ValueError(f"cannot truncate to {n_past}: {self.n_past} positions cached")
        if not llama_cpp.llama_memory_seq_rm(self._memory, 0, n_past, -1):
            raise RuntimeError("this model's memory cannot drop a partial sequence")
        self.n_past = n_past
