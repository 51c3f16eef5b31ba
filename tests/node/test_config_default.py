"""The default config file (<home>/config.toml), layering (file < --config < flags), `config show`/`path`,
and the seed README's starting profile (editing the file: tests/cli/test_config_edit.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from hydra_node.cli.config_sources import load_layered, merge_tables
from hydra_node.cli.main import build_parser, node_config_from_args
from hydra_node.config import RESERVED_KEYS, ConfigError, load_config_file
from hydra_node.config.runner_settings import runner_settings_from

SEED_PROFILE = Path(__file__).parent / "fixtures" / "seed_starting_profile.toml"


def cfg_of(home: Path, *flags: str):
    return node_config_from_args(build_parser().parse_args(["serve", "--home", str(home), *flags]))


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hydra_node.cli", *args], capture_output=True, text=True, timeout=60)


# ---- the seed README's compact starting profile ----------------------------------------------


def test_the_seed_starting_profile_parses_and_every_key_acts_or_is_reserved():
    data = tomllib.loads(SEED_PROFILE.read_text())
    cfg = load_config_file(SEED_PROFILE)
    leaves = {
        f"{t}.{k}"
        for t, table in (("defaults." + s, v) for s, v in data["defaults"].items())
        for k, val in table.items()
        if not isinstance(val, dict)
    }
    leaves |= {f"defaults.model_fit.prefix_cache.{k}" for k in data["defaults"]["model_fit"]["prefix_cache"]}
    reserved = set(cfg.reserved_keys)
    assert reserved == {
        "defaults.hardware.device",
        "defaults.model_fit.kv_cache_policy",
        "defaults.model_fit.prefix_cache.payload_mode",
        "defaults.throughput.tuning_profile",
        "defaults.skippy.activation_wire_dtype",
        "defaults.skippy.binary_stage_transport",
        "defaults.skippy.prefill_chunking",
        "defaults.skippy.prefill_chunk_size",
    }
    assert reserved <= leaves and all(any(k == r or k.startswith(r + ".") for r in RESERVED_KEYS) for k in reserved)
    # every other key takes effect: it reaches the runner's settings or the node's budget
    rs = runner_settings_from(cfg)
    assert (rs.n_ctx, rs.n_batch, rs.n_ubatch, rs.flash_attention) == (8192, 1024, 256, "auto")
    assert (rs.share_prefixes, rs.max_cached_prefixes, rs.min_shared_tokens) == (True, 64, 64)
    assert (rs.mmap, rs.mlock, rs.n_gpu_layers, rs.parallel, rs.threads, rs.threads_batch) == (
        "auto",
        False,
        None,
        1,
        8,
        4,
    )
    assert cfg.defaults.hardware.safety_margin_gb == 2.0 and cfg.defaults.hardware.model_runtime == "auto"
    acting = leaves - reserved
    assert len(acting) == 15, sorted(acting)


def test_the_seed_profile_as_the_default_file_is_what_serve_runs_with(tmp_path):
    (tmp_path / "config.toml").write_text(SEED_PROFILE.read_text())
    cfg = cfg_of(tmp_path)
    assert cfg.config_files == (str(tmp_path / "config.toml"),)
    assert cfg.file.defaults.model_fit.ctx_size == 8192 and "defaults.skippy.prefill_chunking" in cfg.file.reserved_keys


@pytest.mark.parametrize(
    "text, key, value",
    [
        ("[defaults.hardware]\nmmap = true\n", "mmap", "on"),
        ("[defaults.hardware]\nmmap = false\n", "mmap", "off"),
        ("[defaults.hardware]\nmmap = \"auto\"\n", "mmap", "auto"),
        ("[defaults.model_fit]\nflash_attention = false\n", "flash_attention", "off"),
        ("[defaults.throughput]\nparallel = 4\n", "parallel", 4),
    ],
)
def test_upstream_value_types_are_accepted(tmp_path, text, key, value):
    (tmp_path / "config.toml").write_text(text)
    d = cfg_of(tmp_path).file.defaults
    section = d.hardware if key == "mmap" else d.throughput if key == "parallel" else d.model_fit
    assert getattr(section, key) == value


# ---- layering ---------------------------------------------------------------------------------


def test_no_default_file_means_defaults(tmp_path):
    cfg = cfg_of(tmp_path)
    assert cfg.config_files == () and cfg.file.defaults.model_fit.ctx_size == 4096


def test_config_layers_over_the_default_file_and_flags_over_both(tmp_path):
    (tmp_path / "config.toml").write_text(
        "[defaults.model_fit]\nctx_size = 8192\nbatch = 256\n[defaults.speculative]\ndraft_max_tokens = 4\n"
    )
    extra = tmp_path / "extra.toml"
    extra.write_text("[defaults.model_fit]\nctx_size = 2048\n")
    cfg = cfg_of(tmp_path, "--config", str(extra), "--draft", "/x/draft.gguf")
    assert cfg.config_files == (str(tmp_path / "config.toml"), str(extra))
    mf = cfg.file.defaults.model_fit
    assert (mf.ctx_size, mf.batch) == (2048, 256)  # --config wins per key; the rest of the default file stays
    spec = cfg.file.defaults.speculative
    assert (spec.strategy, spec.draft_model, spec.draft_max_tokens) == ("local", "/x/draft.gguf", 4)


def test_rules_across_keys_hold_across_files(tmp_path):
    (tmp_path / "config.toml").write_text("[defaults.model_fit]\nkv_dtype = \"q8_0\"\n")
    extra = tmp_path / "extra.toml"
    extra.write_text("[defaults.model_fit]\nflash_attention = \"off\"\n")
    with pytest.raises(ConfigError, match="needs flash attention.*in .*config.toml \\+ .*extra.toml"):
        cfg_of(tmp_path, "--config", str(extra))


def test_a_broken_default_file_names_itself(tmp_path):
    (tmp_path / "config.toml").write_text("[defaults.model_fit\n")
    with pytest.raises(ConfigError, match="default config .*config.toml: not valid TOML"):
        cfg_of(tmp_path)
    with pytest.raises(ConfigError, match="--config .*nope.toml: cannot read"):
        load_layered(tmp_path / "empty", str(tmp_path / "nope.toml"))


def test_merge_tables_replaces_leaves_and_merges_tables():
    assert merge_tables({"a": {"x": 1, "y": [1]}, "b": 2}, {"a": {"y": [2]}, "c": 3}) == {
        "a": {"x": 1, "y": [2]},
        "b": 2,
        "c": 3,
    }


def test_config_show_names_every_source(tmp_path):
    (tmp_path / "config.toml").write_text("[defaults.model_fit]\nctx_size = 8192\n")
    extra = tmp_path / "extra.toml"
    extra.write_text("[scheduler]\nmode = \"active\"\n")
    r = run_cli(
        "config",
        "show",
        "--json",
        "--home",
        str(tmp_path),
        "--config",
        str(extra),
        "--port",
        "9500",
        "--cors-origin",
        "http://a.example",
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    v = d["values"]
    assert d["files"] == [str(tmp_path / "config.toml"), str(extra)]
    assert v["defaults.model_fit.ctx_size"] == {"value": 8192, "source": str(tmp_path / "config.toml")}
    assert v["scheduler.mode"] == {"value": "active", "source": str(extra)}
    assert v["defaults.model_fit.batch"] == {"value": 512, "source": "default"}
    assert v["api.cors_origins"] == {"value": ["http://a.example"], "source": "flag"}
    assert v["node.api_port"] == {"value": 9500, "source": "flag"}
    assert v["node.console_port"]["source"] == "default"
    text = run_cli("config", "show", "--home", str(tmp_path))
    assert text.returncode == 0 and "ctx_size = 8192" in text.stdout and f"# {tmp_path / 'config.toml'}" in text.stdout


def test_config_path_and_a_configuration_error(tmp_path):
    r = run_cli("config", "path", "--home", str(tmp_path))
    assert r.returncode == 0 and r.stdout.strip() == str(tmp_path / "config.toml")
    (tmp_path / "config.toml").write_text("[defaults.model_fit]\nctx_size = 1\n")
    r = run_cli("config", "show", "--home", str(tmp_path))
    assert r.returncode == 2 and "ctx_size: must be between 128" in r.stderr
