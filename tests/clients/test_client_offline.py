"""The clients stay off the network: the guard works, and importing every client phones nowhere."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from clientkit import guarded_env, netguard, refused

pytestmark = pytest.mark.live

CLIENTS = ("openai", "langchain_openai", "pydantic_ai", "agents", "litellm", "llm")


def test_guard_refuses_and_records_what_leaves_the_loopback():
    before = len(netguard.attempts)
    try:
        with socket.socket() as s, pytest.raises(OSError):
            s.connect(("192.0.2.1", 80))
        with pytest.raises(socket.gaierror):
            socket.getaddrinfo("example.com", 443)
        seen = netguard.attempts[before:]
    finally:
        del netguard.attempts[before:]  # expected here: not a client phoning home
    assert seen == ["192.0.2.1:80 (connect)", "example.com:443 (name lookup)"]
    assert socket.getaddrinfo("127.0.0.1", 80) and socket.getaddrinfo("localhost", 80)


def test_importing_every_client_phones_nowhere(tmp_path):
    env, record = guarded_env(tmp_path)
    code = "import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in CLIENTS)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert refused(record) == [], r.stderr[-3000:]
