"""The ``[models]`` table goes through the config loader like every section (docs/models.md)."""

import pytest

from hydra_node.config import ConfigError, parse_config_text
from hydra_node.runtime.fetch.settings import models_settings


def test_models_table_is_read():
    cfg = parse_config_text("[models]\ncache_limit_gb = 2.5\npeer_fetch = false\nread_timeout_s = 5\nshare = false\n")
    s = models_settings(cfg)
    assert (s.peer_fetch, s.read_timeout_s, s.share) == (False, 5.0, False)
    assert cfg.placement.cache_capacity_gb == 2.5  # the deprecated key sets the one capacity
    assert models_settings(parse_config_text("[models]\noffer_artifacts = false\n")).offer_artifacts is False


def test_models_defaults_without_the_table():
    s = models_settings(parse_config_text(""))
    assert (s.peer_fetch, s.share, s.offer_artifacts) == (True, True, True)


@pytest.mark.parametrize(
    "text, key",
    [
        ("[models]\ncache_size = 1\n", "cache_size"),
        ("[models]\nread_timeout_s = 0\n", "read_timeout_s"),
        ("[models]\npeer_fetch = \"yes\"\n", "peer_fetch"),
        ("[models]\noffer_artifacts = 1\n", "offer_artifacts"),
    ],
)
def test_models_bad_keys_are_refused(text, key):
    with pytest.raises(ConfigError, match=key):
        parse_config_text(text)


def test_the_deprecated_capacity_key_is_logged_and_a_contradiction_refused(caplog):
    """One cache, one capacity: ``[placement] cache_capacity_gb``. ``[models] cache_limit_gb`` still
    sets it, with a warning naming the replacement; both with different values are an error."""
    with caplog.at_level("WARNING", logger="hydra.config"):
        cfg = parse_config_text("[models]\ncache_limit_gb = 3\n")
    assert cfg.placement.cache_capacity_gb == 3.0
    assert any("[placement].cache_capacity_gb" in r.getMessage() for r in caplog.records)
    same = parse_config_text("[models]\ncache_limit_gb = 3\n[placement]\ncache_capacity_gb = 3\n")
    assert same.placement.cache_capacity_gb == 3.0
    with pytest.raises(ConfigError, match=r"\[models\].cache_limit_gb = 3 and \[placement\].cache_capacity_gb = 5"):
        parse_config_text("[models]\ncache_limit_gb = 3\n[placement]\ncache_capacity_gb = 5\n")
    caplog.clear()
    with caplog.at_level("WARNING", logger="hydra.config"):
        assert parse_config_text("[placement]\ncache_capacity_gb = 5\n").placement.cache_capacity_gb == 5.0
    assert not caplog.records
