"""Dial-back checks: can a peer reach us at an address we advertise? (protocol/README.md, "Relays").

A peer asked to check opens a websocket to ``ws://ADDR/hydra/dialback/<nonce hex>``; our link
listener answers that path with one message, a *dial-back proof* — canonical CBOR
``{"op": "dialback_proof", "node": <our node id>, "sig": Ed25519(b"hydra-dialback-v1" || nonce)}`` —
and closes. The signature proves the answer came from us (not from whatever else listens at that
address on the checker's network), the nonce that it is fresh. No link, no handshake slot.
"""

from __future__ import annotations

import nacl.exceptions
import nacl.signing
import trio
import trio_websocket
from trio_websocket import ConnectionClosed, WebSocketRequest, open_websocket_url

from hydra_node.codec import cbor
from hydra_node.codec.errors import DecodeError
from hydra_node.mesh.link.websocket import close_websocket
from hydra_node.mesh.wire.ids import is_node_id

__all__ = [
    "DIALBACK_PATH",
    "MAX_PROOF_BYTES",
    "check_dialback_proof",
    "dial_back",
    "dialback_proof",
    "answer_dialback",
    "nonce_from_path",
]

DIALBACK_PATH = "/hydra/dialback/"
MAX_PROOF_BYTES = 256
"""A proof is about 120 bytes; anything bigger is not one."""
_CONTEXT = b"hydra-dialback-v1"


def dialback_proof(identity: nacl.signing.SigningKey, nonce: bytes) -> bytes:
    node = bytes(identity.verify_key).hex()
    return cbor.encode({"op": "dialback_proof", "node": node, "sig": identity.sign(_CONTEXT + nonce).signature})


def check_dialback_proof(data: bytes | str, node_id: str, nonce: bytes) -> bool:
    """True when ``data`` is ``node_id``'s proof for ``nonce`` (any malformed input: False)."""
    if not isinstance(data, bytes) or len(data) > MAX_PROOF_BYTES:
        return False
    try:
        msg = cbor.decode(data, max_size=MAX_PROOF_BYTES)
    except DecodeError:
        return False
    if not isinstance(msg, dict) or msg.get("op") != "dialback_proof" or msg.get("node") != node_id:
        return False
    sig = msg.get("sig")
    if not is_node_id(node_id) or not isinstance(sig, bytes) or len(sig) != 64:
        return False
    try:
        nacl.signing.VerifyKey(bytes.fromhex(node_id)).verify(_CONTEXT + nonce, sig)
    except nacl.exceptions.BadSignatureError:
        return False
    return True


def nonce_from_path(path: str) -> bytes | None:
    """The nonce of a dial-back request path, None if ``path`` is not one."""
    if not path.startswith(DIALBACK_PATH):
        return None
    try:
        nonce = bytes.fromhex(path[len(DIALBACK_PATH) :])
    except ValueError:
        return None
    return nonce if len(nonce) == 16 else None


async def answer_dialback(request: WebSocketRequest, identity: nacl.signing.SigningKey, nonce: bytes) -> None:
    """Our listener's side: accept, send the proof, close (bounded by the caller's scope)."""
    try:
        ws = await request.accept()
    except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
        return
    try:
        await ws.send_message(dialback_proof(identity, nonce))
    except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    await close_websocket(ws)


async def dial_back(url: str, node_id: str, nonce: bytes, timeout_s: float) -> bool:
    """The checker's side: True when ``url`` answers with ``node_id``'s proof within ``timeout_s``."""
    with trio.move_on_after(timeout_s):
        try:
            async with open_websocket_url(
                url.rstrip("/") + DIALBACK_PATH + nonce.hex(),
                max_message_size=MAX_PROOF_BYTES,
                connect_timeout=timeout_s,
                disconnect_timeout=1.0,
            ) as ws:
                return check_dialback_proof(await ws.get_message(), node_id, nonce)
        except (
            OSError,
            trio_websocket.HandshakeError,
            ConnectionClosed,
            trio.BrokenResourceError,
            trio.ClosedResourceError,
        ):
            return False
    return False
