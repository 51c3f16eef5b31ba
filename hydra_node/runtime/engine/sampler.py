"""Per-sequence llama.cpp sampler chains (runs inside the runner child).

Each sequence gets its own native chain, so sampling a token is one C call
(``llama_sampler_sample``) over that row's logits: no Python loop over the vocabulary.
The chain matches what the runner used through ``Llama.generate`` before the batch engine:
greedy when ``temperature`` is 0, else top-k 40 → top-p → temperature → a seeded draw.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SamplerParams", "Sampler"]

#: Top-k applied before top-p when sampling with a temperature (the runner's historic default).
DEFAULT_TOP_K = 40


@dataclass(frozen=True)
class SamplerParams:
    temperature: float = 0.8
    top_p: float = 0.95
    seed: int | None = None  # None: a random seed per sequence

    @classmethod
    def from_request(cls, req: dict) -> "SamplerParams":
        seed = req.get("seed")
        return cls(temperature=float(req.get("temperature", 0.8)), top_p=float(req.get("top_p", 0.95)),
                   seed=None if seed is None else int(seed) & 0xFFFFFFFF)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


class Sampler:
    """One native sampler chain; :meth:`close` frees it (idempotent)."""

    def __init__(self, params: SamplerParams):
        import llama_cpp

        self._ll = llama_cpp
        self.params = params
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        if chain is None:
            raise RuntimeError("llama_sampler_chain_init failed")
        self._chain = chain
        add = lambda s: llama_cpp.llama_sampler_chain_add(chain, s)  # noqa: E731 - the chain owns s
        if params.greedy:
            add(llama_cpp.llama_sampler_init_greedy())
        else:
            add(llama_cpp.llama_sampler_init_top_k(DEFAULT_TOP_K))
            add(llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
            add(llama_cpp.llama_sampler_init_temp(params.temperature))
            seed = llama_cpp.LLAMA_DEFAULT_SEED if params.seed is None else params.seed
            add(llama_cpp.llama_sampler_init_dist(seed))

    def sample(self, ctx, row: int) -> int:
        """Sample (and accept) a token from batch row ``row``'s logits of the last decode."""
        return int(self._ll.llama_sampler_sample(self._chain, ctx, row))

    def close(self) -> None:
        if self._chain is not None:
            self._ll.llama_sampler_free(self._chain)
            self._chain = None
