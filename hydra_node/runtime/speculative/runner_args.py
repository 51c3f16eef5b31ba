"""The model runner's draft arguments (``--draft-endpoint``/``--draft-model``/``--draft-*``): how the
node writes them (:func:`argv_for`) and how the runner reads them (:func:`add_runner_args`).

Without llama: the node process imports this (:mod:`.service`), and must not load llama.cpp.
"""

from __future__ import annotations

import argparse

__all__ = ["add_runner_args", "argv_for"]


def add_runner_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculative decoding")
    g.add_argument("--draft-endpoint", default="", help="HOST:PORT of a draft server (a local tunnel port)")
    g.add_argument("--draft-model", default="", help="GGUF file of a local draft model")
    g.add_argument("--draft-min-tokens", type=int, default=1)
    g.add_argument("--draft-max-tokens", type=int, default=8)
    g.add_argument("--draft-min-acceptance", type=float, default=0.0)
    g.add_argument("--draft-min-speedup", type=float, default=1.0)


def argv_for(
    *,
    endpoint: str = "",
    model: str = "",
    min_tokens: int = 1,
    max_tokens: int = 8,
    min_acceptance: float = 0.0,
    min_speedup: float = 1.0,
) -> list[str]:
    """The runner arguments for a draft (the inverse of :func:`add_runner_args`)."""
    argv = ["--draft-endpoint", endpoint] if endpoint else ["--draft-model", model] if model else []
    if argv:
        argv += [
            "--draft-min-tokens",
            str(min_tokens),
            "--draft-max-tokens",
            str(max_tokens),
            "--draft-min-acceptance",
            f"{min_acceptance:g}",
            "--draft-min-speedup",
            f"{min_speedup:g}",
        ]
    return argv
