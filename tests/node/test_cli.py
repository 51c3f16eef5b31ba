"""The command line: --help everywhere, --version, models, status/stop without a node."""

from __future__ import annotations

import subprocess
import sys


from hydra_node import __version__
from hydra_node.cli import build_parser


def run(*args, **kw):
    return subprocess.run([sys.executable, "-m", "hydra_node.cli", *args], capture_output=True, text=True,
                          timeout=60, **kw)


def test_version():
    r = run("--version")
    assert r.returncode == 0 and __version__ in r.stdout


def test_every_command_has_help():
    commands = build_parser()._subparsers._group_actions[0].choices
    assert {"serve", "status", "stop", "models"} <= set(commands)
    for name in commands:
        r = run(name, "--help")
        assert r.returncode == 0 and "usage: hydra-node " + name in r.stdout, name


def test_no_command_prints_help_and_fails():
    r = run()
    assert r.returncode == 2 and "serve" in r.stdout


def test_models_lists_bundled_model():
    r = run("models")
    assert r.returncode == 0 and "SmolLM2-135M-Instruct-Q4_1" in r.stdout


def test_status_and_stop_without_a_node_fail_clearly(tmp_path):
    r = run("stop", "--home", str(tmp_path))
    assert r.returncode == 1 and "no node is running" in r.stderr
    r = run("status", "--console", "1")
    assert r.returncode == 1 and "no node answering" in r.stderr


def test_bad_config_file_is_a_usage_error(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[scheduler]\nmode = 'sideways'\n")
    r = run("serve", "--home", str(tmp_path), "--config", str(cfg))
    assert r.returncode == 2 and "[scheduler].mode" in r.stderr
