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

import importlib

#: Public name -> the module that defines it, imported on first use (PEP 562): importing this
#: package (the node does, for the draft service) must not load llama-cpp-python, which on a CUDA
#: build initialises CUDA in the node process (about 550 MiB of RSS measured on an H200).
_WHERE = {
    "Completion": "hydra_node.runtime.speculative.child.decoder",
    "ContextFull": "hydra_node.runtime.speculative.errors",
    "ControllerConfig": "hydra_node.runtime.speculative.controller",
    "DraftProtocolError": "hydra_node.runtime.speculative.errors",
    "DraftSession": "hydra_node.runtime.speculative.child.draft",
    "DraftUnavailable": "hydra_node.runtime.speculative.child.remote",
    "Drafter": "hydra_node.runtime.speculative.child.draft",
    "Emitted": "hydra_node.runtime.speculative.child.decoder",
    "LlamaEngine": "hydra_node.runtime.speculative.child.engine",
    "Proposal": "hydra_node.runtime.speculative.child.draft",
    "RemoteDrafter": "hydra_node.runtime.speculative.child.remote",
    "SamplingParams": "hydra_node.runtime.speculative.sampling",
    "SessionStateError": "hydra_node.runtime.speculative.errors",
    "SparseDist": "hydra_node.runtime.speculative.sampling",
    "SpeculationController": "hydra_node.runtime.speculative.controller",
    "SpeculationError": "hydra_node.runtime.speculative.errors",
    "SpeculationStats": "hydra_node.runtime.speculative.controller",
    "SpeculativeDecoder": "hydra_node.runtime.speculative.child.decoder",
    "TargetSession": "hydra_node.runtime.speculative.child.target",
    "Verdict": "hydra_node.runtime.speculative.acceptance",
    "ensure_converted_target": "hydra_node.runtime.speculative.child.testpair",
    "ensure_f16_target": "hydra_node.runtime.speculative.child.testpair",
    "expected_tokens": "hydra_node.runtime.speculative.controller",
    "generate_events": "hydra_node.runtime.speculative.child.adapter",
    "leviathan_speedup": "hydra_node.runtime.speculative.controller",
    "sampling_for": "hydra_node.runtime.speculative.child.adapter",
    "verify_greedy": "hydra_node.runtime.speculative.acceptance",
    "verify_sampled": "hydra_node.runtime.speculative.acceptance",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
