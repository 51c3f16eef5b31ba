"""The coding agents of ``tests/clients/test_agents*.py``: installed from the npm registry into a
test cache, and run through their ``hydra`` launchers in a scratch HOME.

The cache is ``$HYDRA_TEST_NPM_DIR`` or ``~/.cache/hydra-node/npm``; a package that cannot be
installed there (no ``npm``, no registry) makes its tests skip, saying why. Each run is bounded:
:func:`run_until` reads the agent's JSON lines and stops it as soon as what the test waits for
has come (an agent whose tool call is forced would call tools for ever), or when the bound
passes (the test then fails, showing what came).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import pytest

__all__ = [
    "AGENT_PACKAGES",
    "AGENT_TIMEOUT_S",
    "Run",
    "agent_env",
    "install_agents",
    "launcher",
    "require",
    "run_until",
]

#: The packages, pinned (the versions these tests were written against).
AGENT_PACKAGES = {
    "claude": "@anthropic-ai/claude-code@2.1.328",
    "opencode": "opencode-ai@1.18.33",
    "pi": "@mariozechner/pi-coding-agent@0.73.1",
}
#: Bound on one agent run (a few model calls on the bundled model, on a shared CPU).
AGENT_TIMEOUT_S = 240.0
#: Bound on installing the packages (cold cache).
INSTALL_TIMEOUT_S = 900.0


def npm_dir() -> Path:
    return Path(os.environ.get("HYDRA_TEST_NPM_DIR") or Path.home() / ".cache" / "hydra-node" / "npm")


def install_agents() -> tuple[Path, dict[str, str]]:
    """``(bin folder, {tool: why it is missing})``: installs what is not there yet."""
    root = npm_dir()
    bin_dir = root / "node_modules" / ".bin"
    missing = [t for t in AGENT_PACKAGES if not _installed(root, t)]
    if not missing:
        return bin_dir, {}
    npm = shutil.which("npm")
    if npm is None:
        return bin_dir, {t: "npm is not installed" for t in missing}
    root.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(
            [
                npm,
                "install",
                "--prefix",
                str(root),
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
                *(AGENT_PACKAGES[t] for t in missing),
            ],
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
        )
        why = proc.stderr.strip().splitlines()[-1:] if proc.returncode else []
    except subprocess.TimeoutExpired:
        why = [f"npm install took over {INSTALL_TIMEOUT_S:.0f} s"]
    return bin_dir, {
        t: f"{AGENT_PACKAGES[t]} could not be installed from the npm registry ({' '.join(why)})"
        for t in missing
        if not _installed(root, t)
    }


def _installed(root: Path, tool: str) -> bool:
    name, _, version = AGENT_PACKAGES[tool].rpartition("@")
    try:
        meta = json.loads((root / "node_modules" / name / "package.json").read_text())
    except (OSError, ValueError):
        return False
    return meta.get("version") == version and (root / "node_modules" / ".bin" / tool).exists()


def agent_env(bin_dir: Path, home: Path, **extra: str) -> dict:
    """A scratch HOME (the agents keep their state there, never in the real one) with the agents on PATH."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENCODE_", "PI_", "GOOSE_"))}
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_DATA_HOME=str(home / ".local/share"),
        XDG_CACHE_HOME=str(home / ".cache"),
        XDG_STATE_HOME=str(home / ".local/state"),
        PATH=os.pathsep.join([str(bin_dir), env.get("PATH", "")]),
        DO_NOT_TRACK="1",
        OPENCODE_DISABLE_AUTOUPDATE="1",
        OPENCODE_DISABLE_MODELS_FETCH="1",
        **extra,
    )
    return env


def launcher(tool: str, node_url: str, home: Path, *options: str) -> list[str]:
    return [sys.executable, "-m", "hydra_node.cli", tool, "--node", node_url, "--home", str(home / "hydra"), *options]


class Run:
    """What an agent printed: its JSON lines (``events``), other output lines, and stderr."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.text: list[str] = []
        self.stderr = ""
        self.returncode: int | None = None

    def __repr__(self) -> str:
        return (
            f"Run(rc={self.returncode}, events={json.dumps(self.events)[-3000:]}, text={self.text[-20:]}, "
            f"stderr={self.stderr[-2000:]!r})"
        )


def run_until(
    argv: list[str], env: dict, cwd: Path, done: Callable[[dict], bool], timeout: float = AGENT_TIMEOUT_S
) -> tuple[Run, dict | None]:
    """Run ``argv`` until it exits or one of its JSON lines satisfies ``done`` (then it is stopped);
    returns what it printed and that line (None if none came within ``timeout``)."""
    env = {**env, "PWD": str(cwd)}  # tools that read PWD (opencode) would otherwise take this repo as the project
    proc = subprocess.Popen(
        argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    run, found = Run(), None
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)
    reader.start()
    timer = threading.Timer(timeout, lambda: _stop(proc))
    timer.start()
    try:
        for line in proc.stdout:
            line = line.strip()
            try:
                ev = json.loads(line)
            except ValueError:
                run.text.append(line)
                continue
            if isinstance(ev, dict):
                run.events.append(ev)
                if found is None and done(ev):
                    found = ev
                    _stop(proc)
                    break
    finally:
        timer.cancel()
        _stop(proc)
        run.returncode = proc.wait()
        reader.join(5)
        run.stderr = "".join(err)
    return run, found


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the agent's process group, then SIGKILL to whatever of the group is left, even
    when the agent itself has exited: its wrapper can exit at once and leave the real binary
    behind (an opencode outlived its test by an hour before this)."""
    try:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + 5
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def require(missing: dict[str, str], tool: str) -> None:
    if tool in missing:
        pytest.skip(missing[tool])
