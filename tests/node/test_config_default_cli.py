"""Issue 18 item 5: `serve` prints the API, the console and an invite at start; `status`/`stop` clean up
stale pid files; `client --auto` finds its mesh by discovery."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import NodeProcess
from hydra_node.cli.banner import start_banner
from hydra_node.cli.main import build_parser, node_config_from_args
from hydra_node.config import ConfigError
from hydra_node.mesh.wire.token import parse_invite
from hydra_node.pidfile import read_pidfile, write_pidfile

DISCOVERY = Path(__file__).resolve().parent.parent / "discovery"
SEED_PROFILE = Path(__file__).resolve().parent / "fixtures" / "seed_starting_profile.toml"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hydra_node.cli", *args], capture_output=True, text=True, timeout=60)


def test_start_banner_text():
    text = start_banner("http://127.0.0.1:9337/v1", "http://127.0.0.1:3131", False, "TOKEN", "host")
    assert "OpenAI API   http://127.0.0.1:9337/v1" in text and "console      http://127.0.0.1:3131" in text
    assert "invite       TOKEN" in text
    assert "management   http://127.0.0.1:3131 (headless" in start_banner(
        "a", "http://127.0.0.1:3131", True, None, "host"
    )
    assert "invite" not in start_banner("a", "b", False, None, "client")


def test_serve_prints_its_urls_and_an_invite_and_reports_the_default_file(tmp_path):
    home = tmp_path / "a"
    home.mkdir()
    (home / "config.toml").write_text(SEED_PROFILE.read_text())  # the seed README's starting profile
    node = NodeProcess(home, "--no-model")
    try:
        node.start()
        st = node.status()
        out = node.log()
        assert st["config"]["files"] == [str(home / "config.toml")]
        reserved = st["config"]["reserved_keys"]
        assert "defaults.skippy.prefill_chunking" in reserved and "defaults.hardware.device" in reserved
        assert f"event=config_reserved_keys keys={','.join(reserved)}" in out
        assert f"OpenAI API   http://127.0.0.1:{node.api_port}/v1" in out
        assert f"console      http://127.0.0.1:{node.console_port}" in out
        token = re.search(r"invite       (\S+)", out).group(1)
        assert parse_invite(token, time.time()).mesh_id == st["mesh"]["mesh_id"]
    finally:
        node.kill_all()


def _dead_process_pidfile(path: Path, kind: str) -> int:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        write_pidfile(path, proc.pid, ["hydra-node", "serve"], kind=kind)
    finally:
        proc.kill()
        proc.wait()
    return proc.pid


@pytest.mark.parametrize("command", ["status", "stop"])
def test_status_and_stop_clean_up_stale_pid_files(tmp_path, command):
    run = tmp_path / "run"
    pid = _dead_process_pidfile(run / "node.pid", "node")
    _dead_process_pidfile(run / "runner-x.pid", "runner")
    (run / "ports.json").write_text('{"pid": %d, "console_port": 1}' % pid)
    r = run_cli(command, "--home", str(tmp_path), *(["--console", "9"] if command == "status" else []))
    assert r.returncode == 1
    assert f"removed stale pid file node.pid (pid {pid} gone)" in r.stderr and "runner-x.pid" in r.stderr
    assert sorted(p.name for p in run.iterdir()) == []
    assert read_pidfile(run / "node.pid") is None


def test_client_takes_auto_instead_of_an_invite(tmp_path):
    parse = build_parser().parse_args
    cfg = node_config_from_args(parse(["client", "--home", str(tmp_path), "--auto", "--mesh-discovery-mode", "nostr"]))
    assert cfg.role == "client" and cfg.discovery is not None and cfg.discovery.auto
    with pytest.raises(ConfigError, match="or --auto"):
        node_config_from_args(parse(["client", "--home", str(tmp_path)]))
    with pytest.raises(ConfigError, match="--publish"):
        node_config_from_args(parse(["client", "--home", str(tmp_path), "--auto", "--publish"]))


@pytest.fixture
def relay_url():
    proc = subprocess.Popen(
        [sys.executable, str(DISCOVERY / "local_relay_process.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("ws://127.0.0.1:"), line
        yield line.strip()
    finally:
        proc.stdin.close()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_client_auto_joins_the_published_mesh(tmp_path, relay_url):
    host = NodeProcess(
        tmp_path / "host", "--no-model", "--publish", "--mesh-discovery-mode", "nostr", "--nostr-relay", relay_url
    )
    client = NodeProcess(
        tmp_path / "client", "--auto", "--mesh-discovery-mode", "nostr", "--nostr-relay", relay_url, command="client"
    )
    try:
        host.start()
        h = host.wait_status(
            lambda s: (s["discovery"]["nostr"] or {}).get("relays", [{}])[0].get("ok_accepted", 0) >= 1,
            timeout=20,
            what="listing accepted by the relay",
        )
        client.start()
        st = client.wait_status(
            lambda s: h["node_id"] in {p["id"] for p in s["peers"] if p["state"] == "alive"},
            timeout=20,
            what="client linked to the host",
        )
        assert st["role"] == "client" and st["mesh"]["mesh_id"] == h["mesh"]["mesh_id"]
        assert st["discovery"]["auto_result"]["outcome"] == "joined"
    finally:
        client.kill_all()
        host.kill_all()
