"""Editing a config file as `benchmark tune --apply` does (hydra_node/cli/tune.py, tomlkit): the
values change, every comment, blank line, other key and the keys' order stay."""

from __future__ import annotations

import tomllib

import pytest
from hypothesis import given, settings, strategies as st

from hydra_node.cli.tune import apply_profile, set_keys
from hydra_node.config import ConfigError

COMMENTED = """# my node
[scheduler]
mode = "shadow"  # watch first

[defaults.model_fit]
ctx_size = 8192 # long chats
# flash stays auto
flash_attention = "auto"

[defaults.throughput]
threads = 8
"""


def test_set_keys_keeps_comments_key_order_and_other_keys():
    out = set_keys(
        COMMENTED,
        {
            "defaults.model_fit.ctx_size": 4096,
            "defaults.model_fit.batch": 256,
            "defaults.hardware.mmap": False,
            "defaults.throughput.threads": 0,
        },
    )
    assert "ctx_size = 4096 # long chats" in out and 'mode = "shadow"  # watch first' in out
    assert "# flash stays auto" in out and out.startswith("# my node\n")
    data = tomllib.loads(out)
    assert data["defaults"]["model_fit"] == {"ctx_size": 4096, "flash_attention": "auto", "batch": 256}
    assert data["defaults"]["hardware"] == {"mmap": False} and data["defaults"]["throughput"] == {"threads": 0}
    assert list(data) == ["scheduler", "defaults"] and list(data["defaults"]["model_fit"]) == [
        "ctx_size",
        "flash_attention",
        "batch",
    ]  # the file's order, a new key after its table's last
    lines = out.splitlines()
    assert lines[:8] == [
        "# my node",
        "[scheduler]",
        'mode = "shadow"  # watch first',
        "",
        "[defaults.model_fit]",
        "ctx_size = 4096 # long chats",
        "# flash stays auto",
        'flash_attention = "auto"',
    ]  # every line before the edits, as it was
    assert out.index("batch = 256") < out.index("[defaults.throughput]")  # added inside its table


def test_set_keys_edits_multi_line_values_dotted_keys_and_inline_tables():
    assert tomllib.loads(
        set_keys('[defaults.model_fit]\nctx_size = [\n 1,\n]\n', {"defaults.model_fit.ctx_size": 2})
    ) == {"defaults": {"model_fit": {"ctx_size": 2}}}
    dotted = set_keys('[defaults]\nmodel_fit.ctx_size = 1  # dotted\n', {"defaults.model_fit.batch": 2})
    assert "# dotted" in dotted and tomllib.loads(dotted) == {"defaults": {"model_fit": {"ctx_size": 1, "batch": 2}}}
    inline = set_keys('defaults = {model_fit = {ctx_size = 1}}\n', {"defaults.model_fit.batch": 2})
    assert tomllib.loads(inline) == {"defaults": {"model_fit": {"ctx_size": 1, "batch": 2}}}
    with pytest.raises(ValueError, match="defaults is not a table"):
        set_keys("defaults = 3\n", {"defaults.model_fit.batch": 2})
    with pytest.raises(ValueError):
        set_keys("[broken\n", {"a.b": 1})


def test_apply_profile_edits_the_file_in_place_after_a_backup_and_refuses_a_broken_one(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(COMMENTED)
    backup = apply_profile(path, {"defaults.model_fit.ctx_size": 4096, "defaults.model_fit.batch": 256})
    assert backup == tmp_path / "config.toml.bak" and backup.read_text() == COMMENTED
    assert path.read_text() == COMMENTED.replace("ctx_size = 8192", "ctx_size = 4096").replace(
        'flash_attention = "auto"\n', 'flash_attention = "auto"\nbatch = 256\n'
    )  # one line changed, one added
    fresh = tmp_path / "new" / "config.toml"
    assert apply_profile(fresh, {"defaults.model_fit.batch": 256}) is None
    assert (
        fresh.read_text().startswith("# hydra-node configuration")
        and "[defaults.model_fit]\nbatch = 256" in fresh.read_text()
    )
    path.write_text("[defaults.model_fit\nctx_size = 1\n")
    with pytest.raises(ConfigError, match="by hand"):
        apply_profile(path, {"defaults.model_fit.ctx_size": 4096})
    assert path.read_text() == "[defaults.model_fit\nctx_size = 1\n"  # nothing written


def test_a_second_apply_keeps_the_first_backup_and_writes_a_new_one(tmp_path):
    """Issue 25: a second `tune --apply` overwrote config.toml.bak, losing the original file."""
    path = tmp_path / "config.toml"
    path.write_text(COMMENTED)
    first = apply_profile(path, {"defaults.model_fit.ctx_size": 4096})
    after_first = path.read_text()
    second = apply_profile(path, {"defaults.model_fit.ctx_size": 2048})
    assert first == tmp_path / "config.toml.bak" and first.read_text() == COMMENTED  # the original, kept
    assert second == tmp_path / "config.toml.bak.1" and second.read_text() == after_first
    assert "ctx_size = 2048" in path.read_text()


values = st.one_of(
    st.booleans(),
    st.integers(-(2**31), 2**31),
    st.text(st.characters(codec="ascii", exclude_categories=("Cc",)), max_size=12),
)
keys = st.sampled_from(
    [
        "scheduler.mode",
        "defaults.model_fit.ctx_size",
        "defaults.model_fit.batch",
        "defaults.hardware.mmap",
        "defaults.throughput.threads",
        "runner.load_timeout_s",
    ]
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(keys, values, max_size=6))
def test_set_keys_sets_exactly_the_keys(changes):
    out = set_keys(COMMENTED, changes)
    expected = tomllib.loads(COMMENTED)
    for dotted, value in changes.items():
        *tables, name = dotted.split(".")
        node = expected
        for part in tables:
            node = node.setdefault(part, {})
        node[name] = value
    assert tomllib.loads(out) == expected  # the new values, every other key as it was
    kept = [line for line in COMMENTED.splitlines() if line.lstrip().startswith("#")]
    assert all(line in out.splitlines() for line in kept)
