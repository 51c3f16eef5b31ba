"""The command line: --help everywhere, --version, models, status/stop without a node."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hydra_node import __version__
from hydra_node.cli.main import build_parser, main


def run(*args, **kw):
    return subprocess.run(
        [sys.executable, "-m", "hydra_node.cli", *args], capture_output=True, text=True, timeout=60, **kw
    )


def test_version():
    r = run("--version")
    assert r.returncode == 0 and __version__ in r.stdout


def test_every_command_has_help(capsys):
    """In this process, through the CLI's own ``main`` (one interpreter start per command would cost
    a second each); the tests around it run ``python -m hydra_node.cli`` itself."""
    commands = build_parser()._subparsers._group_actions[0].choices
    assert {"serve", "status", "stop", "models"} <= set(commands)
    for name in commands:
        with pytest.raises(SystemExit) as exited:
            main([name, "--help"])
        assert exited.value.code == 0 and "usage: hydra-node " + name in capsys.readouterr().out, name


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


def _serve_failing_with(monkeypatch, tmp_path, exc: BaseException):
    import trio

    import hydra_node.runtime.rpc.ggml
    from hydra_node.cli import main as cli

    def fail(*_a, **_k):
        raise exc

    monkeypatch.setattr(hydra_node.runtime.rpc.ggml, "check_rpc_support", lambda: None)
    monkeypatch.setattr(trio, "run", fail)
    return cli.main(["serve", "--home", str(tmp_path), "--port", "0", "--console", "0", "--mesh-port", "0"])


def test_serve_reports_every_failure_of_an_exception_group(monkeypatch, tmp_path, capsys):
    from hydra_node.mesh.service import JoinFailed
    from hydra_node.models import ModelNotFound

    group = ExceptionGroup(
        "start-up", [ModelNotFound("no such model: a.gguf"), ExceptionGroup("mesh", [JoinFailed("invite expired")])]
    )
    assert _serve_failing_with(monkeypatch, tmp_path, group) == 1
    err = capsys.readouterr().err
    assert "hydra-node: no such model: a.gguf" in err and "hydra-node: cannot join: invite expired" in err


def test_serve_reraises_a_group_with_an_unexpected_failure(monkeypatch, tmp_path):
    import pytest

    from hydra_node.models import ModelNotFound

    group = ExceptionGroup("start-up", [ModelNotFound("x"), ZeroDivisionError("bug")])
    with pytest.raises(ExceptionGroup):
        _serve_failing_with(monkeypatch, tmp_path, group)


def test_status_and_swap_share_one_client_error_line(capsys):
    from hydra_node.cli.client import NodeClient, NodeUnreachable
    from hydra_node.cli.models import cmd_swap

    client = NodeClient(1)  # nothing listens on port 1
    try:
        client.get("/api/status", timeout=2)
    except NodeUnreachable as exc:
        assert str(exc).startswith("no node answering on 127.0.0.1:1 (")
    else:
        raise AssertionError("port 1 answered")
    args = build_parser().parse_args(["swap", "m.gguf", "--console", "1"])
    assert cmd_swap(args, client) == 1
    assert capsys.readouterr().err.startswith("hydra-node: no node answering on 127.0.0.1:1 (")


def test_serve_help_lists_the_forms_of_model(capsys):
    """Every form README.md and docs/models.md, docs/placement.md document for ``serve --model``."""
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the help text
    for form in ("ID=PATH", "catalogue name", "hf://OWNER/REPO", "https://", "placement:NAME"):
        assert form in out, form


@pytest.mark.parametrize(("model_id", "says"), [("bad\x01id", "non-printable character"), ("mesh", "is reserved")])
def test_serve_refuses_a_bad_model_id_in_one_line(tmp_path, model_id, says):
    """A model id the mesh cannot hold, or one the API keeps for itself, ends ``serve`` with one
    line naming it (it was a traceback for every id but ``mesh``)."""
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    r = run(
        "serve", "--home", str(tmp_path / "home"), "--port", "0", "--console", "0", "--mesh-port", "0",
        "--model", f"{model_id}={gguf}",
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and says in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("hydra-node: model id ")
