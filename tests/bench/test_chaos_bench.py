"""The pure parts of bench/chaos.py: the text diff that counts characters duplicated or lost
against the reference output, the stall measured across a kill, the run's config; and (root only)
bench/_netns.py's forwarder into a network namespace."""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import sys
from pathlib import Path

import pytest

from waiting import poll_until

CHAOS_PATH = Path(__file__).resolve().parents[2] / "bench" / "chaos.py"


def _load_chaos():
    if "chaos" in sys.modules:
        return sys.modules["chaos"]
    sys.path.insert(0, str(CHAOS_PATH.parent))  # its `from _common import ...`
    spec = importlib.util.spec_from_file_location("chaos", CHAOS_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["chaos"] = module  # dataclasses look their module up while executing it
    spec.loader.exec_module(module)
    return module


REF = "Once upon a time, a robot painted."


def test_equal_texts_have_nothing_duplicated_or_lost() -> None:
    assert _load_chaos().text_diff(REF, REF) == (0, 0)
    assert _load_chaos().text_diff("", "") == (0, 0)


def test_a_repeated_piece_counts_as_duplicated() -> None:
    got = REF[:17] + REF[10:17] + REF[17:]  # " a time," sent twice across a continuation
    assert _load_chaos().text_diff(REF, got) == (7, 0)


def test_a_missing_piece_counts_as_lost() -> None:
    got = REF[:10] + REF[17:]
    assert _load_chaos().text_diff(REF, got) == (0, 7)
    assert _load_chaos().text_diff(REF, "") == (0, len(REF))


def test_a_replaced_piece_counts_both_ways() -> None:
    got = REF.replace("robot", "fish")
    assert _load_chaos().text_diff(REF, got) == (4, 5)


def test_the_stall_is_the_gap_across_the_kill() -> None:
    chaos = _load_chaos()
    times = [1.0, 1.1, 1.2, 2.0, 2.1]
    assert chaos.stall_across(times, 1.25) == 2.0 - 1.2
    assert chaos.stall_across(times, 0.5) is None  # nothing before the kill
    assert chaos.stall_across(times, 3.0) is None  # nothing after it


def test_the_first_difference_locates_where_a_text_parts_from_its_reference() -> None:
    chaos = _load_chaos()
    assert chaos.first_difference(REF, REF) is None
    assert chaos.first_difference(REF, REF.replace("robot", "fish")) == REF.index("robot")
    assert chaos.first_difference(REF, REF[:5]) == 5  # cut short
    assert chaos.first_difference(REF[:5], REF) == 5  # ran on


def test_the_run_config_is_one_the_node_accepts_and_acts_on() -> None:
    from hydra_node.config import parse_config_text
    from hydra_node.mesh.link.faults import FaultInjection

    chaos = _load_chaos()
    cfg = parse_config_text(chaos.config_text(token_delay_ms=40, parallel=1, latency_ms=10, rehost_model="org/m.gguf"))
    assert cfg.runner.inject_token_delay_ms == 40 and cfg.defaults.throughput.parallel == 1
    assert cfg.testing.link_faults() == FaultInjection(latency_s=0.01)  # 10 ms one way: 20 ms RTT
    assert dict(cfg.rehost.min_hosts) == {"org/m.gguf": 1}
    plain = parse_config_text(chaos.config_text(token_delay_ms=0, parallel=0, latency_ms=0, rehost_model=None))
    assert plain.testing.link_faults() is None and not plain.rehost.min_hosts
    assert "[testing]" not in chaos.config_text(token_delay_ms=0, parallel=0, latency_ms=0, rehost_model=None)


ECHO = (
    "import socket, sys\n"
    "s = socket.create_server(('127.0.0.1', 0)); print(s.getsockname()[1], flush=True)\n"
    "c, _ = s.accept()\n"
    "while d := c.recv(65536): c.sendall(d.upper())\n"
    "c.close()\n"
)


@pytest.mark.netns  # a process in a namespace: live (tests/live_marker.py)
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root and ip")
def test_the_forwarder_reaches_the_loopback_inside_a_namespace(tmp_path) -> None:
    _load_chaos()
    from _netns import NetLab, NetnsForward

    with NetLab(1, subnet="10.89.0") as lab:
        echo = lab.spawn(1, [sys.executable, "-c", ECHO], tmp_path / "echo.log")
        port = int(poll_until(lambda: (tmp_path / "echo.log").read_text().strip(), timeout_s=30, what="echo up"))
        # nothing listens on that port here: only the namespace's loopback has it
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        fwd = NetnsForward(lab.hosts[0], port)
        with socket.create_connection(("127.0.0.1", fwd.port), timeout=30) as s:
            s.sendall(b"hello ")
            s.sendall(b"netns")
            s.shutdown(socket.SHUT_WR)  # half-close travels through: the echo ends, so does our read
            got = b""
            while d := s.recv(65536):
                got += d
        assert got == b"HELLO NETNS"
        assert echo.wait(30) == 0
        fwd.close()
