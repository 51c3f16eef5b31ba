"""Start real `hydra-node serve` processes for tests (separate homes, ports bound to 0)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from waiting import poll_until

START_TIMEOUT_S = 90.0
#: The API key and the allowed CORS origin of the session's shared keyed node (tests/conftest.py).
SHARED_API_KEY = "shared-test-key"
SHARED_CORS_ORIGIN = "https://app.example"


class NodeProcess:
    def __init__(self, home: Path, *args: str, env: dict | None = None, command: str = "serve"):
        self.command = command
        self.home = Path(home)
        self.args = list(args)
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.api_port = self.console_port = None
        self.log_path = self.home / "stderr.log"

    def command_line(self) -> list[str]:
        """The node's command line (a subclass runs it another way: in a namespace, profiled)."""
        return [
            sys.executable,
            "-m",
            "hydra_node.cli",
            self.command,
            "--home",
            str(self.home),
            "--port",
            "0",
            "--console",
            "0",
            "--mesh-host",
            "127.0.0.1",
            "--mesh-port",
            "0",
            *self.args,
        ]

    def start(self, wait: bool = True) -> "NodeProcess":
        self.home.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.command_line(), stdout=self._log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        """Until the node wrote its bound ports (run/ports.json with its pid); fails at once if it exits."""
        ports = self.home / "run" / "ports.json"

        def bound_ports() -> dict | None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node exited with {self.proc.returncode}: {self.log()[-3000:]}")
            try:
                d = json.loads(ports.read_text())
            except (OSError, ValueError):
                return None
            return d if d.get("pid") == self.proc.pid else None

        try:
            d = poll_until(bound_ports, timeout_s=timeout, what="node ready")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}: {self.log()[-3000:]}") from None
        self.api_port, self.console_port = d["api_port"], d["console_port"]

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
        """The first /api/status for which ``pred`` holds, polled within ``timeout`` seconds."""
        last: list[dict] = []

        def matching_status() -> dict | None:
            try:
                st = self.status()
                last[:] = [st]
                return st if pred(st) else None
            except (OSError, AssertionError):
                return None

        try:
            return poll_until(matching_status, timeout_s=timeout, what=what, interval_s=0.1)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; last status: {last[0] if last else None}") from None

    def join_with(self, token: str) -> "NodeProcess":
        """Join with ``token`` at the next :meth:`start` (a restarted node rejoining through another
        member: the ``--join`` it had is replaced)."""
        args, skip = [], False
        for arg in self.args:
            if skip:
                skip = False
            elif arg == "--join":
                skip = True
            else:
                args.append(arg)
        self.args = [*args, "--join", token]
        return self

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


def request(
    method: str,
    port: int,
    path: str,
    body: bytes | str | dict | None = None,
    headers: dict | None = None,
    timeout: float = 60.0,
) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    if isinstance(body, dict):
        body = json.dumps(body)
    headers = dict(headers or {})
    if method in ("POST", "PUT", "PATCH", "DELETE") and not any(k.lower() == "content-type" for k in headers):
        headers["Content-Type"] = "application/json"  # the management API refuses state changes without it
    conn.request(method, path, body=body, headers=headers)
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
                ppid = int(st[st.rfind(")") + 2 :].split()[1])
                if ppid == pid:
                    out.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return out
