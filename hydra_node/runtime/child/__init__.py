"""Code that runs in the child processes, never in the node (they load llama.cpp and numpy).

:mod:`.main` (the model runner's entry point), :mod:`.engine_loop` (its main loop),
:mod:`.engine` (continuous batching: slots, batch, sampler, grammar, speculation),
:mod:`.speculative` (llama engines, the draft server, the remote drafter), :mod:`.embed`,
:mod:`.kv_jobs` + :mod:`.kv_probe` (KV export/import), :mod:`.chat_prompt` + :mod:`.tool_format`
(chat templates), :mod:`.textstream` (incremental detokenising), :mod:`.rpc_coordinator` (the
runner's RPC devices), :mod:`.process` (child start-up: stdio, parent death).

The node side imports only the vocabulary both ends speak: :mod:`.channel` (runner frames) and
:mod:`.stats` (the figures they carry); ``tests/test_layers.py`` enforces it.
"""
