"""`hydra setup`: the real machine's checks as JSON, and the starter config file it writes (never over
an existing one without --force). The verdicts themselves are tested in test_models_core.py."""

from __future__ import annotations

import json
import subprocess
import sys

from hydra_node.config import load_config_file


def setup(*args):
    return subprocess.run(
        [sys.executable, "-m", "hydra_node.cli", "setup", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_setup_checks_this_machine_and_writes_a_starter_config_once(tmp_path):
    r = setup("--json", "--home", str(tmp_path))
    out = json.loads(r.stdout)
    names = {c["name"]: c for c in out["checks"]}
    assert {"python", "compiler", "cmake", "rpc", "gpu", "memory", "disk"} <= set(names)
    assert names["rpc"]["status"] == "ok"  # the test environment is built by `make install`
    assert r.returncode == (1 if any(c["status"] == "missing" for c in out["checks"]) else 0)
    cfg_path = tmp_path / "config.toml"
    assert out["config"] == {"path": str(cfg_path), "written": True, "existed": False, "backup": None}
    assert load_config_file(cfg_path).defaults.model_fit.ctx_size == 4096  # a valid config file
    cfg_path.write_text("# mine\n")
    r = setup("--home", str(tmp_path))
    assert "kept" in r.stdout and cfg_path.read_text() == "# mine\n"
    r = setup("--home", str(tmp_path), "--force")
    assert "wrote" in r.stdout and "[defaults.throughput]" in cfg_path.read_text()
    backup = tmp_path / "config.toml.bak"
    assert f"kept as {backup}" in r.stdout and backup.read_text() == "# mine\n"  # --force kept the old file
    r = setup("--json", "--home", str(tmp_path), "--force")  # a second --force never overwrites that backup
    assert json.loads(r.stdout)["config"]["backup"] == str(tmp_path / "config.toml.bak.1")
    assert backup.read_text() == "# mine\n"
