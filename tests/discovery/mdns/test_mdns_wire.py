"""mdns_wire: round trips, goodbyes, queries, validation, and untrusted bytes."""

from __future__ import annotations

import dataclasses

import pytest
from dnslib import DNSHeader, DNSRecord, PTR, QTYPE, RR, SRV, TXT, A
from hypothesis import given, settings, strategies as st

from discovery_helpers import make_advert
from hydra_node.discovery.mdns.wire import (
    CACHE_FLUSH,
    SERVICE,
    MdnsAdvertError,
    MdnsDecodeError,
    MdnsQuery,
    MdnsResponse,
    decode_packet,
    encode_announcement,
    encode_goodbye,
    encode_query,
)


def test_announcement_round_trip():
    a = make_advert("node a", models=("m1", "org/m2:Q4"))
    event = decode_packet(encode_announcement(a, ttl=77))
    assert isinstance(event, MdnsResponse)
    assert event.adverts == ((a, 77),)
    assert event.goodbyes == () and event.rejected == ()


def test_records_carry_ptr_srv_txt_a_with_cache_flush():
    a = make_advert()
    msg = DNSRecord.parse(encode_announcement(a))
    types = sorted(QTYPE[rr.rtype] for rr in list(msg.rr) + list(msg.ar))
    assert types == ["A", "PTR", "SRV", "TXT"]
    for rr in list(msg.rr) + list(msg.ar):
        shared = rr.rtype == QTYPE.PTR
        assert bool(rr.rclass & CACHE_FLUSH) is not shared
    txt = [r for r in msg.rr if r.rtype == QTYPE.TXT][0]
    keys = {bytes(s).split(b"=")[0] for s in txt.rdata.data}
    assert keys == {b"svc", b"schema", b"id", b"origin", b"mesh", b"tok_fp", b"name", b"models", b"nodes", b"ver"}
    assert not any(b"secret" in bytes(s) for s in txt.rdata.data)


def test_goodbye_has_ttl_zero_and_decodes_as_goodbye():
    a = make_advert()
    msg = DNSRecord.parse(encode_goodbye(a))
    assert all(rr.ttl == 0 for rr in list(msg.rr) + list(msg.ar))
    assert decode_packet(encode_goodbye(a)) == MdnsResponse(adverts=(), goodbyes=(a.instance,))


def test_query_and_known_answers():
    a = make_advert()
    q = decode_packet(encode_query(4242, known=a))
    assert q == MdnsQuery(query_id=4242, asks_for_service=True, known_instances=frozenset({a.instance}))
    other = DNSRecord.question("_http._tcp.local.", "PTR")
    assert decode_packet(bytes(other.pack())).asks_for_service is False


def test_case_insensitive_names():
    a = make_advert()
    wire = encode_announcement(a).replace(b"_hydra", b"_HYDRA")
    assert decode_packet(wire).adverts[0][0] == a


def _response(instance: str, txt: list[bytes], *, srv: bool = True) -> bytes:
    r = DNSRecord(DNSHeader(qr=1, aa=1))
    fqdn = f"{instance}.{SERVICE}"
    r.add_answer(RR(SERVICE, QTYPE.PTR, 1, 120, PTR(fqdn)))
    if srv:
        r.add_answer(RR(fqdn, QTYPE.SRV, 1, 120, SRV(port=1234, target=f"{instance}.local.")))
    r.add_answer(RR(fqdn, QTYPE.TXT, 1, 120, TXT(txt)))
    r.add_ar(RR(f"{instance}.local.", QTYPE.A, 1, 120, A("10.0.0.1")))
    return bytes(r.pack())


GOOD_TXT = [
    b"svc=hydra",
    b"schema=1",
    b"id=" + b"ab" * 16,
    b"origin=" + b"cd" * 8,
    b"mesh=m",
    b"tok_fp=" + b"ef" * 16,
    b"name=x",
    b"models=a|b",
    b"nodes=3",
    b"ver=1.0",
]


def test_foreign_built_response_parses():
    event = decode_packet(_response("hydra-x1", GOOD_TXT))
    ((advert, ttl),) = event.adverts
    assert advert.port == 1234 and advert.addresses == ("10.0.0.1",) and advert.models == ("a", "b")
    assert advert.node_count == 3 and ttl == 120


@pytest.mark.parametrize(
    "txt, why",
    [
        ([t for t in GOOD_TXT if not t.startswith(b"svc=")], "svc"),
        ([b"svc=mesh-llm"] + GOOD_TXT[1:], "svc"),
        ([t if not t.startswith(b"nodes=") else b"nodes=-1" for t in GOOD_TXT], "nodes"),
        ([t if not t.startswith(b"tok_fp=") else b"tok_fp=zz" for t in GOOD_TXT], "token_fingerprint"),
        ([t if not t.startswith(b"schema=") else b"schema=9" for t in GOOD_TXT], "schema"),
        ([t for t in GOOD_TXT if not t.startswith(b"id=")], "missing"),
        (GOOD_TXT + [b"\xff\xfe=1"], "UTF-8"),
        ([t if not t.startswith(b"models=") else b"models=bad model" for t in GOOD_TXT], "model"),
    ],
)
def test_invalid_txt_is_rejected_not_raised(txt, why):
    event = decode_packet(_response("hydra-x1", txt))
    assert event.adverts == ()
    assert event.rejected[0][0] == "hydra-x1" and why in event.rejected[0][1]


def test_missing_srv_is_rejected():
    event = decode_packet(_response("hydra-x1", GOOD_TXT, srv=False))
    assert event.rejected == (("hydra-x1", "incomplete: SRV or TXT missing"),)


def test_first_txt_key_wins():
    event = decode_packet(_response("hydra-x1", GOOD_TXT + [b"nodes=999"]))
    assert event.adverts[0][0].node_count == 3


def test_unrelated_service_is_ignored():
    r = DNSRecord(DNSHeader(qr=1, aa=1))
    r.add_answer(RR("_http._tcp.local.", QTYPE.PTR, 1, 120, PTR("x._http._tcp.local.")))
    assert decode_packet(bytes(r.pack())) == MdnsResponse(adverts=(), goodbyes=())


def test_advert_validation_refuses_bad_local_config():
    a = make_advert()
    for change in (
        {"port": 0},
        {"addresses": ()},
        {"addresses": ("::1",)},
        {"node_id": "XYZ"},
        {"instance": "Bad Label"},
        {"models": ("x",) * 17},
        {"name": "a|b"},
        {"node_count": 0},
        {"name": "n" * 65},
    ):
        with pytest.raises(MdnsAdvertError):
            dataclasses.replace(a, **change)
    with pytest.raises(MdnsAdvertError):
        encode_announcement(a, ttl=-1)


def test_truncated_and_junk_packets():
    wire = encode_announcement(make_advert())
    for cut in range(0, len(wire)):
        try:
            decode_packet(wire[:cut])
        except MdnsDecodeError:
            pass
    assert decode_packet(wire + b"\x00junk").adverts  # trailing junk after a complete message is tolerated
    with pytest.raises(MdnsDecodeError):
        decode_packet(b"\x00" * 9001)
    with pytest.raises(MdnsDecodeError):
        decode_packet(b"\x00" * 5)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_untrusted_bytes_give_an_event_or_a_typed_error(data):
    try:
        event = decode_packet(data)
    except MdnsDecodeError:
        return
    assert isinstance(event, (MdnsQuery, MdnsResponse))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_mutated_announcements_never_crash(data):
    wire = bytearray(encode_announcement(make_advert()))
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(wire) - 1))
        wire[i] = data.draw(st.integers(0, 255))
    try:
        event = decode_packet(bytes(wire))
    except MdnsDecodeError:
        return
    assert isinstance(event, (MdnsQuery, MdnsResponse))


def test_legacy_unicast_answer_echoes_id_and_caps_ttl():
    a = make_advert()
    msg = DNSRecord.parse(encode_announcement(a, ttl=120, legacy_query_id=777))
    assert msg.header.id == 777 and len(msg.questions) == 1
    assert all(rr.ttl == 10 and not rr.rclass & CACHE_FLUSH for rr in list(msg.rr) + list(msg.ar))
    assert decode_packet(encode_announcement(a, legacy_query_id=777)).adverts == ((a, 10),)
