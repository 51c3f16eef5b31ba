"""Hole punching's pure parts: the punch messages and addresses, the role and timing rules, the
upgrade plan's retry table, and the relay's ``observed`` fields (protocol/README.md section 11.7)."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from hydra_node.codec.framing import encode_message
from hydra_node.mesh.relay.messages import RelayProtocolError, ReplyDecoder, encode_reply, parse_incoming
from hydra_node.mesh.relay.punch import (
    MAX_SYNC_DELAY_S,
    PUNCH_KIND,
    PunchAddress,
    PunchDecoder,
    PunchProtocolError,
    encode_punch,
    format_addr,
    parse_addr,
    parse_punch_header,
    punch_header,
    sync_delay_s,
    websocket_client,
)
from hydra_node.mesh.relay.upgrade_plan import (
    ATTEMPT_GAP_S,
    ATTEMPTS_PER_ROUND,
    MAX_ROUNDS,
    UpgradePlan,
    UpgradeStateError,
)

A, B = "a" * 64, "b" * 64


@pytest.mark.parametrize(
    "text, host, port",
    [
        ("10.77.0.21:9338", "10.77.0.21", 9338),
        ("[2001:db8::1]:1", "2001:db8::1", 1),
        ("192.168.1.2:65535", "192.168.1.2", 65535),
    ],
)
def test_addresses_parse_and_format(text, host, port) -> None:
    assert parse_addr(text) == PunchAddress(host, port)
    assert format_addr(host, port) == text


@pytest.mark.parametrize(
    "text",
    [
        "10.0.0.1",
        "10.0.0.1:0",
        "10.0.0.1:65536",
        "host.example:80",
        "2001:db8::1:80",
        "[10.0.0.1]:80",
        "10.0.0.1:-1",
        "0.0.0.0:80",
        "[::]:80",
        "224.0.0.1:80",
        "10.0.0.1: 80",
        "",
        "1" * 65,
        7,
        None,
        "[::1]:123456",
    ],
)
def test_bad_addresses_are_typed_errors(text) -> None:
    with pytest.raises(PunchProtocolError) as err:
        parse_addr(text)
    assert err.value.code == "bad_punch"


def test_header_and_frames_round_trip_whole_and_byte_by_byte() -> None:
    header = punch_header("10.77.0.21:40000")
    assert header == {"kind": PUNCH_KIND, "v": 1, "addr": "10.77.0.21:40000"}
    assert parse_punch_header(header) == PunchAddress("10.77.0.21", 40000)
    for bad in ({**header, "v": 2}, {**header, "addr": "x"}, {"kind": PUNCH_KIND, "v": 1}):
        with pytest.raises(PunchProtocolError):
            parse_punch_header(bad)
    wire = encode_punch("punch", addr="10.77.0.22:41000")
    whole = PunchDecoder()
    whole.receive_data(wire + encode_punch("sync"))
    assert whole.next_frame("punch") == {"op": "punch", "addr": "10.77.0.22:41000"}
    assert whole.next_frame("sync") == {"op": "sync"}
    assert whole.next_frame("sync") is None
    dec = PunchDecoder()
    for i in range(len(wire) - 1):
        dec.receive_data(wire[i : i + 1])
        assert dec.next_frame("punch") is None
    dec.receive_data(wire[-1:])
    assert dec.next_frame("punch")["addr"] == "10.77.0.22:41000"


def test_frames_out_of_step_or_malformed_are_rejected() -> None:
    refusal = encode_punch("refused", code="disabled", message="no")
    cases = [
        (encode_punch("sync"), "punch"),
        (encode_punch("punch", addr="1.2.3.4:5"), "sync"),
        (refusal, "sync"),  # only the punch reply may be a refusal
        (encode_message({"op": "punch", "addr": "1.2.3.4"}, limit=1024), "punch"),
        (encode_message({"op": "refused", "code": 1, "message": "x"}, limit=1024), "punch"),
        (b"\x00\x00\x04\x01" + b"\x00" * 1025, "punch"),  # over 1 KiB
        (b"\x00\x00\x00\x01\x01", "sync"),
    ]  # not a map
    for wire, expected in cases:
        dec = PunchDecoder()
        dec.receive_data(wire)
        with pytest.raises(PunchProtocolError):
            dec.next_frame(expected)
    dec = PunchDecoder()
    dec.receive_data(refusal)
    assert dec.next_frame("punch")["code"] == "disabled"
    with pytest.raises(ValueError):
        encode_punch("punch", addr="nowhere")
    with pytest.raises(ValueError):
        encode_punch("hello")


@given(st.binary(max_size=64), st.sampled_from(["punch", "sync"]))
def test_any_bytes_give_a_frame_nothing_or_a_typed_error(data, expected) -> None:
    dec = PunchDecoder()
    dec.receive_data(data)
    try:
        frame = dec.next_frame(expected)
    except PunchProtocolError as exc:
        assert exc.code == "bad_punch"
    else:
        assert frame is None or frame["op"] in (expected, "refused")


def test_roles_and_sync_delay() -> None:
    assert websocket_client(A, B) and not websocket_client(B, A)  # exactly one end is the client
    with pytest.raises(ValueError):
        websocket_client(A, A)
    assert sync_delay_s(0.040) == pytest.approx(0.020)
    assert sync_delay_s(-1.0) == 0.0
    assert sync_delay_s(60.0) == MAX_SYNC_DELAY_S


def test_the_relay_reports_observed_addresses_only_as_ip_addresses() -> None:
    assert parse_incoming({"v": 1, "from": A, "observed": "10.77.0.21"}).observed == "10.77.0.21"
    assert parse_incoming({"v": 1, "from": A}).observed is None  # an older relay: no punching
    for bad in ("10.77.0.21:9338", "relay.example", 5):
        with pytest.raises(RelayProtocolError):
            parse_incoming({"v": 1, "from": A, "observed": bad})
    dec = ReplyDecoder()
    dec.receive_data(encode_reply("connected", observed="2001:db8::7"))
    assert dec.next_reply("connected")["observed"] == "2001:db8::7"
    dec = ReplyDecoder()
    dec.receive_data(encode_reply("connected", observed="nowhere"))
    with pytest.raises(RelayProtocolError):
        dec.next_reply("connected")


def fail_round(plan: UpgradePlan, now: float) -> float:
    for i in range(ATTEMPTS_PER_ROUND):
        assert plan.due(now)
        plan.begin(now)
        assert not plan.due(now)
        plan.failed(now, "timeout", 0.5)
        if i < ATTEMPTS_PER_ROUND - 1:
            assert plan.next_at == now + ATTEMPT_GAP_S
            now = plan.next_at
    return now


def test_plan_retries_in_rounds_backs_off_and_gives_up() -> None:
    plan = UpgradePlan(100.0)
    assert plan.due(100.0)  # the first attempt at once
    now = fail_round(plan, 100.0)
    assert plan.state == "waiting" and plan.next_at - now == pytest.approx(10.0)  # u = 0.5: no jitter
    gaps = []
    for _ in range(MAX_ROUNDS - 1):
        gaps.append(plan.next_at - now)
        now = fail_round(plan, plan.next_at)
    assert gaps == pytest.approx([10.0, 30.0, 90.0, 270.0])
    assert plan.state == "gave_up" and plan.finished and not plan.due(now + 1e6)
    assert plan.attempts_made == ATTEMPTS_PER_ROUND * MAX_ROUNDS and plan.last_reason == "timeout"


def test_plan_refusals_success_and_illegal_moves() -> None:
    plan = UpgradePlan(0.0)
    plan.begin(0.0)
    plan.refused(0.0, "busy", 0.0)  # a passing refusal counts as a failed attempt
    assert plan.state == "waiting" and plan.last_reason == "refused:busy"
    with pytest.raises(UpgradeStateError):
        plan.begin(0.5)  # before the gap is over
    plan.begin(1.0)
    plan.refused(1.0, "disabled", 0.0)  # the peer does not punch: no retry will help
    assert plan.state == "gave_up" and plan.status().next_at is None
    plan = UpgradePlan(0.0)
    with pytest.raises(UpgradeStateError):
        plan.succeeded()  # no attempt in progress
    plan.begin(0.0)
    with pytest.raises(UpgradeStateError):
        plan.begin(0.0)
    plan.succeeded()
    assert plan.state == "direct" and plan.finished
    with pytest.raises(UpgradeStateError):
        plan.abandon("late")
    plan = UpgradePlan(0.0)
    plan.abandon("no_address")
    assert plan.status().state == "gave_up" and plan.status().last_reason == "no_address"
