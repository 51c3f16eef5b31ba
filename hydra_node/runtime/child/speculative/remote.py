"""A :class:`Drafter` on the other end of a TCP connection (a draft server, usually through a
mesh tunnel: ``127.0.0.1:Q`` on the target's node forwards to a peer's ``draft`` service).

One connection per request: :meth:`RemoteDrafter.start` connects, checks the server's
``hello`` (protocol, vocabulary fingerprint) and sends the prompt; ``propose`` is the only
call that waits for an answer (``commit``/``extend`` are pipelined into the next round trip).
Every byte from the server goes through the strict decoder (:mod:`.wire`, built on
:mod:`hydra_node.codec`). Every failure — refused, closed, too slow, malformed, a different
vocabulary — raises a :class:`SpeculationError` subclass, which makes the decoder finish with the target alone.
"""

from __future__ import annotations

import socket
import time
from typing import NoReturn, Sequence

from hydra_node.runtime.child.speculative.draft import Proposal
from hydra_node.runtime.speculative.errors import SpeculationError
from hydra_node.runtime.child.speculative.sampling import SamplingParams
from hydra_node.runtime.speculative.wire import (
    BoundedFrameDecoder,
    WireError,
    frame,
    parse_hello,
    parse_proposal,
    start_message,
)

#: Bound on connecting and on the server's hello (a tunnel to a peer that is gone fails here).
CONNECT_TIMEOUT_S = 3.0
#: Bound on one proposal's answer (k draft steps of a small model plus the round trip).
REPLY_TIMEOUT_S = 10.0
#: EWMA weight of one round-trip sample (for status).
RTT_WEIGHT = 0.2
#: Target-alone tokens buffered before they are sent (the draft server then catches up on them
#: while the target computes; fewer messages than one per token, little catch-up left for a probe).
EXTEND_FLUSH_TOKENS = 8


class DraftUnavailable(SpeculationError):
    """The remote draft cannot be used for this request (the message says why)."""


class RemoteDrafter:
    def __init__(
        self,
        endpoint: str,
        *,
        n_vocab: int,
        vocab: str,
        clock=time.perf_counter,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        reply_timeout_s: float = REPLY_TIMEOUT_S,
    ) -> None:
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"draft endpoint must be HOST:PORT, not {endpoint!r}")
        self.address = (host.strip("[]"), int(port))
        self.n_vocab, self.vocab = n_vocab, vocab
        self.connect_timeout_s, self.reply_timeout_s = connect_timeout_s, reply_timeout_s
        self._clock = clock
        self._sock: socket.socket | None = None
        self._decoder = BoundedFrameDecoder()
        self._sampled = False
        self._extend: list[int] = []  # target-alone tokens not sent yet
        self.model: str | None = None
        self.rtt_s: float | None = None  # wall time of a proposal minus the server's compute time
        self.connects = 0
        self.failures = 0
        self.last_error: str | None = None

    # ---- the Drafter protocol ------------------------------------------------------------
    def start(self, prompt_tokens: Sequence[int], sampling: SamplingParams, seed: int | None) -> None:
        self.close()
        self._sampled = not sampling.greedy
        try:
            sock = socket.create_connection(self.address, timeout=self.connect_timeout_s)
        except OSError as exc:
            self._fail(DraftUnavailable(f"cannot connect to the draft at {self.address[0]}:{self.address[1]}: {exc}"))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock, self._decoder = sock, BoundedFrameDecoder()
        self.connects += 1
        try:
            hello = parse_hello(self._receive(self.connect_timeout_s))
        except WireError as exc:
            self._fail(DraftUnavailable(str(exc)))
        if hello.n_vocab != self.n_vocab or hello.vocab != self.vocab:
            self._fail(
                DraftUnavailable(
                    f"the draft {hello.model!r:.60} has another vocabulary "
                    f"({hello.n_vocab} tokens) than the target ({self.n_vocab})"
                )
            )
        self.model = hello.model
        self._send(start_message(prompt_tokens, sampling, seed))

    def propose(self, k: int) -> Proposal:
        self._flush_extend()
        t0 = self._clock()
        self._send({"op": "propose", "k": int(k)})
        msg = self._receive(self.reply_timeout_s)
        try:
            tokens, dists, seconds, catchup = parse_proposal(msg, k, self.n_vocab, self._sampled)
        except WireError as exc:
            self._fail(exc)
        wall = self._clock() - t0
        seconds = min(seconds, wall)
        sample = wall - seconds
        self.rtt_s = sample if self.rtt_s is None else self.rtt_s + RTT_WEIGHT * (sample - self.rtt_s)
        return Proposal(tuple(tokens), None if dists is None else tuple(dists), seconds, catchup)

    def commit(self, accepted: int, next_token: int) -> None:
        self._flush_extend()
        self._send({"op": "commit", "accepted": int(accepted), "next": int(next_token)})

    def extend(self, tokens: Sequence[int]) -> None:
        """Buffered: sent every ``EXTEND_FLUSH_TOKENS`` tokens or with the next request (no
        message per target-alone token while the controller has fallen back)."""
        if self._sock is None:
            raise DraftUnavailable("no connection to the draft (start() failed or it was closed)")
        self._extend += [int(t) for t in tokens]
        if len(self._extend) >= EXTEND_FLUSH_TOKENS:
            self._flush_extend()

    def _flush_extend(self) -> None:
        if self._extend:
            tokens, self._extend = self._extend, []
            self._send({"op": "extend", "tokens": tokens})

    # ---- connection ----------------------------------------------------------------------
    def close(self) -> None:
        self._extend = []
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def _fail(self, exc: SpeculationError) -> NoReturn:
        self.failures += 1
        self.last_error = str(exc)[:300]
        self.close()
        raise exc

    def _send(self, msg: dict) -> None:
        if self._sock is None:
            raise DraftUnavailable("no connection to the draft (start() failed or it was closed)")
        try:
            self._sock.sendall(frame(msg))
        except OSError as exc:
            self._fail(DraftUnavailable(f"draft connection lost: {exc}"))

    def _receive(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                msg = self._decoder.next_message()
            except WireError as exc:
                self._fail(exc)
            if msg is not None:
                return msg
            left = deadline - time.monotonic()
            if left <= 0:
                self._fail(DraftUnavailable(f"no answer from the draft within {timeout_s:g} s"))
            assert self._sock is not None  # _send (called first) checked it; _fail closes and raises
            try:
                self._sock.settimeout(left)
                data = self._sock.recv(65536)
            except socket.timeout:
                self._fail(DraftUnavailable(f"no answer from the draft within {timeout_s:g} s"))
            except OSError as exc:
                self._fail(DraftUnavailable(f"draft connection lost: {exc}"))
            if not data:
                self._fail(DraftUnavailable("the draft closed the connection (no draft peer, or it went away)"))
            self._decoder.receive_data(data)

    def status(self) -> dict:
        return {
            "endpoint": f"{self.address[0]}:{self.address[1]}",
            "model": self.model,
            "rtt_ms": None if self.rtt_s is None else round(self.rtt_s * 1000, 2),
            "connects": self.connects,
            "failures": self.failures,
            "last_error": self.last_error,
        }
