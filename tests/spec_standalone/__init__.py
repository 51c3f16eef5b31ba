"""The first, standalone speculative decoder (target session, decoder rounds, generate adapter): used only by
tests/speculative and bench/speculative.py, which compare it with the batched engine's speculation."""
