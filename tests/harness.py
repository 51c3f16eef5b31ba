"""Start real `hydra-node serve` processes for tests (separate homes, ports bound to 0)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

START_TIMEOUT_S = 90.0


class NodeProcess:
    def __init__(self, home: Path, *args: str, env: dict | None = None, command: str = "serve"):
        self.command = command
        self.home = Path(home)
        self.args = list(args)
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.api_port = self.console_port = None
        self.log_path = self.home / "stderr.log"

    def start(self, wait: bool = True) -> "NodeProcess":
        self.home.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "hydra_node.cli", self.command, "--home", str(self.home), "--port", "0",
               "--console", "0", "--mesh-host", "127.0.0.1", "--mesh-port", "0", *self.args]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        ports = self.home / "run" / "ports.json"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node exited with {self.proc.returncode}: {self.log()[-3000:]}")
            try:
                d = json.loads(ports.read_text())
                if d.get("pid") == self.proc.pid:
                    self.api_port, self.console_port = d["api_port"], d["console_port"]
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise TimeoutError(f"node did not become ready in {timeout} s: {self.log()[-3000:]}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}/v1"

    def status(self) -> dict:
        code, body = request("GET", self.console_port, "/api/status")
        assert code == 200, body
        return json.loads(body)

    def wait_status(self, pred, timeout: float = 30.0, what: str = "condition") -> dict:
        deadline = time.monotonic() + timeout
        st = None
        while time.monotonic() < deadline:
            try:
                st = self.status()
                if pred(st):
                    return st
            except (OSError, AssertionError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{what} not reached within {timeout} s; last status: {st}")

    def invite(self, ttl_s: float = 3600) -> str:
        code, body = request("POST", self.console_port, "/api/invite", {"ttl_s": ttl_s})
        assert code == 200, body
        return json.loads(body)["token"]

    def runner_pid(self, model_index: int = 0) -> int:
        return self.status()["models"][model_index]["pid"]

    def stop(self, sig=signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise

    def kill_all(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        if getattr(self, "_log", None):
            self._log.close()


def request(method: str, port: int, path: str, body: bytes | str | dict | None = None,
            headers: dict | None = None, timeout: float = 60.0) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    if isinstance(body, dict):
        body = json.dumps(body)
    conn.request(method, path, body=body, headers=headers or {})
    r = conn.getresponse()
    data = r.read().decode("utf-8", "replace")
    conn.close()
    return r.status, data


def pids_with_parent(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    st = f.read()
                ppid = int(st[st.rfind(")") + 2:].split()[1])
                if ppid == pid:
                    out.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return out
