"""The ``[models]`` table goes through the config loader like every section (docs/models.md)."""

import pytest

from hydra_node.config import ConfigError, parse_config_text
from hydra_node.runtime.fetch.settings import models_settings


def test_models_table_is_read():
    cfg = parse_config_text("[models]\ncache_limit_gb = 2.5\npeer_fetch = false\nread_timeout_s = 5\nshare = false\n")
    s = models_settings(cfg)
    assert (s.cache_limit_bytes, s.peer_fetch, s.read_timeout_s, s.share) == (2_500_000_000, False, 5.0, False)
    assert models_settings(parse_config_text("[models]\noffer_artifacts = false\n")).offer_artifacts is False


def test_models_defaults_without_the_table():
    s = models_settings(parse_config_text(""))
    assert (s.cache_limit_bytes, s.peer_fetch, s.share, s.offer_artifacts) == (None, True, True, True)


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
