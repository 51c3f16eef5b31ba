"""Reachability: the verdict from dial-back reports (sans-IO), and the dial-back proof over a real
listener on loopback (a wrong node or a stale nonce never counts)."""

from __future__ import annotations

import os

import trio
from nacl.signing import SigningKey

from hydra_node.mesh.link.dialback import check_dialback_proof, dial_back, dialback_proof, nonce_from_path
from hydra_node.mesh.relay.reachability import RECHECK_S, REPORT_TTL_S, RETRY_S, UNREACHABLE_RECHECK_S, Reachability
from hydra_node.mesh.wire.ids import node_id_from_public_key

ADDRS = ("10.0.0.2:9338", "192.168.1.5:9338")


def test_verdicts() -> None:
    r = Reachability()
    r.set_addresses(ADDRS)
    assert r.verdict(0.0, 3) == "unknown" and r.next_check(0.0, 3) == 0.0
    r.checked(0.0)
    r.report("p1", {ADDRS[0]: False, ADDRS[1]: False, "other:1": True}, 1.0)  # not our address: ignored
    assert r.verdict(1.0, 3) == "unknown"  # one failed report of the two required
    assert r.next_check(1.0, 3) == RETRY_S
    assert r.verdict(1.0, 1) is False  # with one peer to ask, one report is all there is
    r.report("p2", {ADDRS[0]: False}, 2.0)
    assert r.verdict(2.0, 3) is False and r.next_check(2.0, 3) == UNREACHABLE_RECHECK_S  # soon again
    r.report("p3", {ADDRS[1]: True}, 3.0)
    assert r.verdict(3.0, 3) is True and r.next_check(3.0, 3) == RECHECK_S
    view = r.view(3.0, 3)
    assert (view.checked_by, view.reached_by, dict(view.addresses)) == (3, 1, {ADDRS[0]: False, ADDRS[1]: True})
    assert r.verdict(3.0 + REPORT_TTL_S + 1, 3) == "unknown"  # stale reports do not count
    r.set_addresses(ADDRS[:1])  # new addresses: old reports were about something else
    assert r.verdict(4.0, 3) == "unknown"


def test_proof_is_bound_to_node_and_nonce() -> None:
    key, other = SigningKey(bytes(32)), SigningKey(bytes([1]) * 32)
    me = node_id_from_public_key(bytes(key.verify_key))
    nonce = bytes(range(16))
    proof = dialback_proof(key, nonce)
    assert check_dialback_proof(proof, me, nonce)
    assert not check_dialback_proof(proof, me, bytes(16))
    assert not check_dialback_proof(dialback_proof(other, nonce), me, nonce)
    assert not check_dialback_proof(proof[:-1], me, nonce) and not check_dialback_proof("text", me, nonce)
    assert nonce_from_path("/hydra/dialback/" + nonce.hex()) == nonce
    assert nonce_from_path("/hydra/dialback/zz") is None and nonce_from_path("/") is None


async def test_dial_back_over_a_listener(mesh, member_settings, start_listener, autojump_clock) -> None:
    settings = member_settings(mesh)
    me = node_id_from_public_key(bytes(settings.identity.verify_key))
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            listener, url = await start_listener(nursery, settings)
            nonce = os.urandom(16)
            assert await dial_back(url, me, nonce, 3.0)
            assert not await dial_back(url, "e" * 64, nonce, 3.0)  # someone else listens there
            with socket_closed() as dead:
                assert not await dial_back(f"ws://127.0.0.1:{dead}", me, nonce, 3.0)
            assert listener.statistics().handshake_failures == {} and listener.statistics().links_opened == 0
            nursery.cancel_scope.cancel()


class socket_closed:
    """A loopback port nothing listens on."""

    def __enter__(self) -> int:
        import socket

        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        return self.port

    def __exit__(self, *exc) -> None:
        pass
