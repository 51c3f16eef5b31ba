"""Speculative decoding inside the model runner child (:mod:`hydra_node.runtime.runner.main`).

The runner passes its loaded ``Llama``; we decode through it (:meth:`LlamaEngine.from_llama`)
with a draft that is either local (``--draft-model PATH``) or remote (``--draft-endpoint
127.0.0.1:Q``, a tunnel port of the node to a peer's draft server).  Only greedy requests
take this path (sampled requests keep the runner's llama.cpp sampler, whose chain the
speculative sampler does not reproduce); the output is the target's own greedy output.
The runner reports :meth:`RunnerSpeculation.status` in its ``done`` frames; the supervisor
keeps the latest for ``/api/status`` (``models[].speculative``).  A request with a grammar,
penalties, a logit bias or logprobs is refused (:func:`unsupported_with_speculation`).
"""

from __future__ import annotations

import argparse
import logging

from hydra_node.runtime._child import TokenClock

from hydra_node.runtime.speculative.controller import ControllerConfig, SpeculationController
from hydra_node.runtime.speculative.child.decoder import Completion, Emitted, SpeculativeDecoder
from hydra_node.runtime.speculative.child.draft import DraftSession
from hydra_node.runtime.speculative.child.engine import LlamaEngine
from hydra_node.runtime.speculative.child.remote import RemoteDrafter
from hydra_node.runtime.speculative.sampling import SamplingParams
from hydra_node.runtime.speculative.wire import vocab_fingerprint

log = logging.getLogger("hydra.runner.speculative")


def add_runner_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculative decoding")
    g.add_argument("--draft-endpoint", default="", help="HOST:PORT of a draft server (a local tunnel port)")
    g.add_argument("--draft-model", default="", help="GGUF file of a local draft model")
    g.add_argument("--draft-min-tokens", type=int, default=1)
    g.add_argument("--draft-max-tokens", type=int, default=8)
    g.add_argument("--draft-min-acceptance", type=float, default=0.0)
    g.add_argument("--draft-min-speedup", type=float, default=1.0)


def argv_for(*, endpoint: str = "", model: str = "", min_tokens: int = 1, max_tokens: int = 8,
             min_acceptance: float = 0.0, min_speedup: float = 1.0) -> list[str]:
    """The runner arguments for a draft (the inverse of :func:`add_runner_args`)."""
    argv = ["--draft-endpoint", endpoint] if endpoint else ["--draft-model", model] if model else []
    if argv:
        argv += ["--draft-min-tokens", str(min_tokens), "--draft-max-tokens", str(max_tokens),
                 "--draft-min-acceptance", f"{min_acceptance:g}", "--draft-min-speedup", f"{min_speedup:g}"]
    return argv


#: Request fields (wire names) the speculative runner cannot honour, and how a client names them.
#: Its plain path (``Llama.generate``) and the speculative decoder have no per-request sampler chain.
UNSUPPORTED_WITH_SPECULATION = (
    ("grammar", "'response_format'/'tools' (a grammar constraint)"),
    ("logit_bias", "'logit_bias'"),
    ("presence_penalty", "'presence_penalty'"),
    ("frequency_penalty", "'frequency_penalty'"),
    ("logprobs", "'logprobs'"),
    ("top_logprobs", "'top_logprobs'"),
)


def unsupported_with_speculation(req: dict) -> dict | None:
    """The error (``code``, ``status``, ``message``) for a request a speculative runner must refuse
    (a 400 naming the parameter, never served without it), or None when it can serve it."""
    for key, param in UNSUPPORTED_WITH_SPECULATION:
        if req.get(key):
            return {"code": "unsupported_with_speculation", "status": 400,
                    "message": f"{param} is not supported by this model's runner: it serves with speculative "
                               f"decoding (a draft model), which has no per-request sampler chain"}
    return None


class RunnerSpeculation:
    """The runner's speculative decoder; None from :meth:`create` when no draft was asked for."""

    def __init__(self, llm, args) -> None:
        self.llm = llm
        self.engine = LlamaEngine.from_llama(llm)
        vocab = vocab_fingerprint(llm)
        self.disabled: str | None = None
        self.remote: RemoteDrafter | None = None
        self.local_model: str | None = None
        drafter = None
        if args.draft_endpoint:
            drafter = self.remote = RemoteDrafter(args.draft_endpoint, n_vocab=self.engine.n_vocab, vocab=vocab)
        else:
            draft_engine = LlamaEngine(args.draft_model, n_ctx=self.engine.n_ctx,
                                       n_threads=max(1, args.threads or 1))
            if draft_engine.n_vocab != self.engine.n_vocab or vocab_fingerprint(draft_engine.llm) != vocab:
                self.disabled = f"the draft {args.draft_model} has another vocabulary than the target"
                draft_engine.close()
            else:
                drafter, self.local_model = DraftSession(draft_engine), str(args.draft_model)
        lo, hi = sorted((max(1, args.draft_min_tokens), max(1, args.draft_max_tokens)))
        config = ControllerConfig(draft_min_tokens=lo, draft_max_tokens=hi, min_speedup=args.draft_min_speedup,
                                  resume_speedup=max(args.draft_min_speedup, ControllerConfig.resume_speedup),
                                  min_acceptance=min(max(args.draft_min_acceptance, 0.0), 1.0))
        self.decoder = SpeculativeDecoder(self.engine, drafter, SpeculationController(config))
        self.requests = 0
        self.draft_failures = 0
        self.last_draft_failure: str | None = None

    @classmethod
    def create(cls, llm, args) -> "RunnerSpeculation | None":
        if not (args.draft_endpoint or args.draft_model):
            return None
        return cls(llm, args)

    def can_serve(self, req: dict) -> bool:
        return self.disabled is None and float(req.get("temperature", 0.8)) == 0.0

    def generate(self, ch, rid: int, req: dict, tokens: list[int], max_tokens: int, is_cancelled) -> None:
        """Like the runner's plain loop: deltas, then ``done`` (or a ``cancelled`` error)."""
        clock = TokenClock()
        self.requests += 1
        n, finish = 0, "length"
        completion: Completion | None = None
        gen = self.decoder.generate(tokens, max_tokens=max_tokens, sampling=SamplingParams(temperature=0.0),
                                    stop=tuple(req.get("stop") or ()))  # greedy: no seed needed
        try:
            for ev in gen:
                if isinstance(ev, Completion):
                    completion = ev
                    break
                if is_cancelled(rid):
                    finish = "cancelled"
                    break
                clock.tick()
                n += 1
                if isinstance(ev, Emitted) and ev.text:
                    ch.send({"op": "delta", "id": rid, "text": ev.text})
        finally:
            gen.close()
            if self.remote is not None:
                self.remote.close()
            self.llm.reset()  # our decoding bypassed the Llama's own bookkeeping
            self.engine.restore_threads()
        if finish == "cancelled":
            ch.send({"op": "error", "id": rid, "code": "cancelled", "status": 499, "message": "cancelled"})
            return
        if completion.text_tail:
            ch.send({"op": "delta", "id": rid, "text": completion.text_tail})
        if completion.draft_failure:
            self.draft_failures += 1
            self.last_draft_failure = completion.draft_failure[:300]
        ch.send({"op": "done", "id": rid, "finish_reason": completion.finish_reason,
                 "prompt_tokens": len(tokens), "completion_tokens": completion.completion_tokens,
                 "cached_tokens": 0, "ttft_ms": clock.ttft_ms(), "itl_ms": clock.itl_ms(n),
                 "speculative": self.status(completion)})

    def status(self, last: Completion | None = None) -> dict:
        st = self.decoder.statistics()
        out = {"draft": "remote" if self.remote is not None else "local", "disabled": self.disabled,
               "acceptance_rate": round(st.acceptance_rate, 4), "tokens_per_round": round(st.tokens_per_round, 3),
               "k": st.k, "predicted_speedup": round(st.predicted_speedup, 3),
               "measured_speedup": round(st.measured_speedup, 3), "rounds": st.rounds,
               "draft_tokens": st.draft_tokens, "accepted_tokens": st.accepted_tokens,
               "target_only_tokens": st.target_only_tokens, "speculating": st.speculating,
               "requests": self.requests, "draft_failures": self.draft_failures,
               "last_draft_failure": self.last_draft_failure}
        if self.remote is not None:
            out["remote"] = self.remote.status()
        if last is not None:
            out["last_request"] = {"rounds": last.rounds, "drafted": last.drafted, "accepted": last.accepted,
                                   "rejections": last.rejections, "completion_tokens": last.completion_tokens,
                                   "target_steps": last.target_steps, "draft_failure": last.draft_failure}
        return out
