"""Fixtures of the console tests: Debian's chromium (installed when absent and running as root),
and where screenshots go."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from cdp import find_chromium

ROOT = Path(__file__).resolve().parents[2]
#: Screenshots of every page at both viewports (build output, not committed).
SCREENSHOTS = ROOT / "build" / "screenshots"


def _apt(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["apt-get", *args],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )


@pytest.fixture(scope="session")
def chromium() -> str:
    """The path of a headless-capable Chromium; installs Debian's package when it is missing."""
    path = find_chromium()
    if path:
        return path
    if not (hasattr(os, "geteuid") and os.geteuid() == 0):
        pytest.skip(
            "chromium is not installed and these tests are not running as root to install it (apt-get install chromium)"
        )
    try:
        r = _apt("install", "-y", "-q", "chromium")
        if r.returncode != 0:  # an empty or stale package list: refresh it once
            _apt("update", "-q")
            r = _apt("install", "-y", "-q", "chromium")
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"chromium could not be installed: {exc}")
    path = find_chromium()
    if not path:
        pytest.skip(f"chromium could not be installed (apt-get exit {r.returncode}): {r.stderr[-500:]}")
    return path


@pytest.fixture(scope="session")
def screenshots() -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS
