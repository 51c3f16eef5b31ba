"""Speculative decoding inside the child processes (over llama-cpp-python).

:mod:`.llama_engine` (one llama.cpp model and context with explicit KV positions), :mod:`.draft`
(the drafting side), :mod:`.remote` (a drafter across a TCP connection), :mod:`.draft_server` (the
draft server process), :mod:`.assemble` (builds the batch engine's speculation inside the model
runner), and the pure parts: :mod:`.acceptance` (the acceptance rules), :mod:`.controller`
(adaptive draft length), :mod:`.sampling`. The node side is :mod:`hydra_node.runtime.speculative`.
"""
