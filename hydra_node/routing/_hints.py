"""Advisory telemetry hints exchanged by gossip: a compact, CBOR-friendly summary and its validator.

A summary is ``{"v": 1, "entries": [entry, ...]}``; every entry has text keys and integer values
(milliseconds, microseconds, permille), so it encodes canonically in CBOR without floats::

    {"node": "local" | peer id, "model": str, "age_ms": int, "n": int,
     "ok_pm": int, "ttft_ms": int, "tpot_us": int, "prefill_us_tok": int,
     "queue_ms": int, "service_ms": int, "tps": int, "hit_pm": int}

Only ``node``, ``model``, ``age_ms`` and ``n`` are required. Path-specific values (RTT, jitter,
bandwidth) are never exported: they describe the sender's links, not the target.
"""

from __future__ import annotations

from typing import Any
from dataclasses import dataclass

HINT_VERSION = 1
#: Entries exported per summary and accepted per merge (upstream status shows up to 32 hints).
MAX_SUMMARY_ENTRIES = 32
#: Longest node id or model id accepted from a peer.
MAX_NAME_CHARS = 128
#: Largest integer value accepted in an entry (~11.6 days in ms); anything above is garbage.
MAX_HINT_VALUE = 1_000_000_000

#: summary key -> (view field, divisor turning the integer into the view's unit).
HINT_FIELDS: dict[str, tuple[str, float]] = {
    "ok_pm": ("success_rate", 1000.0),
    "ttft_ms": ("ttft_ms", 1.0),
    "tpot_us": ("tpot_ms", 1000.0),
    "prefill_us_tok": ("prefill_ms_per_token", 1000.0),
    "queue_ms": ("queue_wait_ms", 1.0),
    "service_ms": ("service_ms", 1.0),
    "tps": ("tokens_per_s", 1.0),
    "hit_pm": ("cache_hit_ratio", 1000.0),
}
_REQUIRED = ("node", "model", "age_ms", "n")


class InvalidHint(ValueError):
    """A peer sent a malformed telemetry summary (the peer's fault; drop it, keep the link)."""


@dataclass(frozen=True)
class HintRecord:
    """One peer's advisory view of one target, in view units."""

    source: str
    observed_at: float
    samples: int
    values: tuple[tuple[str, float], ...]


def encode_entry(node: str, model: str, age_ms: int, samples: int, values: dict[str, float]) -> dict[str, Any]:
    """Build one summary entry from view-unit ``values`` (keys are view field names)."""
    entry: dict[str, Any] = {"node": node, "model": model, "age_ms": int(age_ms), "n": int(samples)}
    for key, (field, divisor) in HINT_FIELDS.items():
        value = values.get(field)
        if value is not None:
            entry[key] = min(MAX_HINT_VALUE, max(0, round(value * divisor)))
    return entry


def parse_summary(summary: object) -> list[dict[str, Any]]:
    """Validate an untrusted summary; return its entries or raise ``InvalidHint`` naming the fault."""
    if not isinstance(summary, dict):
        raise InvalidHint("summary: expected a map")
    if summary.get("v") != HINT_VERSION:
        raise InvalidHint(f"summary.v: expected {HINT_VERSION}, got {summary.get('v')!r}")
    entries = summary.get("entries")
    if not isinstance(entries, list):
        raise InvalidHint("summary.entries: expected a list")
    if len(entries) > MAX_SUMMARY_ENTRIES:
        raise InvalidHint(f"summary.entries: {len(entries)} entries, at most {MAX_SUMMARY_ENTRIES}")
    return [_check_entry(i, entry) for i, entry in enumerate(entries)]


def _check_entry(index: int, entry: object) -> dict[str, Any]:
    where = f"summary.entries[{index}]"
    if not isinstance(entry, dict):
        raise InvalidHint(f"{where}: expected a map")
    for key in _REQUIRED:
        if key not in entry:
            raise InvalidHint(f"{where}.{key}: missing")
    for key in ("node", "model"):
        value = entry[key]
        if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_CHARS:
            raise InvalidHint(f"{where}.{key}: expected text of 1..{MAX_NAME_CHARS} characters")
    for key, value in entry.items():
        if key in ("node", "model"):
            continue
        if key not in HINT_FIELDS and key not in ("age_ms", "n"):
            continue  # unknown keys are ignored so the summary can grow additively
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_HINT_VALUE:
            raise InvalidHint(f"{where}.{key}: expected an integer in 0..{MAX_HINT_VALUE}")
    for key in ("ok_pm", "hit_pm"):
        if key in entry and entry[key] > 1000:
            raise InvalidHint(f"{where}.{key}: permille above 1000")
    return entry


def decode_values(entry: dict[str, Any]) -> tuple[tuple[str, float], ...]:
    """View-unit values of a validated entry."""
    return tuple((field, entry[key] / divisor) for key, (field, divisor) in HINT_FIELDS.items() if key in entry)
