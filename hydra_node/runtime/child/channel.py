"""Runner channel (sans-IO): length-prefixed canonical CBOR maps between the node and its
model runner children over a socketpair.

The framing and the strict decoding are :mod:`hydra_node.codec.framing`'s (the one
decoder of bytes from a peer or a child); this module adds the channel's bound, the
check that an ``id`` is a request id, and the typed reading of a runner's answers
(:func:`runner_event_from_wire`) and of its engine figures (:func:`engine_stats_from_wire`).
A bad frame raises :class:`ChannelError` (the child is broken and gets restarted); a
malformed answer to a request raises :class:`RunnerProtocolError`, a ``GenerationError``
the API answers with 502 (a malformed ``stats`` frame raises it too: the supervisor drops
and counts it).
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

from hydra_node.codec.errors import DecodeError, FrameError
from hydra_node.codec.framing import MessageDecoder, encode_message
from hydra_node.inference import (
    MAX_EVENT_MILLIS,
    MAX_FINISH_REASON_CHARS,
    MAX_TOKEN_COUNT,
    Finished,
    MalformedRemoteEvent,
    TextDelta,
    TokenLogprob,
    remote_error_from_wire,
)
from hydra_node.inference.events import MAX_DELTA_LOGPROBS
from hydra_node.runtime.child.engine.slots import MAX_SLOTS
from hydra_node.runtime.child.stats import EngineStatistics

__all__ = [
    "MAX_CHANNEL_FRAME_BYTES",
    "ChannelError",
    "FrameDecoder",
    "RunnerProtocolError",
    "encode_frame",
    "engine_stats_from_wire",
    "runner_event_from_wire",
]

#: Largest runner-channel frame: one request or one text delta; prompts are capped at the API's 8 MiB body.
MAX_CHANNEL_FRAME_BYTES = 16 * 1024 * 1024
#: Largest request id (ids are a counter; a child echoes them back).
MAX_REQUEST_ID = 2**63 - 1

#: The byte stream is not a valid sequence of frames (any codec ``DecodeError``).
ChannelError = DecodeError


def encode_frame(msg: dict) -> bytes:
    """One frame for `msg`; ``EncodeError`` (our bug) above the channel's bound or outside the data model."""
    return encode_message(msg, limit=MAX_CHANNEL_FRAME_BYTES)


class FrameDecoder(MessageDecoder):
    """Accumulates bytes; :meth:`next_message` returns a map with a text ``op`` or None when more
    is needed, and raises :class:`ChannelError` on anything else."""

    def __init__(self) -> None:
        super().__init__(MAX_CHANNEL_FRAME_BYTES)

    def check(self, msg: dict[str, Any]) -> None:
        rid = msg.get("id")
        if rid is not None and (type(rid) is not int or not 0 <= rid <= MAX_REQUEST_ID):
            raise FrameError(f"{msg['op']}: 'id' must be a request id, not {rid!r:.40}", code="bad_message")


class RunnerProtocolError(MalformedRemoteEvent):
    """A runner sent an answer that breaks the channel protocol (the child's fault): 502."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="bad_runner_message")


def _count(msg: dict, key: str, default: int | None = None) -> int:
    v = msg.get(key, default)
    if type(v) is not int or not 0 <= v <= MAX_TOKEN_COUNT:
        raise RunnerProtocolError(f"runner {msg.get('op')}: {key!r} must be a count, not {v!r:.40}")
    return v


def _millis(msg: dict, key: str) -> float:
    v = msg.get(key, 0.0)
    if type(v) not in (int, float) or not 0.0 <= v <= MAX_EVENT_MILLIS:
        raise RunnerProtocolError(f"runner {msg.get('op')}: {key!r} must be a duration, not {v!r:.40}")
    return float(v)


def _logprobs(msg: dict) -> tuple[TokenLogprob, ...]:
    """A delta's ``logprobs`` (absent: none): a list of at most MAX_DELTA_LOGPROBS token entries."""
    lps = msg.get("logprobs", [])
    if not isinstance(lps, list) or len(lps) > MAX_DELTA_LOGPROBS:
        raise RunnerProtocolError(f"runner delta: 'logprobs' must be a list of at most {MAX_DELTA_LOGPROBS} entries")
    try:
        return tuple(TokenLogprob.from_wire(e) for e in lps)
    except RunnerProtocolError:
        raise
    except MalformedRemoteEvent as exc:
        raise RunnerProtocolError(f"runner {exc}") from None


def _tokens(msg: dict) -> tuple[int, ...]:
    """A delta's ``tokens`` (absent: none): the ids generated since the previous delta, at most MAX_DELTA_LOGPROBS."""
    toks = msg.get("tokens", [])
    if (
        not isinstance(toks, list)
        or len(toks) > MAX_DELTA_LOGPROBS
        or not all(type(t) is int and 0 <= t < 2**31 for t in toks)
    ):
        raise RunnerProtocolError(f"runner delta: 'tokens' must be a list of at most {MAX_DELTA_LOGPROBS} token ids")
    return tuple(toks)


def _reasoning_tokens(msg: dict) -> int:
    """A done frame's ``reasoning_tokens`` (absent: 0): at most its ``completion_tokens``."""
    n = _count(msg, "reasoning_tokens", 0)
    if n > msg.get("completion_tokens", 0):
        raise RunnerProtocolError(
            f"runner done: {n} reasoning tokens of {msg.get('completion_tokens')} completion tokens"
        )
    return n


def runner_event_from_wire(msg: dict, *, queue_wait_ms: float, served_by: str) -> TextDelta | Finished:
    """A runner's ``delta`` (with its ``logprobs`` entries, :class:`TokenLogprob`'s wire form,
    decoded strictly, its ``tokens`` and its ``reasoning`` text) or ``done`` (with its
    ``reasoning_tokens``) as a typed event; its ``error`` raised as the
    ``GenerationError`` it reports (the runner's status kept: it is our own child);
    anything malformed raises :class:`RunnerProtocolError`."""
    op = msg.get("op")
    if op == "delta":
        text, reasoning = msg.get("text"), msg.get("reasoning", "")
        if not isinstance(text, str):
            raise RunnerProtocolError("runner delta: 'text' must be text")
        if not isinstance(reasoning, str):  # a reasoning model's thoughts (docs/reasoning.md)
            raise RunnerProtocolError("runner delta: 'reasoning' must be text")
        return TextDelta(text, _logprobs(msg), _tokens(msg), reasoning)
    if op == "done":
        reason = msg.get("finish_reason")
        if not isinstance(reason, str) or not reason or len(reason) > MAX_FINISH_REASON_CHARS:
            raise RunnerProtocolError(f"runner done: bad finish_reason {reason!r:.40}")
        return Finished(
            reason,
            _count(msg, "prompt_tokens"),
            _count(msg, "completion_tokens"),
            queue_wait_ms,
            _millis(msg, "ttft_ms"),
            _millis(msg, "itl_ms"),
            served_by,
            _count(msg, "cached_tokens", 0),
            _reasoning_tokens(msg),
        )
    if op == "error":
        raise remote_error_from_wire(msg, relay_status=True)
    raise RunnerProtocolError(f"runner sent {op!r:.40} where a delta, done or error was expected")


#: Largest rate a runner may report (tokens per second): far above any real host, finite.
MAX_TOKENS_PER_S = 1e9
_STATS_FIELDS = tuple(f.name for f in fields(EngineStatistics))
_STATS_RATES = frozenset({"batch_mean", "prefill_tokens_per_s", "decode_tokens_per_s"})
#: Counters that only grow while a runner lives (reused tokens pass 2**31 within days): up to 2**53.
_PROMPT_CACHE_FIGURES = {k for k in _STATS_FIELDS if k.startswith("prompt_cache_")}  # its bytes pass 2**31
_STATS_TOTALS = frozenset({"steps", "prefix_hits", "prefix_misses", "prefix_reused_tokens", "prefix_shared"}) | (
    _PROMPT_CACHE_FIGURES
)
MAX_STATS_TOTAL = 2**53


def _rate(msg: dict, key: str, top: float) -> float:
    v = msg[key]
    if type(v) not in (int, float) or not math.isfinite(v) or not 0.0 <= v <= top:
        raise RunnerProtocolError(f"runner stats: {key!r} must be a number in [0, {top:g}], not {v!r:.40}")
    return float(v)


def _total(msg: dict, key: str) -> int:
    v = msg[key]
    if type(v) is not int or not 0 <= v <= MAX_STATS_TOTAL:
        raise RunnerProtocolError(f"runner stats: {key!r} must be a total in [0, 2**53], not {v!r:.40}")
    return v


def engine_stats_from_wire(msg: dict) -> EngineStatistics:
    """A runner's ``stats`` frame as :class:`EngineStatistics`; a missing, unknown or out-of-range
    field, or figures that contradict each other, raise :class:`RunnerProtocolError`."""
    if msg.get("op") != "stats":
        raise RunnerProtocolError(f"runner sent {msg.get('op')!r:.40} where stats were expected")
    keys = set(msg) - {"op"}
    if keys != set(_STATS_FIELDS):
        missing, unknown = sorted(set(_STATS_FIELDS) - keys), sorted(keys - set(_STATS_FIELDS))
        raise RunnerProtocolError(f"runner stats: missing {missing[:4]!r:.80}, unknown {unknown[:4]!r:.80}")
    n_slots = _count(msg, "n_slots")
    if not 1 <= n_slots <= MAX_SLOTS:
        raise RunnerProtocolError(f"runner stats: 'n_slots' must be 1..{MAX_SLOTS}, not {n_slots}")
    values: dict[str, Any] = {
        k: _rate(msg, k, n_slots if k == "batch_mean" else MAX_TOKENS_PER_S)
        if k in _STATS_RATES
        else _total(msg, k)
        if k in _STATS_TOTALS
        else _count(msg, k)
        for k in _STATS_FIELDS
    }
    st = EngineStatistics(**values)
    if st.active + st.free_slots != n_slots or st.batch_last > n_slots or st.kv_used > st.kv_budget:
        raise RunnerProtocolError(
            f"runner stats contradict themselves: {n_slots} slots, {st.active} active, "
            f"{st.free_slots} free, batch {st.batch_last}, kv {st.kv_used}/{st.kv_budget}"
        )
    return st
