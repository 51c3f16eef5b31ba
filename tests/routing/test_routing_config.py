"""SchedulerConfig: the seed's [scheduler] table, validation naming the bad key."""

from __future__ import annotations

import tomllib

import pytest

from hydra_node.routing import SchedulerConfig, SchedulerConfigError, SchedulerMode

SEED = """
[scheduler]
mode = "shadow"
ttft_budget_ms = 450
tpot_budget_ms = 40
affinity_override_threshold_ms = 100
stale_after_ms = 15000
cache_affinity_credit_ms = 80
failure_penalty_ms = 500
unknown_remote_penalty_ms = 75
"""


def test_seed_table_loads_and_matches_defaults() -> None:
    config = SchedulerConfig.from_mapping(tomllib.loads(SEED)["scheduler"])
    assert config == SchedulerConfig()
    assert config.mode is SchedulerMode.SHADOW and config.ttft_budget_ms == 450.0
    assert config.as_dict()["mode"] == "shadow"


@pytest.mark.parametrize(
    "alias, mode",
    [
        ("off", "off"),
        ("disabled", "off"),
        ("dry-run", "shadow"),
        ("dry_run", "shadow"),
        ("enabled", "active"),
        ("active", "active"),
    ],
)
def test_mode_aliases(alias: str, mode: str) -> None:
    assert SchedulerConfig.from_mapping({"mode": alias}).mode.value == mode


@pytest.mark.parametrize(
    "table, key",
    [
        ({"mode": "fast"}, "mode"),
        ({"mode": 1}, "mode"),
        ({"ttft_budget_ms": 0}, "ttft_budget_ms"),
        ({"tpot_budget_ms": "40"}, "tpot_budget_ms"),
        ({"stale_after_ms": float("nan")}, "stale_after_ms"),
        ({"failure_penalty_ms": -1}, "failure_penalty_ms"),
        ({"cache_affinity_credit_ms": True}, "cache_affinity_credit_ms"),
        ({"unknown_remote_penalty_ms": float("inf")}, "unknown_remote_penalty_ms"),
        ({"hint_discount": 1.5}, "hint_discount"),
        ({"balance_margin": 2}, "balance_margin"),
        ({"prefix_affinity_chars": 1.5}, "prefix_affinity_chars"),
        ({"cooldown_base_ms": 1000, "cooldown_max_ms": 10}, "cooldown_max_ms"),
        ({"ttft_budget": 450}, "ttft_budget"),
    ],
)
def test_bad_values_name_the_key(table: dict, key: str) -> None:
    with pytest.raises(SchedulerConfigError, match=rf"^\[scheduler\]\.{key}: "):
        SchedulerConfig.from_mapping(table)


def test_not_a_table() -> None:
    with pytest.raises(ValueError, match=r"^\[scheduler\]: expected a table"):
        SchedulerConfig.from_mapping(["mode"])
    assert SchedulerConfig.from_mapping(None) == SchedulerConfig()
