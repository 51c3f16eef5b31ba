"""Tunnel data connections: tickets, frames, the listener's refusals and the native pump."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from hydra_node.mesh.wire.errors import FrameRejected
from hydra_node.runtime.rpc import dataconn, native_pump
from hydra_node.runtime.rpc.dataconn import (
    MAGIC,
    DataConnError,
    DataListener,
    FrameReader,
    TicketBook,
    TooManyTickets,
    channel_for,
    dial,
    seal_frame,
)
from waiting import wait_until

VECTORS = Path(__file__).resolve().parents[3] / "protocol" / "vectors" / "tunnel_data.json"


# ---------------------------------------------------------------- sans-IO
def test_protocol_vectors():
    v = json.loads(VECTORS.read_text())
    secret = bytes.fromhex(v["secret"])
    c2w, w2c = dataconn.direction_keys(secret)
    assert (c2w.hex(), w2c.hex()) == (v["key_c2w"], v["key_w2c"])
    coord, worker = channel_for(secret, "coordinator"), channel_for(secret, "worker")
    for frame in v["frames"]:
        sender = coord if frame["from"] == "coordinator" else worker
        receiver = worker if sender is coord else coord
        wire = seal_frame(sender, bytes.fromhex(frame["plaintext"]))
        assert wire.hex() == frame["wire"]
        assert FrameReader(receiver).feed(wire) == [bytes.fromhex(frame["plaintext"])]
    assert (MAGIC + bytes.fromhex(v["ticket"])).hex() == v["preamble"]


def test_frames_reject_tampering_reordering_and_oversize():
    secret = bytes(range(32))
    a, b = channel_for(secret, "coordinator"), channel_for(secret, "worker")
    f0, f1 = seal_frame(a, b"zero"), seal_frame(a, b"one")
    reader = FrameReader(b)
    assert reader.feed(f0[:5]) == [] and reader.feed(f0[5:] + f1) == [b"zero", b"one"]
    with pytest.raises(FrameRejected) as exc:
        FrameReader(channel_for(secret, "worker")).feed(f1)  # counter 1 before 0
    assert exc.value.code == "reorder"
    bad = bytearray(seal_frame(channel_for(secret, "coordinator"), b"x"))
    bad[-1] ^= 1
    with pytest.raises(FrameRejected) as exc:
        FrameReader(channel_for(secret, "worker")).feed(bytes(bad))
    assert exc.value.code == "tamper"
    with pytest.raises(FrameRejected) as exc:
        FrameReader(b).feed((dataconn.MAX_DATA_FRAME + 1).to_bytes(4, "big"))
    assert exc.value.code == "oversize"
    with pytest.raises(ValueError):
        channel_for(secret, "observer")


def test_tickets_are_single_use_expire_and_are_bounded():
    book = TicketBook(ttl_s=10.0, max_outstanding=2)
    t = book.issue("peer/tag", now=0.0)
    assert len(t.ticket_id) == 16 and len(t.secret) == 32 and t.holder == "peer/tag"
    assert book.claim(t.ticket_id, now=1.0) == t and book.claim(t.ticket_id, now=1.0) is None
    old = book.issue("p", now=0.0)
    book.issue("p", now=5.0)
    with pytest.raises(TooManyTickets):
        book.issue("p", now=6.0)
    assert book.claim(old.ticket_id, now=10.0) is None  # expired
    assert len(book) == 1


# ---------------------------------------------------------------- the listener
async def _listener(nursery) -> DataListener:
    listener = DataListener()
    await nursery.start(listener.serve, "127.0.0.1")
    return listener


async def _raw(port: int, payload: bytes) -> bytes:
    """Send ``payload`` on a fresh connection; return what comes back before the close."""
    tcp = await trio.open_tcp_stream("127.0.0.1", port)
    async with tcp:
        await tcp.send_all(payload)
        got = b""
        with trio.fail_after(5):
            while data := await tcp.receive_some(4096):
                got += data
    return got


async def test_listener_refuses_strangers_and_counts_why(nursery):
    listener = await _listener(nursery)
    port = listener.port
    ticket, waiter = listener.issue("coord/m")
    hello = seal_frame(channel_for(ticket.secret, "coordinator"), b"")
    assert await _raw(port, b"GET / HTTP/1.1\r\n\r\n" + b"x" * 40) == b""
    assert await _raw(port, MAGIC + bytes(16) + hello) == b""  # unknown ticket
    wrong = seal_frame(channel_for(bytes(32), "coordinator"), b"")  # a secret we never gave out
    assert await _raw(port, MAGIC + ticket.ticket_id + wrong) == b""
    assert listener.rejected == {"bad_magic": 1, "bad_ticket": 1, "tamper": 1}
    # The tampered hello used the ticket up: the right secret no longer helps either.
    with pytest.raises(DataConnError) as exc:
        await dial("127.0.0.1", port, ticket.ticket_id, ticket.secret)
    assert exc.value.code == "refused" and listener.rejected["bad_ticket"] == 2
    with pytest.raises(trio.EndOfChannel):
        await waiter.receive()


async def _dialled(nursery):
    """(listener, ticket, the coordinator's end, the worker node's end) of a fresh data connection."""
    listener = await _listener(nursery)
    ticket, waiter = listener.issue("coord/m")
    conn = await dial("127.0.0.1", listener.port, ticket.ticket_id, ticket.secret)
    served = await waiter.receive()
    served.taken.set()
    return listener, ticket, conn, served


async def test_dial_hands_the_connection_to_the_ticket_holder(nursery):
    listener, ticket, conn, served = await _dialled(nursery)
    await conn.send(b"request")
    assert await served.receive() == b"request"
    await served.send(b"reply" * 30000)  # several frames
    got = b""
    while len(got) < 150000:
        got += await conn.receive()
    assert got == b"reply" * 30000 and listener.accepted == 1
    await conn.aclose()
    assert await served.receive() == b""
    await served.aclose()
    with pytest.raises(DataConnError) as exc:  # nothing listens there any more
        await dial("127.0.0.1", 1, ticket.ticket_id, ticket.secret)
    assert exc.value.code == "unreachable"


# ---------------------------------------------------------------- the native pump
class _Control:
    """A control stream that stays open until ``end`` is set."""

    def __init__(self):
        self.end = trio.Event()

    async def receive(self) -> bytes:
        await self.end.wait()
        return b""


async def _pumped_pair(nursery):
    """(plain client socket, the worker node's end, control stream, pump result box)."""
    _, _, conn, served = await _dialled(nursery)
    plain_listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    client = await trio.open_tcp_stream("127.0.0.1", plain_listeners[0].socket.getsockname()[1])
    plain = await plain_listeners[0].accept()
    control, result = _Control(), {}

    async def run():
        try:
            result["how"] = await native_pump.pump(plain, conn, control)
            result["sent"], result["received"] = conn.bytes_sent, conn.bytes_received
        finally:  # as splice_data does
            await plain.aclose()
            await conn.aclose()

    nursery.start_soon(run)
    return client, served, control, result


@pytest.fixture(autouse=False)
def needs_native():
    if native_pump.native() is None:
        pytest.fail(native_pump.load_error())  # make install builds it: a missing library is a bug


async def test_native_pump_carries_bytes_both_ways(nursery, needs_native):
    client, served, control, result = await _pumped_pair(nursery)
    with trio.fail_after(10):
        await client.send_all(b"\x08" + b"q" * 100_000)
        got = b""
        while len(got) < 100_001:
            got += await served.receive()
        assert got == b"\x08" + b"q" * 100_000
        await served.send(b"answer")
        assert await client.receive_some(100) == b"answer"
        control.end.set()  # the link stream ended: the pump stops
        await wait_until(lambda: "how" in result)  # the pump's thread is outside trio: real time, bounded
    assert result["how"] == "control stream ended" and result["sent"] == 100_001 and result["received"] == 6


async def test_native_pump_rejects_a_tampered_frame(nursery, needs_native):
    client, served, control, result = await _pumped_pair(nursery)
    wire = bytearray(seal_frame(served._channel, b"hello"))
    wire[-3] ^= 0x40
    with trio.fail_after(10):
        await served.tcp.send_all(bytes(wire))
        await wait_until(lambda: "how" in result)
        assert await client.receive_some(100) == b""  # the TCP side is closed: llama.cpp sees an error
    assert result["how"] == "data: tamper"
