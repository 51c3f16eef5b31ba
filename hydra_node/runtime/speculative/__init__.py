"""Exact speculative decoding: a draft proposes, the target verifies in one batched pass.

Node side (this package): :mod:`.service` (the node's part: the draft server process, the
``draft`` tunnel service, the runners' draft port, mode choice), :mod:`.wire` (the draft
protocol), and the pure parts with no llama: :mod:`.acceptance` (the acceptance rules),
:mod:`.controller` (adaptive draft length), :mod:`.sampling`, :mod:`.errors`.

Child-process side (:mod:`.child`): engines over llama-cpp-python (``engine``, ``target``,
``draft``, ``decoder``, ``adapter``), the draft server process (``draft_server``), the runner's
``RemoteDrafter`` (``remote``) and its glue inside the model runner (``runner_glue``), test model
pairs (``testpair``).  Incremental detokenising is :mod:`hydra_node.runtime.runner.textstream`;
the ``serve --draft/--draft-server/--speculative`` options are :mod:`hydra_node.cli.speculative`.
See docs/speculative.md.
"""

from hydra_node.runtime.speculative.child.adapter import generate_events, sampling_for
from hydra_node.runtime.speculative.acceptance import Verdict, verify_greedy, verify_sampled
from hydra_node.runtime.speculative.controller import ControllerConfig, SpeculationController, SpeculationStats, expected_tokens, leviathan_speedup
from hydra_node.runtime.speculative.child.decoder import Completion, Emitted, SpeculativeDecoder
from hydra_node.runtime.speculative.child.draft import DraftSession, Drafter, Proposal
from hydra_node.runtime.speculative.child.engine import LlamaEngine
from hydra_node.runtime.speculative.errors import ContextFull, DraftProtocolError, SessionStateError, SpeculationError
from hydra_node.runtime.speculative.child.remote import DraftUnavailable, RemoteDrafter
from hydra_node.runtime.speculative.sampling import SamplingParams, SparseDist
from hydra_node.runtime.speculative.child.target import TargetSession
from hydra_node.runtime.speculative.child.testpair import ensure_converted_target, ensure_f16_target

__all__ = [
    "Completion", "ContextFull", "ControllerConfig", "DraftProtocolError", "DraftSession", "DraftUnavailable",
    "Drafter", "RemoteDrafter",
    "Emitted", "LlamaEngine", "Proposal", "SamplingParams", "SessionStateError", "SparseDist",
    "SpeculationController", "SpeculationError", "SpeculationStats", "SpeculativeDecoder", "TargetSession",
    "Verdict", "ensure_converted_target", "ensure_f16_target", "expected_tokens", "generate_events", "leviathan_speedup", "sampling_for",
    "verify_greedy", "verify_sampled",
]
