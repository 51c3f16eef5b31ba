"""Exact speculative decoding: a draft proposes, the target verifies in one batched pass.

Pure parts (no llama): :mod:`.acceptance` (the acceptance rules), :mod:`.controller`
(adaptive draft length), :mod:`.sampling`, :mod:`.errors`; incremental detokenising is the
runtime's :mod:`hydra_node.runtime.textstream`.  Engines over llama-cpp-python: :mod:`.engine`,
:mod:`.target`, :mod:`.draft`, :mod:`.decoder`, :mod:`.adapter` (decoder events → generation
events), :mod:`.testpair` (test model pairs).  Across machines: :mod:`.wire` (the draft protocol),
:mod:`.draft_server`, :mod:`.remote` (RemoteDrafter), :mod:`.runner_glue` (inside the model
runner), :mod:`.mesh` (the node's side: draft server, tunnel service ``draft``, the runners' draft
port), :mod:`.cli_glue` (``serve --draft/--draft-server/--speculative``).  See docs/speculative.md.
"""

from .adapter import generate_events, sampling_for
from .acceptance import Verdict, verify_greedy, verify_sampled
from .controller import ControllerConfig, SpeculationController, SpeculationStats, expected_tokens, leviathan_speedup
from .decoder import Completion, Emitted, SpeculativeDecoder
from .draft import DraftSession, Drafter, Proposal
from .engine import LlamaEngine
from .errors import ContextFull, DraftProtocolError, SessionStateError, SpeculationError
from .remote import DraftUnavailable, RemoteDrafter
from .sampling import SamplingParams, SparseDist
from .target import TargetSession
from .testpair import ensure_converted_target, ensure_f16_target

__all__ = [
    "Completion", "ContextFull", "ControllerConfig", "DraftProtocolError", "DraftSession", "DraftUnavailable",
    "Drafter", "RemoteDrafter",
    "Emitted", "LlamaEngine", "Proposal", "SamplingParams", "SessionStateError", "SparseDist",
    "SpeculationController", "SpeculationError", "SpeculationStats", "SpeculativeDecoder", "TargetSession",
    "Verdict", "ensure_converted_target", "ensure_f16_target", "expected_tokens", "generate_events", "leviathan_speedup", "sampling_for",
    "verify_greedy", "verify_sampled",
]
