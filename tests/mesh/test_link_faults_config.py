"""``[testing]`` link fault injection (issue 26 item 6): configured latency delays a real link,
the CLI hands it to the mesh, the node warns at start, and bad values are refused by key.

The links run in one trio process on the autojump clock (as tests/mesh/test_mesh_service.py), so
the delay line's waits pass in virtual time and the RTT bound is exact, not a timing guess.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import trio
from nacl.signing import SigningKey

from waiting import wait_until

from hydra_node.cli.main import build_parser, node_config_from_args
from hydra_node.config import ConfigError, parse_config_text
from hydra_node.mesh.announcer import AnnouncementContent
from hydra_node.mesh.joining import JoinPlan
from hydra_node.mesh.link.faults import FaultInjection
from hydra_node.mesh.service import MeshService, MeshSettings

JOIN_S = 20.0


def _service(home: Path, name: str, fault: FaultInjection | None) -> MeshService:
    return MeshService(
        signing_key=SigningKey.generate(),
        state_dir=home / "mesh",
        settings=MeshSettings(listen_host="127.0.0.1", listen_port=0, fault=fault),
        announcement=lambda: AnnouncementContent(),
        name=name,
    )


async def _rtt_ms(nursery: trio.Nursery, home: Path, fault: FaultInjection | None) -> float:
    """The RTT the mesh reports on B's link to A, where A's links inject ``fault``."""
    a = await nursery.start(_service(home / "a", "alpha", fault).run, JoinPlan())
    b = await nursery.start(_service(home / "b", "beta", None).run, JoinPlan.from_tokens([a.invite(600)], time.time()))
    with trio.fail_after(JOIN_S):
        await wait_until(lambda: (link := b.link(a.node_id)) is not None and link.rtt_ms is not None)
    link = b.link(a.node_id)
    assert link is not None and link.rtt_ms is not None
    return link.rtt_ms


async def test_configured_latency_delays_the_link_and_is_warned_about(nursery, tmp_path, autojump_clock, caplog):
    fault = parse_config_text("[testing]\nlink_latency_ms = 200\n").testing.link_faults()
    assert fault == FaultInjection(latency_s=0.2)
    caplog.set_level(logging.WARNING, logger="hydra.mesh")
    plain = await _rtt_ms(nursery, tmp_path / "plain", None)
    assert not [r for r in caplog.records if "link fault injection" in r.getMessage()]
    slowed = await _rtt_ms(nursery, tmp_path / "slowed", fault)
    # A's pong to B's ping waits in A's delay line: one way, 200 ms
    assert slowed >= 150 and slowed - plain >= 150, (plain, slowed)
    warnings = [r.getMessage() for r in caplog.records if "link fault injection is on" in r.getMessage()]
    assert warnings == [
        "event=link_fault_injection latency_ms=200 jitter_ms=0 message_loss=0 frame_loss=0: "
        "link fault injection is on (testing only)"
    ]


def test_the_cli_hands_the_testing_section_to_the_mesh(tmp_path):
    def mesh_fault(text: str) -> FaultInjection | None:
        cfg = tmp_path / "hydra.toml"
        cfg.write_text(text)
        args = build_parser().parse_args(["serve", "--home", str(tmp_path / "home"), "--config", str(cfg)])
        mesh = node_config_from_args(args).mesh
        assert mesh is not None
        return mesh.fault

    assert mesh_fault("") is None  # the default: nothing injected, no warning
    assert mesh_fault("[testing]\nlink_latency_ms = 0\n") is None
    assert mesh_fault(
        "[testing]\nlink_latency_ms = 10\nlink_jitter_ms = 5\nlink_message_loss = 0.1\nlink_frame_loss = 0.01\n"
    ) == FaultInjection(latency_s=0.01, jitter_s=0.005, message_loss=0.1, frame_loss=0.01)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("link_latency_ms = -1", "[testing].link_latency_ms: must be between 0 and 60000 milliseconds, not -1.0"),
        ("link_jitter_ms = 60001", "[testing].link_jitter_ms: must be between 0 and 60000 milliseconds"),
        ("link_message_loss = 1.5", "[testing].link_message_loss: must be a probability between 0 and 1, not 1.5"),
        ("link_frame_loss = -0.1", "[testing].link_frame_loss: must be a probability between 0 and 1"),
        ('link_latency_ms = "20ms"', "[testing].link_latency_ms: must be a number, not '20ms'"),
        ("link_delay_ms = 20", "[testing].link_delay_ms: unknown key (known: link_frame_loss, link_jitter_ms,"),
    ],
)
def test_bad_values_are_refused_naming_the_key(text, error):
    with pytest.raises(ConfigError) as exc:
        parse_config_text(f"[testing]\n{text}\n")
    assert str(exc.value).startswith(error), str(exc.value)
