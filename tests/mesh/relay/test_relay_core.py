"""The relay's sans-IO parts: messages (untrusted bytes → a reply or a typed error), limits and the
token bucket (injected time), relay choice and dial order (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from hydra_node.mesh.relay.limits import RelayBook, RelayLimits, RelayRefused, TokenBucket
from hydra_node.mesh.relay.messages import (
    MAX_RELAYED_FRAME_BYTES,
    RelayProtocolError,
    ReplyDecoder,
    encode_relayed_frame,
    encode_reply,
    parse_connect,
    parse_dialback,
    relayed_frame_decoder,
)
from hydra_node.mesh.relay.selection import announce_extra, choose_relays, dial_urls, parse_relay_url, relay_url

A, B, C, D = ("a" * 64, "b" * 64, "c" * 64, "d" * 64)


def test_reply_round_trip_whole_and_byte_by_byte() -> None:
    wire = encode_reply("reserved", ttl_s=3600, bytes_per_s=1000, circuits=16) + b"rest"
    for chunks in ([wire], [wire[i : i + 1] for i in range(len(wire))]):
        dec, reply = ReplyDecoder(), None
        for c in chunks:
            dec.receive_data(c)
            reply = reply or dec.next_reply("reserved")
        assert reply == {"op": "reserved", "ttl_s": 3600, "bytes_per_s": 1000, "circuits": 16}
        assert dec.take_unconsumed() == b"rest"


@pytest.mark.parametrize(
    "wire, expected",
    [
        (encode_reply("connected"), "reserved"),  # the wrong reply
        (encode_reply("reserved", ttl_s=-1, bytes_per_s=1, circuits=1), "reserved"),
        (encode_reply("refused", code=3, message="x"), "connected"),
        (encode_reply("dialback", results={"h:1": "yes"}), "dialback"),
        (b"\x00\x00\x00\x02\xa0\xa0", "connected"),  # not a single map
        (b"\xff\xff\xff\xff", "connected"),  # over the bound
    ],
)
def test_bad_replies_are_typed_errors(wire: bytes, expected: str) -> None:
    dec = ReplyDecoder()
    dec.receive_data(wire)
    with pytest.raises(RelayProtocolError):
        dec.next_reply(expected)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300))
def test_any_reply_bytes_give_a_reply_none_or_a_typed_error(data: bytes) -> None:
    dec = ReplyDecoder()
    dec.receive_data(data)
    try:
        reply = dec.next_reply("connected")
    except RelayProtocolError:
        return
    assert reply is None or reply["op"] in ("connected", "refused")


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.text(max_size=8),
        st.one_of(
            st.none(), st.integers(), st.text(max_size=70), st.binary(max_size=20), st.lists(st.text(max_size=5))
        ),
    )
)
def test_any_header_parses_or_raises_typed(header: dict) -> None:
    for parse in (parse_connect, parse_dialback):
        try:
            parse(header)
        except RelayProtocolError:
            pass


def test_headers() -> None:
    assert parse_connect({"kind": "relay_connect", "v": 1, "target": A}).target == A
    with pytest.raises(RelayProtocolError):
        parse_connect({"v": 1, "target": "A" * 64})  # not lowercase hex
    with pytest.raises(RelayProtocolError):
        parse_connect({"v": 2, "target": A})
    assert parse_dialback({"v": 1, "addrs": ["10.0.0.1:9338"], "nonce": bytes(16)}).addrs == ("10.0.0.1:9338",)
    with pytest.raises(RelayProtocolError):
        parse_dialback({"v": 1, "addrs": ["h:1"] * 9, "nonce": bytes(16)})


def test_relayed_frames() -> None:
    dec = relayed_frame_decoder()
    dec.receive_data(encode_relayed_frame(b"one") + encode_relayed_frame(b"") + encode_relayed_frame(b"three")[:5])
    assert [dec.next_frame(), dec.next_frame(), dec.next_frame()] == [b"one", b"", None]
    with pytest.raises(ValueError):
        encode_relayed_frame(b"x" * (MAX_RELAYED_FRAME_BYTES + 1))


def test_token_bucket_paces_to_the_rate() -> None:
    bucket = TokenBucket(rate=1000, burst=500, now=0.0)
    assert bucket.take(500, 0.0) == 0.0
    assert bucket.take(250, 0.0) == pytest.approx(0.25)
    assert bucket.take(0, 0.25) == 0.0  # refilled what was owed
    assert bucket.take(1000, 10.0) == pytest.approx(0.5)  # refill capped at the burst
    lazy = TokenBucket(rate=1000, burst=500)  # full at its first use, whatever the clock reads
    assert lazy.take(500, 1e6) == 0.0 and lazy.take(100, 1e6) == pytest.approx(0.1)


def test_relay_book_limits_and_ttl() -> None:
    book = RelayBook(RelayLimits(max_reservations=2, max_circuits=2, max_circuits_per_target=1, reservation_ttl_s=10))
    expires = book.reserve(A, 0.0)
    book.reserve(B, 0.0)
    with pytest.raises(RelayRefused, match="reservations held"):
        book.reserve(C, 1.0)
    first = book.open_circuit(C, A, 1.0)
    with pytest.raises(RelayRefused) as err:
        book.open_circuit(D, A, 1.0)
    assert err.value.code == "target_busy"
    with pytest.raises(RelayRefused) as err:
        book.open_circuit(A, A, 1.0)
    assert err.value.code == "bad_target"
    book.open_circuit(C, B, 1.0)
    book.close_circuit(first)
    assert book.circuits == 1
    assert not book.reserved(A, expires)  # the TTL ended it
    with pytest.raises(RelayRefused) as err:
        book.open_circuit(C, A, expires)
    assert err.value.code == "no_reservation"
    renewed = book.reserve(B, expires)
    book.release(B, expires)  # an older reservation's end: the renewed one stays
    assert book.reserved(B, expires + 5.0)
    book.release(B, renewed)
    assert not book.reserved(B, expires + 5.0)
    assert dict(book.refused) == {"relay_full": 1, "target_busy": 1, "bad_target": 1, "no_reservation": 1}


def test_one_source_gets_a_share_of_the_circuits_and_others_still_get_theirs() -> None:
    E, F = "e" * 64, "f" * 64
    limits = RelayLimits(max_circuits=8, max_circuits_per_source=2, max_circuits_per_address=3)
    book = RelayBook(limits)
    for target in (A, B):
        book.reserve(target, 0.0, "10.0.0.1")
    mine = [book.open_circuit(C, t, 1.0, "10.0.0.9") for t in (A, B)]
    with pytest.raises(RelayRefused, match="its share") as err:  # the node's share, whatever the target
        book.open_circuit(C, A, 1.0, "10.0.0.9")
    assert err.value.code == "circuits_share_exceeded"
    book.open_circuit(D, A, 1.0, "10.0.0.9")  # another node id on the same host: the address share
    with pytest.raises(RelayRefused, match="from 10.0.0.9") as err:
        book.open_circuit(E, A, 1.0, "10.0.0.9")
    assert err.value.code == "circuits_share_exceeded"
    book.open_circuit(E, A, 1.0, "10.0.0.7")  # an honest member elsewhere still gets one
    book.open_circuit(F, B, 1.0, None)  # address unknown (a relayed link): only the node's share
    book.close_circuit(mine[0], idle=True)
    book.open_circuit(C, A, 2.0, "10.0.0.9")  # a closed circuit gives its place back
    assert book.circuits == 5 and book.circuits_idle_closed == 1
    assert dict(book.refused) == {"circuits_share_exceeded": 2}


def test_reservations_are_capped_per_address() -> None:
    book = RelayBook(RelayLimits(max_reservations=4, max_reservations_per_address=2, reservation_ttl_s=10))
    book.reserve(A, 0.0, "10.0.0.9")
    book.reserve(B, 0.0, "10.0.0.9")
    with pytest.raises(RelayRefused, match="from 10.0.0.9") as err:  # sybil node ids from one host
        book.reserve(C, 0.0, "10.0.0.9")
    assert err.value.code == "address_share_exceeded"
    book.reserve(A, 1.0, "10.0.0.9")  # renewing its own is not a new one
    book.reserve(C, 1.0, "10.0.0.7")  # another host still gets one
    with pytest.raises(RelayRefused, match="from 10.0.0.9"):  # nor may it move in from there
        book.reserve(C, 1.0, "10.0.0.9")
    book.reserve(D, 1.0, None)
    assert book.reservations == 4 and dict(book.refused) == {"address_share_exceeded": 2}
    book.release(D, 1.0 + 10)
    assert book.reserve("e" * 64, 10.0, "10.0.0.9")  # B's expired: room for one more from .9


def test_relay_limits_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="at least one"):
        RelayLimits(max_circuits_per_source=0)
    with pytest.raises(ValueError, match="idle"):
        RelayLimits(circuit_idle_s=0)


def test_relay_choice_and_dial_order() -> None:
    offer = announce_extra(reach=True, offering=True, bytes_per_s=100, relays=())
    offers = {
        A: offer,
        B: offer,
        C: announce_extra(reach=False, offering=True, bytes_per_s=1, relays=()),
        D: announce_extra(reach=True, offering=False, bytes_per_s=1, relays=()),
    }
    assert choose_relays(offers, lambda p: True, set(), {}, 0.0) == [A, B]
    assert choose_relays(offers, lambda p: p != A, set(), {}, 0.0) == [B]
    assert choose_relays(offers, lambda p: True, {A}, {B: 5.0}, 1.0) == []  # B failed recently
    assert choose_relays(offers, lambda p: True, {A}, {B: 5.0}, 6.0) == [B]
    assert choose_relays(offers, lambda p: True, {A, B}, {}, 0.0) == []
    natted = announce_extra(reach=False, offering=False, bytes_per_s=1, relays=[A, B])
    assert dial_urls(natted, ["ws://10.0.0.2:9338"], lambda p: p == B, me=C) == [relay_url(B), relay_url(A)]
    assert dial_urls(natted, ["ws://10.0.0.2:9338"], lambda p: False, me=A) == [relay_url(B)]
    public = announce_extra(reach=True, offering=False, bytes_per_s=1, relays=())
    assert dial_urls(public, ["ws://1.2.3.4:9338"], lambda p: False, me=C) == ["ws://1.2.3.4:9338"]
    assert dial_urls({"relays": ["junk", 3, A]}, [], lambda p: False, me=C) == [relay_url(A)]
    assert parse_relay_url(relay_url(A)) == A and parse_relay_url("relay:xyz") is None
    assert parse_relay_url("ws://h:1") is None


def test_relay_settings_come_from_the_file_and_the_flags_override():
    """``[relay]`` in the config file; ``--relay`` / ``--relay-rate`` / ``--hole-punch`` win (cli/main.py)."""
    from argparse import Namespace

    from hydra_node.cli.main import relay_settings_from_args
    from hydra_node.config import ConfigError, parse_config_text

    section = parse_config_text(
        '[relay]\nmode = "off"\nrate_mb_s = 2.5\nuse_relays = false\nhole_punch = false\n'
    ).relay
    s = relay_settings_from_args(Namespace(relay=None, relay_rate=None, hole_punch=None), section)
    assert (s.mode, s.use_relays, s.limits.bytes_per_s, s.hole_punch) == ("off", False, 2_500_000, False)
    s = relay_settings_from_args(Namespace(relay="on", relay_rate=8.0, hole_punch="on"), section)
    assert (s.mode, s.limits.bytes_per_s, s.hole_punch) == ("on", 8_000_000, True)
    assert (
        relay_settings_from_args(
            Namespace(relay=None, relay_rate=None, hole_punch=None), parse_config_text("").relay
        ).hole_punch
        is True
    )  # on by default
    for bad in ('mode = "sometimes"', "rate_mb_s = 0", "use_relays = 3", 'hole_punch = "yes"'):
        with pytest.raises(ConfigError):
            parse_config_text(f"[relay]\n{bad}\n")
