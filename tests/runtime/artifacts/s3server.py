"""A real S3-compatible server for the artifact tests: moto's standalone server as a child process.

``s3_server`` (session-scoped) starts ``python -m moto.server`` on a free loopback port, waits until
it answers, and sets test credentials in the environment for boto3's default chain (restored
after). Each test takes a fresh bucket from ``S3Server.new_bucket()``, so tests never share state.
The tests skip (with the reason) only when moto is not installed or the server does not start.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = ["TEST_CREDENTIALS", "S3Server", "s3_server", "start_moto", "stop_moto"]

#: What boto3 finds in the environment while the server runs (moto accepts any keys).
TEST_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "hydra-test-key",
    "AWS_SECRET_ACCESS_KEY": "hydra-test-secret",
    "AWS_EC2_METADATA_DISABLED": "true",
}
#: How long the server may take to answer its first request (a cold import of moto and flask).
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    region: str = "us-east-1"

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name=self.region, config=Config(s3={"addressing_style": "path"})
        )

    def new_bucket(self, tag: str = "t") -> str:
        name = f"hydra-{tag}-{secrets.token_hex(4)}"
        self.client().create_bucket(Bucket=name)
        return name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as r:
            return r.status == 200
    except OSError:
        return False


def start_moto(log_path: Path) -> tuple[subprocess.Popen, str]:
    """Start moto's S3 server on a free loopback port (output to ``log_path``); (process, endpoint)
    once it answers. RuntimeError (the process stopped) if it does not start."""
    port = _free_port()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **TEST_CREDENTIALS},
        )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _answers(f"{endpoint}/moto-api/"):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_moto(proc)
            tail = log_path.read_text(errors="replace")[-800:]
            raise RuntimeError(f"the moto S3 server did not start (exit {proc.returncode}): {tail}")
        time.sleep(0.05)
    return proc, endpoint


def stop_moto(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    try:
        import moto.server  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"moto[server] is not installed ({exc}); pip install 'moto[server]'")
    saved = {k: os.environ.get(k) for k in TEST_CREDENTIALS}
    os.environ.update(TEST_CREDENTIALS)
    try:
        try:
            proc, endpoint = start_moto(tmp_path_factory.mktemp("moto") / "server.log")
        except RuntimeError as exc:
            pytest.skip(str(exc))
        try:
            yield S3Server(endpoint)
        finally:
            stop_moto(proc)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
