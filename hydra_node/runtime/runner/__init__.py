"""The model runner: a child process running llama-cpp-python (`main`), the node-side
`RunnerSupervisor` (`supervisor`), the frames between them (`channel`) and incremental
detokenising (`textstream`)."""
