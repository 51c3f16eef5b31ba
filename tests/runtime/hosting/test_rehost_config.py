"""``[rehost]`` (hydra_node/config/rehost.py), ``serve --standby`` and the config edit of
``hydra-node models min-hosts`` (hydra_node/cli/rehost_cmd.py); the service's announcement spare
figure (runtime/hosting/rehost.py ``spare_bytes``)."""

from __future__ import annotations

import pytest

from hydra_node.cli.main import build_parser, node_config_from_args
from hydra_node.cli.rehost_cmd import set_min_hosts_text
from hydra_node.config import ConfigError, parse_config_text
from hydra_node.runtime.hosting.rehost import spare_bytes


def _cfg(tmp_path, *argv: str):
    args = build_parser().parse_args(["serve", "--home", str(tmp_path / "home"), *argv])
    return node_config_from_args(args)


def test_the_rehost_section_parses_with_its_defaults():
    r = parse_config_text("").rehost
    assert (r.enabled, dict(r.min_hosts), r.keep_recent_s, r.settle_s, r.max_models) == (True, {}, 600.0, 3.0, 2)
    r = parse_config_text(
        '[rehost]\nenabled = false\nmin_hosts = {"m.v1" = 2, other = 0}\nkeep_recent_s = 0\nsettle_s = 1\nmax_models = 1'
    ).rehost
    assert (r.enabled, dict(r.min_hosts), r.keep_recent_s, r.settle_s, r.max_models) == (
        False,
        {"m.v1": 2, "other": 0},
        0.0,
        1.0,
        1,
    )


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[rehost]\nwhatever = 1", "[rehost].whatever"),
        ('[rehost]\nenabled = "yes"', "[rehost].enabled"),
        ("[rehost]\nmin_hosts = 3", "[rehost].min_hosts"),
        ('[rehost]\nmin_hosts = {m = -1}', "[rehost].min_hosts.m"),
        ('[rehost]\nmin_hosts = {m = 17}', "[rehost].min_hosts.m"),
        ('[rehost]\nmin_hosts = {m = true}', "[rehost].min_hosts.m"),
        ('[rehost]\nmin_hosts = {" m" = 1}', "[rehost].min_hosts"),
        ("[rehost]\nsettle_s = -1", "[rehost].settle_s"),
        ("[rehost]\nkeep_recent_s = true", "[rehost].keep_recent_s"),
        ("[rehost]\nmax_models = 9", "[rehost].max_models"),
        ("rehost = 1", "[rehost]"),
    ],
)
def test_bad_rehost_values_name_the_key(text, key):
    with pytest.raises(ConfigError) as exc:
        parse_config_text(text)
    assert str(exc.value).startswith(key + ":"), str(exc.value)


def test_standby_hosts_nothing_and_excludes_model_and_no_model(tmp_path):
    cfg = _cfg(tmp_path, "--standby")
    assert cfg.standby and cfg.role == "host" and cfg.models == () and not cfg.no_model
    for extra, named in ((("--model", "x.gguf"), "--model"), (("--no-model",), "--no-model")):
        with pytest.raises(ConfigError, match=f"--standby .* drop {named}"):
            _cfg(tmp_path, "--standby", *extra)
    off = tmp_path / "off.toml"
    off.write_text("[rehost]\nenabled = false\n")
    with pytest.raises(ConfigError, match=r"\[rehost\].enabled is false"):
        _cfg(tmp_path, "--standby", "--config", str(off))
    assert not _cfg(tmp_path).standby


def test_a_standby_node_loads_no_bundled_model(tmp_path):
    from hydra_node.node import Node

    assert Node(_cfg(tmp_path, "--standby")).models == []


def test_min_hosts_is_written_into_the_config_keeping_the_rest():
    text = "# mine\n[runner]\nload_timeout_s = 30.0  # slow disk\n"
    new = set_min_hosts_text(text, "Qwen2.5-7B", 2)
    assert "# mine" in new and "# slow disk" in new
    cfg = parse_config_text(new)
    assert dict(cfg.rehost.min_hosts) == {"Qwen2.5-7B": 2} and cfg.runner.load_timeout_s == 30.0
    again = parse_config_text(set_min_hosts_text(new, "other", 0))
    assert dict(again.rehost.min_hosts) == {"Qwen2.5-7B": 2, "other": 0}
    with pytest.raises(ConfigError, match="min_hosts"):
        set_min_hosts_text(text, "m", 99)  # a file serve would refuse is never written
    with pytest.raises(ConfigError, match="not valid TOML"):
        set_min_hosts_text("[[[", "m", 1)


def test_the_announced_spare_moves_only_past_the_hysteresis():
    gb = 1 << 30
    assert spare_bytes(None, 8 * gb) == 8 * gb
    assert spare_bytes(8 * gb, 8 * gb - gb // 2) == 8 * gb  # free memory wanders: no new announcement
    assert spare_bytes(8 * gb, 6 * gb) == 6 * gb  # a model came: announced
