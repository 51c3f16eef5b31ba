"""The draft protocol: what crosses between a target and a remote draft (sans-IO parts).

Length-prefixed canonical CBOR frames (:mod:`hydra_node.codec.framing`, the one strict
decoder), each a map with an ``op``:

  server -> client, on connect: {"op": "hello", "proto": 1, "model": id, "n_vocab", "vocab": fingerprint,
                                 "n_ctx", "max_k"}  | {"op": "error", "code": "busy", ...}
  client -> server: {"op": "start", "tokens": [..], "temperature", "top_p", "top_k", "seed"}
                    {"op": "propose", "k"}          -> {"op": "proposal", "tokens": [..], "dists": null |
                                                        [[ids], [probs]] per token, "seconds", "catchup"}
                    {"op": "commit", "accepted", "next"}
                    {"op": "extend", "tokens": [..]}
  server -> client, on any failure: {"op": "error", "code", "message"}, then it closes the connection.

Only ``propose`` is answered: ``start``, ``commit`` and ``extend`` are pipelined (a failure
of one is reported instead of the next proposal), so a round costs one round trip.
Every size is bounded here; a peer that breaks a bound gets a typed :class:`WireError`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from hydra_node.codec.errors import DecodeError
from hydra_node.codec.framing import MessageDecoder, encode_message
from hydra_node.codec.jsonline import decode_object_line

from hydra_node.runtime.speculative.errors import DraftProtocolError
from hydra_node.runtime.speculative.params import DRAFT_CANDIDATES_MAX, SamplingParams

#: Protocol version in ``hello``; a client refuses any other.
DRAFT_PROTO = 1
#: Largest frame either side accepts (a start with a full 32 k-token prompt is ~160 kB).
MAX_DRAFT_FRAME_BYTES = 1024 * 1024
#: Most prompt tokens a ``start`` may carry (the draft's own n_ctx is usually lower).
MAX_PROMPT_TOKENS = 65536
#: Most draft tokens one ``propose`` may ask for (config allows draft_max_tokens <= 64).
MAX_K = 64
#: Most tokens one ``extend`` may carry (the decoder sends one per plain target step).
MAX_EXTEND_TOKENS = 4096
#: Longest ready line a draft server prints on stdout (a real one is about 150 bytes).
MAX_READY_LINE_BYTES = 4096


class WireError(DraftProtocolError):
    """A frame broke the draft protocol (bad shape, out of bounds, unknown op)."""

    def __init__(self, message: str, code: str = "bad_request"):
        super().__init__(message)
        self.code = code


class BoundedFrameDecoder(MessageDecoder):
    """The draft protocol's frame decoder: refuses frames above ``limit`` before buffering
    them, and raises :class:`WireError` (never anything else) for any bad byte."""

    def __init__(self, limit: int = MAX_DRAFT_FRAME_BYTES) -> None:
        super().__init__(limit)

    def next_message(self) -> dict | None:
        try:
            return super().next_message()
        except DecodeError as exc:
            raise WireError(str(exc), "too_large" if exc.code == "too_large" else "bad_frame") from None


def frame(msg: dict) -> bytes:
    """One draft-protocol frame (canonical CBOR); ``EncodeError`` above the frame bound."""
    return encode_message(msg, limit=MAX_DRAFT_FRAME_BYTES)


@dataclass(frozen=True)
class DraftHello:
    """What a draft server says on connect (``hello``)."""

    model: str
    n_vocab: int
    vocab: str
    n_ctx: int
    max_k: int


def parse_hello(msg: dict) -> DraftHello:
    """The server's first message as a :class:`DraftHello`; :class:`WireError` with code ``refused``
    (its ``error``, e.g. busy), ``bad_proto`` (another protocol) or ``bad_hello`` (malformed)."""
    if msg.get("op") == "error":
        raise WireError(f"draft refused: {msg.get('code')!s:.40}: {msg.get('message', '')!s:.200}", "refused")
    if msg.get("op") != "hello" or msg.get("proto") != DRAFT_PROTO:
        raise WireError(f"not a draft server of protocol {DRAFT_PROTO}: {msg!r:.120}", "bad_proto")
    model, vocab = msg.get("model", ""), msg.get("vocab")
    if not isinstance(model, str) or not isinstance(vocab, str) or len(vocab) > 64:
        raise WireError(f"malformed hello: {msg!r:.120}", "bad_hello")
    return DraftHello(
        model[:200],
        int_field(msg, "n_vocab", 1, 2**31 - 1),
        vocab,
        int_field(msg, "n_ctx", 1, 2**31 - 1),
        int_field(msg, "max_k", 1, MAX_K, default=MAX_K),
    )


@dataclass(frozen=True)
class DraftReady:
    """The draft server's ready line: ``{"event": "ready", "port", "model", "n_vocab", "vocab"}``."""

    port: int
    model: str
    n_vocab: int
    vocab: str


def parse_ready_line(line: bytes) -> DraftReady:
    """The draft server's stdout line (with or without its newline), or :class:`WireError`."""
    try:
        d = decode_object_line(line, max_bytes=MAX_READY_LINE_BYTES)
    except DecodeError as exc:
        raise WireError(f"draft server ready line: {exc}", "bad_ready") from None
    port, model, n_vocab, vocab = d.get("port"), d.get("model"), d.get("n_vocab"), d.get("vocab")
    if (
        d.get("event") != "ready"
        or type(port) is not int
        or not 0 < port < 65536
        or not isinstance(model, str)
        or len(model) > 256
        or type(n_vocab) is not int
        or not 0 < n_vocab < 2**31
        or not isinstance(vocab, str)
        or len(vocab) > 64
    ):
        raise WireError(f"not a draft server ready line: {line[:120]!r}", "bad_ready")
    return DraftReady(port, model, n_vocab, vocab)


# ---------------------------------------------------------------- field checks
def int_field(msg: dict, key: str, lo: int, hi: int, default: int | None = None) -> int:
    v = msg.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise WireError(f"{msg.get('op')}.{key} must be an integer in [{lo}, {hi}], not {v!r:.40}")
    return v


def float_field(msg: dict, key: str, lo: float, hi: float, default: float) -> float:
    v = msg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= float(v) <= hi:
        raise WireError(f"{msg.get('op')}.{key} must be a number in [{lo}, {hi}], not {v!r:.40}")
    return float(v)


def token_list(msg: dict, key: str, n_vocab: int, max_len: int, min_len: int = 1) -> list[int]:
    v = msg.get(key)
    if not isinstance(v, list) or not min_len <= len(v) <= max_len:
        raise WireError(f"{msg.get('op')}.{key} must be a list of {min_len}..{max_len} token ids")
    for t in v:
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < n_vocab:
            raise WireError(f"{msg.get('op')}.{key} holds {t!r:.20}, not a token id below {n_vocab}")
    return v


def parse_start(msg: dict, n_vocab: int, n_ctx: int) -> tuple[list[int], SamplingParams, int | None]:
    tokens = token_list(msg, "tokens", n_vocab, min(MAX_PROMPT_TOKENS, n_ctx - 1))
    try:
        sampling = SamplingParams(
            temperature=float_field(msg, "temperature", 0.0, 2.0, 0.0),
            top_p=float_field(msg, "top_p", 1e-9, 1.0, 1.0),
            top_k=int_field(msg, "top_k", 0, n_vocab, default=0),
        )
    except ValueError as exc:
        raise WireError(f"start: {exc}") from None
    seed = msg.get("seed")
    if seed is not None:
        seed = int_field(msg, "seed", 0, 2**63 - 1)
    return tokens, sampling, seed


def start_message(tokens, sampling: SamplingParams, seed: int | None) -> dict:
    return {
        "op": "start",
        "tokens": [int(t) for t in tokens],
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "seed": None if seed is None else int(seed) & (2**63 - 1),
    }


def parse_proposal(msg: dict, k: int, n_vocab: int, sampled: bool) -> tuple[list[int], list | None, float, int]:
    """The client's check of a ``proposal`` (the decoder checks ids and distributions again)."""
    if msg.get("op") == "error":
        raise WireError(f"draft server: {msg.get('message', '')!s:.300}", str(msg.get("code", "error"))[:40])
    if msg.get("op") != "proposal":
        raise WireError(f"expected a proposal, got {msg.get('op')!r:.40}")
    tokens = token_list(msg, "tokens", n_vocab, k)
    seconds = float_field(msg, "seconds", 0.0, 3600.0, 0.0)
    catchup = int_field(msg, "catchup", 0, MAX_PROMPT_TOKENS + MAX_EXTEND_TOKENS)
    dists = msg.get("dists")
    if not sampled:
        return tokens, None, seconds, catchup
    if not isinstance(dists, list) or len(dists) != len(tokens):
        raise WireError("a sampled proposal needs one distribution per token")
    out = []
    for d in dists:
        if (
            not isinstance(d, list)
            or len(d) != 2
            or not all(isinstance(x, list) for x in d)
            or not 1 <= len(d[0]) <= DRAFT_CANDIDATES_MAX
            or len(d[0]) != len(d[1])
        ):
            raise WireError(f"a distribution must be [ids, probs] with 1..{DRAFT_CANDIDATES_MAX} entries")
        out.append((d[0], d[1]))
    return tokens, out, seconds, catchup


# ---------------------------------------------------------------- vocabulary
def vocab_fingerprint(llm) -> str:
    """A digest of a ``llama_cpp.Llama``'s vocabulary: size, special ids and every token's text.

    Draft and target must tokenise alike for their token ids to mean the same thing."""
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n = llm.n_vocab()
    h = hashlib.sha256(f"{n}:{llm.token_bos()}:{llm.token_eos()}".encode())
    for i in range(n):
        h.update(llama_cpp.llama_vocab_get_text(vocab, i) or b"")
        h.update(b"\0")
    return h.hexdigest()[:32]
