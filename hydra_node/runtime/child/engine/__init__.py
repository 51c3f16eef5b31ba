"""The continuous-batching engine of a model runner: a pure slot scheduler (slots) and its
llama.cpp driver (batch), which runs inside the runner child, and its figures (stats: step
counters and the cadence of the ``stats`` frames the child sends the node)."""
