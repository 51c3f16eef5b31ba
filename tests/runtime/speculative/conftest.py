"""The speculative test pair: F16 target converted from the bundled Q4_1 draft (same vocabulary)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hydra_node.runtime.child.speculative.llama_engine import LlamaEngine

from spec_standalone.target import TargetSession

from spec_pair import ensure_f16_target

N_CTX = 512
N_THREADS = 1


@pytest.fixture(scope="session")
def target_path(model_path: Path) -> Path:
    return ensure_f16_target(model_path)


@pytest.fixture(scope="session")
def target_engine(target_path: Path):
    engine = LlamaEngine(target_path, n_ctx=N_CTX, n_threads=N_THREADS)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def draft_engine(model_path: Path):
    engine = LlamaEngine(model_path, n_ctx=N_CTX, n_threads=N_THREADS)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def twin_engine(target_path: Path):
    """A second engine on the target's own file: a draft that agrees with the target."""
    engine = LlamaEngine(target_path, n_ctx=N_CTX, n_threads=N_THREADS)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def reference(target_engine):
    """Greedy output of the target alone, per (prompt text, max_tokens), computed once."""
    cache: dict[tuple[str, int], list[int]] = {}

    def get(prompt: str, max_tokens: int) -> list[int]:
        key = (prompt, max_tokens)
        if key not in cache:
            session = TargetSession(target_engine)
            session.start(target_engine.tokenize(prompt))
            out: list[int] = []
            while len(out) < max_tokens:
                tok = session.step()
                if target_engine.is_eog(tok):
                    break
                out.append(tok)
            cache[key] = out
        return cache[key]

    return get
