"""Speculative decoding inside the model runner child (:mod:`hydra_node.runtime.child.main`).

:func:`engine_speculation` builds the batch engine's speculation
(:mod:`hydra_node.runtime.child.engine.speculation`) with a draft that is either local
(``--draft-model PATH``: its own llama context in the runner, warmed up at load) or remote
(``--draft-endpoint 127.0.0.1:Q``, a tunnel port of the node to a peer's draft server), and the
adaptive controller bounded by ``--draft-min-tokens`` ... (``[defaults.speculative]``).  Greedy
requests speculate inside the engine's batched step; every other request decodes normally beside
them.  The engine reports the figures in its ``done`` frames; the supervisor keeps the latest for
``/api/status`` (``models[].speculative``).
"""

from __future__ import annotations

import logging

from hydra_node.runtime.child.speculative.controller import ControllerConfig, SpeculationController
from hydra_node.runtime.child.speculative.draft import DraftSession
from hydra_node.runtime.child.speculative.llama_engine import LlamaEngine
from hydra_node.runtime.child.speculative.remote import RemoteDrafter
from hydra_node.runtime.speculative.runner_args import add_runner_args, argv_for  # noqa: F401 - the runner reads them here
from hydra_node.runtime.speculative.wire import vocab_fingerprint

log = logging.getLogger("hydra.runner.speculative")


def engine_speculation(llm, args):
    """The batch engine's speculation for ``--draft-endpoint`` / ``--draft-model``
    (:class:`~hydra_node.runtime.child.engine.speculation.EngineSpeculation`), or ``(None, reason)``
    when no draft was asked for (reason None) or the draft cannot serve this target."""
    from hydra_node.runtime.child.engine.speculation import EngineSpeculation

    if not (args.draft_endpoint or args.draft_model):
        return None, None
    n_vocab, vocab = llm.n_vocab(), vocab_fingerprint(llm)
    remote = None
    if args.draft_endpoint:
        drafter = remote = RemoteDrafter(args.draft_endpoint, n_vocab=n_vocab, vocab=vocab)
    else:
        draft_engine = LlamaEngine(args.draft_model, n_ctx=llm.n_ctx(), n_threads=max(1, args.threads or 1))
        if draft_engine.n_vocab != n_vocab or vocab_fingerprint(draft_engine.llm) != vocab:
            draft_engine.close()
            reason = f"the draft {args.draft_model} has another vocabulary than the target"
            log.warning("speculation disabled: %s", reason)
            return None, reason
        if args.warmup:  # allocate the draft's compute buffers now, not in the first round
            draft_engine.decode(draft_engine.tokenize("Hydra warm-up: the quick brown fox"), all_logits=False)
            draft_engine.truncate(0)
        drafter = DraftSession(draft_engine)
    lo, hi = sorted((max(1, args.draft_min_tokens), max(1, args.draft_max_tokens)))
    config = ControllerConfig(
        draft_min_tokens=lo,
        draft_max_tokens=hi,
        min_speedup=args.draft_min_speedup,
        resume_speedup=max(args.draft_min_speedup, ControllerConfig.resume_speedup),
        min_acceptance=min(max(args.draft_min_acceptance, 0.0), 1.0),
    )
    return EngineSpeculation(drafter, SpeculationController(config), "remote" if remote else "local", remote), None
