"""`make install GPU=cuda|vulkan` (issue 12 item 7): each backend builds llama-cpp-python with RPC plus
that backend into its own cached wheel; the configuration path is checked here with `make -n`
(nothing is built), the build itself needs the backend's toolkit."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _dry_run(*args: str, home: Path) -> subprocess.CompletedProcess:
    # -B: print every step as if nothing were built yet (this checkout's .venv may be up to date)
    return subprocess.run(
        ["make", "-n", "-B", "-C", str(ROOT), "install", *args, f"HOME={home}"],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("gpu,flag", [("cuda", "-DGGML_CUDA=on"), ("vulkan", "-DGGML_VULKAN=on")])
def test_a_gpu_backend_builds_its_own_wheel_with_rpc(gpu, flag, tmp_path):
    out = _dry_run(f"GPU={gpu}", home=tmp_path)
    assert out.returncode == 0, out.stderr
    assert f'CMAKE_ARGS="-DGGML_RPC=on -DGGML_NATIVE=off {flag}"' in out.stdout
    assert f"llama-cpp-python-0.3.36-rpc-{gpu}" in out.stdout and ".hydra-installed-rpc-" in out.stdout


def test_the_cpu_build_is_the_default(tmp_path):
    out = _dry_run(home=tmp_path)
    assert out.returncode == 0, out.stderr
    assert 'CMAKE_ARGS="-DGGML_RPC=on -DGGML_NATIVE=off "' in out.stdout
    assert "llama-cpp-python-0.3.36-rpc " in out.stdout or "llama-cpp-python-0.3.36-rpc/" in out.stdout


def test_an_unknown_backend_is_refused_with_the_choices(tmp_path):
    out = _dry_run("GPU=metal", home=tmp_path)
    assert out.returncode != 0 and "use GPU=cuda, GPU=vulkan" in out.stderr
