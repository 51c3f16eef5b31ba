"""``[scheduler]`` configuration: a frozen, validated dataclass."""

from __future__ import annotations

from typing import Any
import enum
import math
from dataclasses import asdict, dataclass, fields


class SchedulerConfigError(ValueError):
    """A ``[scheduler]`` key has a bad value (the operator's fault); the message names the key."""


class SchedulerMode(str, enum.Enum):
    """A str enum, so ``config.mode == "shadow"`` holds as it did for the old config section."""

    OFF = "off"  # baseline routing only
    SHADOW = "shadow"  # baseline routing; the scored choice is recorded
    ACTIVE = "active"  # route by score


_MODE_ALIASES = {
    "off": "off",
    "disabled": "off",
    "shadow": "shadow",
    "dry_run": "shadow",
    "dry-run": "shadow",
    "active": "active",
    "enabled": "active",
}


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduler knobs. The first eight are the seed's ``[scheduler]`` keys (README values)."""

    mode: SchedulerMode = SchedulerMode.SHADOW
    ttft_budget_ms: float = 450.0
    tpot_budget_ms: float = 40.0
    affinity_override_threshold_ms: float = 100.0
    stale_after_ms: float = 15000.0
    cache_affinity_credit_ms: float = 80.0
    failure_penalty_ms: float = 500.0
    unknown_remote_penalty_ms: float = 75.0
    # ---- Hydra additions -----------------------------------------------------------------
    #: Extra cost per ms of predicted TTFT / total TPOT over budget (1.0 doubles the excess).
    budget_penalty_weight: float = 1.0
    #: Weight of the decode term: completion time matters, TTFT matters more.
    decode_weight: float = 0.5
    #: Scores within this fraction of the best are treated as equal (they are noisy estimates);
    #: among them the least-loaded target (in-flight per slot) wins, spreading load.
    balance_margin: float = 0.05
    #: Unknown-penalty factor kept when a target is known only from peer hints (0 = trust fully).
    hint_discount: float = 0.5
    #: Priors used when neither measurement nor advertisement exists.
    default_tpot_ms: float = 50.0
    default_prefill_ms_per_token: float = 1.0
    default_output_tokens: int = 256
    default_cold_start_ms: float = 10000.0
    default_bandwidth_bps: float = 12_500_000.0  # 100 Mbit/s
    #: Affinity entries expire after this long without use (upstream: 20 minutes).
    affinity_ttl_ms: float = 1_200_000.0
    #: Characters of the system/first user message hashed into the prefix affinity key.
    prefix_affinity_chars: int = 2048
    #: Cooldown after consecutive failures: base x 2^(n-1), capped (upstream: 30 s, 5 min).
    cooldown_base_ms: float = 2000.0
    cooldown_max_ms: float = 300_000.0
    #: Time between two points of the telemetry history (``GET /api/history``, the console's charts).
    history_interval_ms: float = 5000.0
    #: Times one generation may continue on another host after its host failed mid-stream
    #: (docs/scheduler.md "Continuing a stream"); 0 disables continuation.
    max_continuations: int = 2
    #: Seconds a request (or a continuation) with no routable target waits for one when its model is
    #: expected back (docs/scheduler.md "Waiting for a target"); 0: fail at once.
    target_wait_s: float = 60.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "mode":
                if not isinstance(value, SchedulerMode):
                    raise SchedulerConfigError(f"[scheduler].mode: expected off|shadow|active, got {value!r}")
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise SchedulerConfigError(f"[scheduler].{f.name}: expected a finite number, got {value!r}")
            if value < 0:
                raise SchedulerConfigError(f"[scheduler].{f.name}: must be >= 0, got {value!r}")
        for key in (
            "ttft_budget_ms",
            "tpot_budget_ms",
            "stale_after_ms",
            "default_tpot_ms",
            "default_prefill_ms_per_token",
            "default_output_tokens",
            "default_bandwidth_bps",
            "affinity_ttl_ms",
            "prefix_affinity_chars",
            "cooldown_base_ms",
        ):
            if getattr(self, key) < 1:
                raise SchedulerConfigError(f"[scheduler].{key}: must be >= 1, got {getattr(self, key)!r}")
        for key in ("hint_discount", "balance_margin"):
            if getattr(self, key) > 1:
                raise SchedulerConfigError(f"[scheduler].{key}: must be in 0..1, got {getattr(self, key)!r}")
        if self.cooldown_max_ms < self.cooldown_base_ms:
            raise SchedulerConfigError("[scheduler].cooldown_max_ms: must be >= cooldown_base_ms")
        if isinstance(self.max_continuations, float) or self.max_continuations > 16:
            raise SchedulerConfigError(
                f"[scheduler].max_continuations: expected an integer 0..16, got {self.max_continuations!r}"
            )
        if self.target_wait_s > 3600:
            raise SchedulerConfigError(
                f"[scheduler].target_wait_s: must be 0..3600 seconds, got {self.target_wait_s!r}"
            )
        if not 100 <= self.history_interval_ms <= 3_600_000:
            raise SchedulerConfigError(
                f"[scheduler].history_interval_ms: must be 100..3600000, got {self.history_interval_ms!r}"
            )

    @classmethod
    def from_mapping(cls, data: object) -> SchedulerConfig:
        """Build from a parsed TOML ``[scheduler]`` table; unknown keys and bad values are errors."""
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise SchedulerConfigError(f"[scheduler]: expected a table, got {type(data).__name__}")
        known = {f.name: f for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                raise SchedulerConfigError(f"[scheduler].{key}: unknown key")
            if key == "mode":
                alias = _MODE_ALIASES.get(value) if isinstance(value, str) else None
                if alias is None:
                    raise SchedulerConfigError(f"[scheduler].mode: expected off|shadow|active, got {value!r}")
                kwargs[key] = SchedulerMode(alias)
            elif key in ("default_output_tokens", "prefix_affinity_chars", "max_continuations"):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise SchedulerConfigError(f"[scheduler].{key}: expected an integer, got {value!r}")
                kwargs[key] = value
            else:
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise SchedulerConfigError(f"[scheduler].{key}: expected a number, got {value!r}")
                kwargs[key] = float(value)
        return cls(**kwargs)

    def as_dict(self) -> dict[str, Any]:
        """Plain data for ``/api/status.scheduler.config``."""
        data = asdict(self)
        data["mode"] = self.mode.value
        return data
