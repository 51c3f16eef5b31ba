"""``[defaults.model_fit] reasoning_format`` (llama-server's ``--reasoning-format``) reaches the runner:
validated naming the key, carried on the runner's argv, and read back by the child's own parser
(docs/reasoning.md "Override")."""

from __future__ import annotations

import pytest

from hydra_node.config import ConfigError, parse_config_text
from hydra_node.config.runner_settings import runner_settings_from
from hydra_node.models import resolve_model
from hydra_node.runtime.child.main import build_parser
from hydra_node.runtime.runner.argv import runner_argv
from hydra_node.runtime.runner.records import REASONING_FORMAT_SETTINGS


def _argv(text: str) -> list[str]:
    return runner_argv(runner_settings_from(parse_config_text(text)), resolve_model(None), 3, None)


def test_the_default_is_auto_detection():
    assert parse_config_text("").defaults.model_fit.reasoning_format == "auto"
    argv = _argv("")
    assert argv[argv.index("--reasoning-format") + 1] == "auto"
    assert build_parser().parse_args(argv[3:]).reasoning_format == "auto"


@pytest.mark.parametrize("fmt", REASONING_FORMAT_SETTINGS)
def test_each_setting_reaches_the_child_parser(fmt):
    argv = _argv(f'[defaults.model_fit]\nreasoning_format = "{fmt}"\n')
    assert argv.count("--reasoning-format") == 1 and argv[argv.index("--reasoning-format") + 1] == fmt
    assert build_parser().parse_args(argv[3:]).reasoning_format == fmt  # argv[:3]: python -m module


@pytest.mark.parametrize("value", ['"deepseek"', '""', '"Think"'])
def test_a_bad_value_is_refused_naming_the_key_and_the_choices(value):
    with pytest.raises(
        ConfigError, match=r"\[defaults.model_fit\].reasoning_format: must be one of auto, none, think, gpt-oss"
    ):
        parse_config_text(f"[defaults.model_fit]\nreasoning_format = {value}\n")
    with pytest.raises(ConfigError, match=r"\[defaults.model_fit\].reasoning_format: must be a string"):
        parse_config_text("[defaults.model_fit]\nreasoning_format = true\n")
