"""Files the node keeps under its home: pid files never make us signal a stranger (issue 14 item 7), an unusable home is one clear line, node.log rotates."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from hydra_node.pidfile import read_pidfile, reap_stale, signal_recorded, write_pidfile


def _bystander() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_stop_never_signals_a_pid_whose_file_has_no_start_time(tmp_path):
    victim = _bystander()
    try:
        run = tmp_path / "run"
        run.mkdir()
        (run / "node.pid").write_text(
            json.dumps({"pid": victim.pid, "argv": [], "owner_pid": victim.pid, "kind": "node"})
        )  # no start_time: proves nothing
        rec = read_pidfile(run / "node.pid")
        out = subprocess.run(
            [sys.executable, "-m", "hydra_node.cli", "stop", "--home", str(tmp_path), "--timeout", "1"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode != 0 and "no node is running" in out.stderr
        assert victim.poll() is None  # still running: never signalled
        assert not signal_recorded(rec, 15) and victim.poll() is None
        assert not (run / "node.pid").exists()  # stop cleaned the stale file up (issue 18 item 5)
        # a runner-kind file without a start time is only removed at the next start, never acted on
        (run / "runner-x.pid").write_text(json.dumps({"pid": victim.pid, "argv": [], "owner_pid": 1, "kind": "runner"}))
        reap_stale(run)
        assert victim.poll() is None and not (run / "runner-x.pid").exists()
    finally:
        victim.kill()
        victim.wait()


def test_a_recorded_process_is_signalled_and_a_recycled_start_time_is_not(tmp_path):
    proc = _bystander()
    try:
        rec = write_pidfile(tmp_path / "x.pid", proc.pid, ["sleep"], kind="runner", owner_pid=os.getpid())
        forged = read_pidfile(tmp_path / "x.pid").__class__(**{**rec.__dict__, "start_time": rec.start_time + 1})
        assert not signal_recorded(forged, 15) and proc.poll() is None
        assert signal_recorded(rec, 15)
        assert proc.wait(timeout=10) == -15
    finally:
        proc.kill()
        proc.wait()


def test_an_unusable_home_is_one_clear_line(tmp_path):
    home = tmp_path / "ro"
    home.mkdir()
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    for bad in (blocker, blocker / "sub"):
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "hydra_node.cli",
                "serve",
                "--home",
                str(bad),
                "--port",
                "0",
                "--console",
                "0",
                "--mesh-port",
                "0",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 2 and "Traceback" not in out.stderr
        assert out.stderr.count("\n") == 1 and "is not usable" in out.stderr and "--home" in out.stderr


def test_node_log_rotates(tmp_path):
    import logging

    from hydra_node import logging_setup

    old = logging_setup.LOG_MAX_BYTES
    logging_setup.LOG_MAX_BYTES = 2000
    try:
        logging_setup.setup_logging("kv", "info", tmp_path / "logs" / "node.log")
        for i in range(500):
            logging.getLogger("hydra.test").info("event=filler i=%d %s", i, "x" * 40)
    finally:
        logging_setup.LOG_MAX_BYTES = old
        logging.getLogger().handlers.clear()
    logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert logs == ["node.log", "node.log.1", "node.log.2", "node.log.3"]
    assert all((tmp_path / "logs" / n).stat().st_size <= 2200 for n in logs)


def test_model_ids_become_distinct_bounded_ascii_file_names():
    from hydra_node.runtime.runner.records import safe_file_part as _safe

    ids = ["a/b", "a_b", "a:b", "é" * 128, "x" * 128, "hf://org/model-Q4.gguf"]
    names = [_safe(i) for i in ids]
    assert len(set(names)) == len(ids)
    assert all(n.isascii() and len(n.encode()) <= 64 and "/" not in n for n in names)
