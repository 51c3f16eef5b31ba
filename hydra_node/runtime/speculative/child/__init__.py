"""The child-process side of speculative decoding: llama engines (`engine`, `target`, `draft`,
`decoder`, `adapter`), the draft server process (`draft_server`), the runner's remote drafter
(`remote`) and its glue inside the model runner (`runner_glue`), and test model pairs
(`testpair`). The node side is `hydra_node.runtime.speculative.service`."""
