"""WorkerLease: one coordinator at a time, with injected time; the tunnel's control codec and its vectors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydra_node.codec.framing import encode_message
from hydra_node.runtime.rpc import LeaseHeld, LeaseNotHeld, WorkerLease, dataconn
from hydra_node.runtime.rpc.proto import ProtoVersion
from hydra_node.runtime.rpc.lease_wire import (
    MAX_CONTROL_FRAME_BYTES,
    OFFER_SECRET_BYTES,
    OFFER_TICKET_BYTES,
    ControlDecoder,
    ControlError,
    DataOffer,
    LeaseGranted,
    NoDataOffer,
    PathChoice,
    encode_control,
)


def test_one_coordinator_at_a_time():
    lease = WorkerLease("w1")
    assert lease.holder() is None
    lease.acquire("c1")
    lease.acquire("c1")  # renewing is fine
    with pytest.raises(LeaseHeld, match="leased to coordinator 'c1'") as exc:
        lease.acquire("c2")
    assert (exc.value.holder, exc.value.requester) == ("c1", "c2")
    with pytest.raises(LeaseNotHeld):
        lease.release("c2")
    lease.release("c1")
    lease.acquire("c2")
    assert lease.holder() == "c2"


def test_release_without_lease_and_empty_id():
    lease = WorkerLease("w1")
    with pytest.raises(LeaseNotHeld):
        lease.release("c1")
    with pytest.raises(ValueError):
        lease.acquire("")


def test_ttl_expiry_and_renewal():
    lease = WorkerLease("w1", ttl_s=10.0)
    lease.acquire("c1", now=100.0)
    with pytest.raises(LeaseHeld):
        lease.acquire("c2", now=109.9)
    lease.acquire("c1", now=109.0)  # renew until 119
    with pytest.raises(LeaseHeld):
        lease.acquire("c2", now=115.0)
    assert lease.holder(now=119.0) is None
    lease.acquire("c2", now=119.0)
    with pytest.raises(LeaseNotHeld):
        lease.release("c1", now=119.5)


def test_revoke_on_worker_restart():
    lease = WorkerLease("w1")
    lease.acquire("c1")
    assert lease.revoke() == "c1" and lease.holder() is None
    lease.acquire("c2")


# ---- the tunnel's control codec (runtime/rpc/lease_wire.py, protocol/vectors/lease.json) --------

LEASE_VECTORS = json.loads((Path(__file__).resolve().parents[3] / "protocol" / "vectors" / "lease.json").read_text())
KINDS = {"LeaseGranted": LeaseGranted, "DataOffer": DataOffer, "NoDataOffer": NoDataOffer, "PathChoice": PathChoice}


def _event_json(ev: Any) -> dict[str, Any]:
    if isinstance(ev, LeaseGranted):
        return {
            "type": "lease_granted",
            "proto": str(ev.proto),
            "free_bytes": ev.free_bytes,
            "device": ev.device,
            "data": ev.data,
        }
    if isinstance(ev, DataOffer):
        return {"type": "data_offer", "port": ev.port, "ticket": ev.ticket.hex(), "secret": ev.secret.hex()}
    if isinstance(ev, NoDataOffer):
        return {"type": "no_data_offer"}
    return {"type": "path", "via": ev.via}


def _event(j: dict[str, Any]) -> Any:
    if j["type"] == "lease_granted":
        return LeaseGranted(ProtoVersion.parse(j["proto"]), j["free_bytes"], j["device"], j["data"])
    if j["type"] == "data_offer":
        return DataOffer(j["port"], bytes.fromhex(j["ticket"]), bytes.fromhex(j["secret"]))
    if j["type"] == "no_data_offer":
        return NoDataOffer()
    return PathChoice(j["via"])


def test_offer_sizes_are_the_data_connection_ones():
    assert (OFFER_TICKET_BYTES, OFFER_SECRET_BYTES) == (dataconn.TICKET_BYTES, dataconn.SECRET_BYTES)


@pytest.mark.parametrize("vector", LEASE_VECTORS["valid"], ids=lambda v: v["name"])
@pytest.mark.parametrize("chunk", [None, 1])
def test_lease_vectors_valid(vector, chunk):
    ev = _event(vector["event"])
    assert encode_control(ev).hex() == vector["hex"]
    data = bytes.fromhex(vector["hex"])
    d = ControlDecoder()
    got = None
    for piece in [data] if chunk is None else [data[i : i + 1] for i in range(len(data))]:
        assert got is None
        d.receive_data(piece)
        got = d.next_event()
    assert got == ev


@pytest.mark.parametrize("vector", LEASE_VECTORS["invalid"], ids=lambda v: v["name"])
def test_lease_vectors_invalid(vector):
    d = ControlDecoder()
    d.receive_data(bytes.fromhex(vector["hex"]))
    with pytest.raises(ControlError) as info:
        d.next_event()
    assert info.value.code == vector["error"]


@pytest.mark.parametrize("story", LEASE_VECTORS["stories"], ids=lambda s: s["name"])
def test_lease_stories(story):
    for step in story["steps"]:
        d = ControlDecoder()
        d.receive_data(bytes.fromhex(step["hex"]))
        expected = tuple(KINDS[k] for k in step["expect"])
        if "error" in step:
            with pytest.raises(ControlError) as info:
                d.next_event(*expected)
            assert info.value.code == step["error"]
        else:
            assert _event_json(d.next_event(*expected)) == step["event"]
            assert d.take_unconsumed().hex() == step["rest"]


@settings(max_examples=400)
@given(st.binary(max_size=200), st.sampled_from([None, 1]))
def test_control_decoder_on_any_bytes(data, chunk):
    d = ControlDecoder()
    try:
        for piece in [data] if chunk is None else [data[i : i + 1] for i in range(len(data))]:
            d.receive_data(piece)
            ev = d.next_event()
            if ev is not None:
                assert isinstance(ev, tuple(KINDS.values()))
                return
    except ControlError as exc:
        assert exc.code


_leaf = st.none() | st.booleans() | st.integers(-(2**64), 2**64 - 1) | st.text(max_size=8) | st.binary(max_size=40)


@settings(max_examples=300)
@given(
    st.sampled_from(["lease_granted", "data_offer", "no_data_offer", "path", "other"]),
    st.dictionaries(
        st.sampled_from(["proto", "free_bytes", "device", "data", "port", "ticket", "secret", "via"]), _leaf, max_size=6
    ),
)
def test_control_decoder_on_any_map(op, fields):
    d = ControlDecoder()
    d.receive_data(encode_message({**fields, "op": op}, limit=MAX_CONTROL_FRAME_BYTES * 4))
    try:
        assert isinstance(d.next_event(), tuple(KINDS.values()))
    except ControlError as exc:
        assert exc.code in ("bad_message", "unexpected", "too_large")


def test_the_stream_ending_early_is_a_control_error():
    d = ControlDecoder()
    d.receive_data(encode_control(NoDataOffer())[:-1])
    assert d.next_event() is None
    with pytest.raises(ControlError) as info:
        d.end_of_stream()
    assert info.value.code == "ended"


def test_events_validate_themselves():
    with pytest.raises(ValueError):
        DataOffer(0, bytes(16), bytes(32))
    with pytest.raises(ValueError):
        PathChoice("pigeon")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        LeaseGranted(ProtoVersion(7, 0, 0), -1, "x", False)
