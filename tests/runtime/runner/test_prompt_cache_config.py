"""``[defaults.model_fit.prefix_cache]`` ``ram_mb`` and ``disk_gb`` reach the runner's argv (the disk
tier under ``HOME/prompt-cache/<model>``, the digests table beside the KV exports'), 0 turns a tier
off, and a value out of range is refused naming the key (docs/prompt-cache.md)."""

from __future__ import annotations

import pytest

from hydra_node.config import ConfigError, parse_config_text
from hydra_node.config.runner_settings import runner_settings_from
from hydra_node.models import resolve_model
from hydra_node.runtime.runner.argv import prompt_cache_dir, runner_argv


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def _argv(text: str, home) -> list[str]:
    return runner_argv(runner_settings_from(parse_config_text(text)), resolve_model(None), 3, home)


def test_the_tier_sizes_and_the_directory_reach_the_runner(tmp_path):
    argv = _argv("[defaults.model_fit.prefix_cache]\nram_mb = 64\ndisk_gb = 0.5\n", tmp_path)
    assert _flag(argv, "--prompt-cache-ram-mb") == "64" and _flag(argv, "--prompt-cache-disk-gb") == "0.5"
    assert _flag(argv, "--prompt-cache-dir") == str(prompt_cache_dir(tmp_path, resolve_model(None).id))
    assert _flag(argv, "--model-digests") == str(tmp_path / "kv" / "digests.json")
    defaults = _argv("", tmp_path)
    assert (_flag(defaults, "--prompt-cache-ram-mb"), _flag(defaults, "--prompt-cache-disk-gb")) == ("1024", "8.0")
    off = _argv("[defaults.model_fit.prefix_cache]\nram_mb = 0\ndisk_gb = 0\n", tmp_path)
    assert _flag(off, "--prompt-cache-ram-mb") == "0" and "--prompt-cache-dir" not in off
    assert "--prompt-cache-dir" not in _argv("", None)  # no home: no disk tier


@pytest.mark.parametrize("line", ["ram_mb = -1", "ram_mb = 1.5", "disk_gb = -0.1", "disk_gb = 'big'"])
def test_a_bad_size_is_refused_naming_the_key(line):
    with pytest.raises(ConfigError, match=line.split()[0]):
        parse_config_text(f"[defaults.model_fit.prefix_cache]\n{line}\n")
