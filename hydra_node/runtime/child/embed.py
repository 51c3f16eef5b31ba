"""Embeddings in the runner child: a second llama.cpp context on the loaded model, made on first use.

The context (:class:`EmbeddingContext`) shares the model's weights with the generation context and
adds its own KV cache and compute buffers: ``embeddings = true``, the model's own pooling type when
its GGUF declares one (``<arch>.pooling_type`` mean, cls or last), else mean pooling; ``n_ctx =
n_batch = n_ubatch = min(the model's training context, EMBED_CTX_LIMIT)`` (llama.cpp pools a
sequence within one micro-batch, so an input must fit in one), ``n_seq_max = EMBED_SEQ_MAX`` over a
unified KV cache. Its memory is paid once, on the first embedding request, never by a node that
only generates.

Text is tokenised with the model's special tokens (BOS, and EOS where the vocabulary asks for it);
token inputs are used as they are (each id must be in the vocabulary). An input longer than the
context is refused with 400 ``context_length_exceeded``. Each vector is L2-normalised (unit length,
as OpenAI's) and sent as little-endian float32 bytes.

The engine loop runs on one thread: :class:`Embedder` does one bounded step between engine steps
(:meth:`Embedder.step`: one ``llama_decode`` of whole inputs, at most STEP_TOKENS tokens unless a
single input is longer, at most EMBED_SEQ_MAX inputs), so a long embedding request delays running
generations by one such step at a time instead of for its whole duration.

Channel messages (``hydra_node/runtime/child/main.py``): in ``{"op": "embed", "id", "req":
EmbeddingRequest}``; out ``{"op": "vectors", "id", "v": [bytes]}`` ... then ``{"op": "embedded",
"id", "prompt_tokens"}`` or ``{"op": "error", "id", "message", "code", "status"}``; a ``cancel``
for the id drops the request (answered ``error`` 499 ``cancelled``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from hydra_node.inference.embeddings import EmbeddingRequest, vector_bytes
from hydra_node.inference.errors import InvalidRequest

__all__ = ["EMBED_CTX_LIMIT", "EMBED_SEQ_MAX", "STEP_TOKENS", "Embedder", "EmbeddingContext"]

#: Largest embedding context (tokens): the longest input an embedding request may have.
EMBED_CTX_LIMIT = 8192
#: Inputs decoded together in one step.
EMBED_SEQ_MAX = 4
#: Tokens decoded per step (a longer single input is decoded alone, whole).
STEP_TOKENS = 512
#: Pooling types a GGUF may declare that yield one vector per sequence (mean, cls, last).
_POOLED = (1, 2, 3)


class EmbeddingContext:
    """A llama.cpp embedding context on ``llm``'s model (see the module docstring)."""

    def __init__(self, llm) -> None:
        import llama_cpp
        from llama_cpp import _internals

        self._llama_cpp = llama_cpp
        model = llm._model.model
        train = int(llama_cpp.llama_model_n_ctx_train(model))
        self.n_ctx = min(train, EMBED_CTX_LIMIT) if train > 0 else EMBED_CTX_LIMIT
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model)))
        arch = llm.metadata.get("general.architecture", "")
        declared = llm.metadata.get(f"{arch}.pooling_type", "")
        self.pooling = (
            int(declared) if declared.isdigit() and int(declared) in _POOLED else llama_cpp.LLAMA_POOLING_TYPE_MEAN
        )
        p = llama_cpp.llama_context_default_params()
        p.n_ctx = p.n_batch = p.n_ubatch = self.n_ctx
        p.n_seq_max = EMBED_SEQ_MAX
        p.kv_unified = True  # the inputs of a step share the whole context
        p.embeddings = True
        p.pooling_type = self.pooling
        p.no_perf = True
        gen = llm.context_params  # the generation context's speed knobs
        for knob in ("flash_attn_type", "type_k", "type_v", "offload_kqv"):
            setattr(p, knob, getattr(gen, knob))
        p.n_threads = int(llama_cpp.llama_n_threads(llm._ctx.ctx))
        p.n_threads_batch = int(llama_cpp.llama_n_threads_batch(llm._ctx.ctx))
        self._ctx = _internals.LlamaContext(model=llm._model, params=p, verbose=False)
        self._batch = _internals.LlamaBatch(n_tokens=self.n_ctx, embd=0, n_seq_max=EMBED_SEQ_MAX, verbose=False)
        n_out = getattr(llama_cpp, "llama_model_n_embd_out", None)
        self.n_embd = int(n_out(model)) if n_out is not None else int(llama_cpp.llama_model_n_embd(model))

    def embed(self, seqs: list[list[int]]) -> list[bytes]:
        """One ``llama_decode`` over ``seqs`` (at most EMBED_SEQ_MAX, n_ctx tokens together): their
        unit-length vectors as float32 bytes."""
        self._batch.reset()
        self._ctx.kv_cache_clear()
        for i, toks in enumerate(seqs):
            self._batch.add_sequence(toks, i, True)  # every token an output: pooling reads them all
        self._ctx.decode(self._batch)
        out = []
        for i in range(len(seqs)):
            ptr = self._llama_cpp.llama_get_embeddings_seq(self._ctx.ctx, i)
            if not ptr:
                raise RuntimeError(f"llama.cpp returned no pooled embedding for sequence {i}")
            v = ptr[: self.n_embd]
            norm = math.sqrt(math.fsum(x * x for x in v))
            if not math.isfinite(norm):
                raise RuntimeError("llama.cpp returned an embedding holding NaN or infinity")
            out.append(vector_bytes([x / norm for x in v] if norm > 0 else v))
        return out


@dataclass
class _Job:
    rid: int
    seqs: list[list[int]]
    done: int = 0  # inputs embedded and sent
    tokens: int = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = sum(len(s) for s in self.seqs)


class Embedder:
    """The runner's embedding requests, worked through one bounded :meth:`step` at a time.

    ``make_context()`` builds the :class:`EmbeddingContext` (on the first request); ``send`` is the
    channel's (an ``OSError`` from it propagates: the channel is gone)."""

    def __init__(
        self,
        tokenize: Callable[[str], list[int]],
        make_context: Callable[[], EmbeddingContext],
        send: Callable[[dict], None],
    ) -> None:
        self._tokenize = tokenize
        self._make_context = make_context
        self._send = send
        self._ctx: EmbeddingContext | None = None
        self._jobs: deque[_Job] = deque()

    @classmethod
    def for_llama(cls, llm, send: Callable[[dict], None]) -> Embedder:
        return cls(
            lambda text: llm.tokenize(text.encode("utf-8"), add_bos=True, special=False),
            lambda: EmbeddingContext(llm),
            send,
        )

    @property
    def busy(self) -> bool:
        return bool(self._jobs)

    def take(self, msg: dict) -> bool:
        """Handle ``msg`` if it is ours (an ``embed``, or a ``cancel`` of a waiting one)."""
        if msg["op"] == "embed":
            self.submit(msg["id"], msg["req"])
            return True
        if msg["op"] == "cancel":
            for job in self._jobs:
                if job.rid == msg["id"]:
                    self._jobs.remove(job)
                    self._error(job.rid, 499, "cancelled", "cancelled")
                    return True
        return False

    def submit(self, rid: int, wire) -> None:
        """Check and tokenise a request; queue it, or answer its error at once."""
        try:
            req = EmbeddingRequest.from_wire(wire)
            if self._ctx is None:
                self._ctx = self._make_context()
        except InvalidRequest as exc:
            return self._error(rid, 400, "invalid_request", exc.message)
        except Exception as exc:  # llama.cpp could not make the context (memory): this request fails
            return self._error(
                rid, 503, "embeddings_unavailable", f"cannot create the embedding context: {type(exc).__name__}: {exc}"
            )
        seqs = []
        for i, x in enumerate(req.inputs):
            toks = self._tokenize(x) if isinstance(x, str) else list(x)
            if isinstance(x, tuple) and max(x) >= self._ctx.n_vocab:
                return self._error(
                    rid,
                    400,
                    "invalid_request",
                    f"input[{i}]: token id {max(x)} is not in the model's vocabulary of {self._ctx.n_vocab} tokens",
                )
            if len(toks) > self._ctx.n_ctx:
                return self._error(
                    rid,
                    400,
                    "context_length_exceeded",
                    f"input[{i}] is {len(toks)} tokens; this model embeds at most {self._ctx.n_ctx} tokens per input",
                )
            if not toks:
                return self._error(rid, 400, "invalid_request", f"input[{i}] has no tokens")
            seqs.append(toks)
        self._jobs.append(_Job(rid, seqs))

    def step(self) -> None:
        """Embed the next few inputs of the first waiting request and send their vectors (and its end)."""
        if not self._jobs:
            return
        job = self._jobs[0]
        batch = [job.seqs[job.done]]
        size = len(batch[0])
        while (
            len(batch) < EMBED_SEQ_MAX
            and job.done + len(batch) < len(job.seqs)
            and size + len(job.seqs[job.done + len(batch)]) <= STEP_TOKENS
        ):
            size += len(job.seqs[job.done + len(batch)])
            batch.append(job.seqs[job.done + len(batch)])
        assert self._ctx is not None  # made when the first job was taken
        try:
            vectors = self._ctx.embed(batch)
        except Exception as exc:  # a llama.cpp failure: this request fails, the runner keeps serving
            self._jobs.popleft()
            return self._error(job.rid, 500, "runner_error", f"embedding failed: {type(exc).__name__}: {exc}")
        self._send({"op": "vectors", "id": job.rid, "v": vectors})
        job.done += len(batch)
        if job.done == len(job.seqs):
            self._jobs.popleft()
            self._send({"op": "embedded", "id": job.rid, "prompt_tokens": job.tokens})

    def run_all(self) -> None:
        """Work until nothing waits (the sequential runner: nothing else runs meanwhile)."""
        while self._jobs:
            self.step()

    def _error(self, rid: int, status: int, code: str, message: str) -> None:
        self._send({"op": "error", "id": rid, "code": code, "status": status, "message": message})
