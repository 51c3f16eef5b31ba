"""Exact speculative decoding, the node side: a draft proposes, the target verifies in one batched pass.

:mod:`.service` (the node's part: the draft server process, the ``draft`` tunnel service, the
runners' draft port, mode choice), :mod:`.wire` (the draft protocol, shared with the children),
:mod:`.params` (sampling parameters, numpy-free), :mod:`.runner_args` (the runner's speculation
flags), :mod:`.errors`.

The child-process side (llama engines, the draft server process, the runner's remote drafter,
acceptance rules, the adaptive controller) is :mod:`hydra_node.runtime.child.speculative`; the
``serve --draft/--draft-server/--speculative`` options are :mod:`hydra_node.cli.speculative`.
See docs/speculative.md.
"""
