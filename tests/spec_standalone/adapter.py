"""Glue to the generation contract (:mod:`hydra_node.inference`): request in, TextDelta/Finished out."""

from __future__ import annotations

from typing import Iterator, Sequence

from hydra_node.inference import Finished, GenerationRequest, TextDelta

from spec_standalone.decoder import Completion, Emitted, SpeculativeDecoder
from hydra_node.runtime.child.speculative.sampling import SamplingParams

#: Tokens generated when a request names no max_tokens.
DEFAULT_MAX_TOKENS = 256


def sampling_for(req: GenerationRequest) -> SamplingParams:
    return SamplingParams(temperature=req.temperature, top_p=req.top_p)


def generate_events(
    decoder: SpeculativeDecoder, req: GenerationRequest, prompt_tokens: Sequence[int], served_by: str = ""
) -> Iterator[TextDelta | Finished]:
    """Run ``req`` (already rendered to ``prompt_tokens``) and yield the contract's events."""
    for ev in decoder.generate(
        prompt_tokens,
        max_tokens=req.max_tokens or DEFAULT_MAX_TOKENS,
        sampling=sampling_for(req),
        stop=req.stop,
        seed=req.seed,
    ):
        if isinstance(ev, Emitted):
            if ev.text:
                yield TextDelta(ev.text)
        elif isinstance(ev, Completion):
            if ev.text_tail:
                yield TextDelta(ev.text_tail)
            yield Finished(ev.finish_reason, ev.prompt_tokens, ev.completion_tokens, served_by=served_by)
