"""Encrypted frames of an established link (sans-IO).

Each frame is ``counter (u64 big-endian) || XChaCha20-Poly1305(plaintext)`` with
nonce ``16 zero bytes || counter`` and empty associated data, under one key per
direction from the handshake. Counters start at 0 and go up by one, so a
replayed, reordered or dropped frame is noticed before decryption.
"""

from __future__ import annotations

import nacl.bindings as sodium
import nacl.exceptions

from hydra_node.mesh.wire.constants import FRAME_OVERHEAD_BYTES, MAX_LINK_FRAME_BYTES
from hydra_node.mesh.wire.errors import FrameRejected, LocalProtocolError
from hydra_node.mesh.wire.handshake import aead_nonce

_COUNTER_LIMIT = 2**64 - 1


class SecureChannel:
    """Seal outgoing and open incoming frames; typed FrameRejected for anything bad.

    FrameRejected codes: ``oversize`` (longer than max_frame), ``bad_frame`` (too short),
    ``replay`` (counter already seen), ``reorder`` (counter skipped ahead),
    ``tamper`` (authentication failed).
    """

    def __init__(self, send_key: bytes, receive_key: bytes, *, max_frame: int = MAX_LINK_FRAME_BYTES) -> None:
        self._send_key = send_key
        self._receive_key = receive_key
        self._max_frame = max_frame
        self._send_counter = 0
        self._receive_counter = 0

    @property
    def send_counter(self) -> int:
        return self._send_counter

    @property
    def receive_counter(self) -> int:
        return self._receive_counter

    def keys(self) -> tuple[bytes, bytes]:
        """``(send_key, receive_key)``: for a native pump that continues this channel."""
        return self._send_key, self._receive_key

    def seal(self, plaintext: bytes) -> bytes:
        if len(plaintext) + FRAME_OVERHEAD_BYTES > self._max_frame:
            raise LocalProtocolError(f"frame of {len(plaintext)} bytes exceeds the {self._max_frame}-byte limit")
        if self._send_counter >= _COUNTER_LIMIT:
            raise LocalProtocolError("frame counter exhausted; the link must be re-established")
        counter = self._send_counter
        self._send_counter += 1
        header = counter.to_bytes(8, "big")
        return header + sodium.crypto_aead_xchacha20poly1305_ietf_encrypt(
            plaintext, None, aead_nonce(counter), self._send_key
        )

    def open(self, frame: bytes) -> bytes:
        if len(frame) > self._max_frame:
            raise FrameRejected(
                f"frame of {len(frame)} bytes exceeds the {self._max_frame}-byte limit", code="oversize"
            )
        if len(frame) < FRAME_OVERHEAD_BYTES:
            raise FrameRejected(f"frame of {len(frame)} bytes is shorter than its header and tag", code="bad_frame")
        counter = int.from_bytes(frame[:8], "big")
        if counter < self._receive_counter:
            raise FrameRejected(
                f"frame counter {counter} was already used (expected {self._receive_counter})", code="replay"
            )
        if counter > self._receive_counter:
            raise FrameRejected(f"frame counter {counter} skips ahead of {self._receive_counter}", code="reorder")
        try:
            plaintext = sodium.crypto_aead_xchacha20poly1305_ietf_decrypt(
                bytes(frame[8:]), None, aead_nonce(counter), self._receive_key
            )
        except nacl.exceptions.CryptoError:
            raise FrameRejected(
                f"frame {counter} fails authentication (tampered or wrong key)", code="tamper"
            ) from None
        self._receive_counter += 1
        return plaintext
