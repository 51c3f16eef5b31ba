"""The HTTP front door's options: ``[api]`` keys and the flags ``--cors-origin``, ``--allow-host``,
``--api-key-file``, ``--join-file``, ``$HYDRA_JOIN`` (secrets that need not show in ``ps``), and what
the composition root hands each listener."""

from __future__ import annotations

import pytest

from hydra_node.cli.main import build_parser, node_config_from_args
from hydra_node.config import ConfigError, NodeConfig, parse_config_text
from hydra_node.node import Node


def _cfg(tmp_path, *argv: str, command: str = "serve") -> NodeConfig:
    args = build_parser().parse_args([command, "--home", str(tmp_path / "home"), *argv])
    return node_config_from_args(args)


def test_api_section_parses_and_validates():
    api = parse_config_text('[api]\ncors_origins = ["https://app.example", "*"]\nallow_hosts = ["proxy.lan:8080"]').api
    assert api.cors_origins == ("https://app.example", "*") and api.allow_hosts == ("proxy.lan:8080",)
    assert parse_config_text("").api.cors_origins == ()  # none by default
    for text, key in (
        ('[api]\ncors_origins = ["https://app.example/path"]', "[api].cors_origins"),
        ('[api]\ncors_origins = ["HTTPS://APP.example"]', "[api].cors_origins"),
        ('[api]\ncors_origins = "https://app.example"', "[api].cors_origins"),
        ('[api]\nallow_hosts = ["bad host"]', "[api].allow_hosts"),
        ('[api]\nallow_hosts = [3]', "[api].allow_hosts"),
        ('[api]\nwhatever = 1', "[api].whatever"),
    ):
        with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
            parse_config_text(text)


def test_flags_add_to_the_file_and_are_normalized(tmp_path):
    (tmp_path / "c.toml").write_text('[api]\ncors_origins = ["https://a.example"]\nallow_hosts = ["p.lan"]\n')
    cfg = _cfg(
        tmp_path,
        "--config",
        str(tmp_path / "c.toml"),
        "--cors-origin",
        "HTTPS://B.example/",
        "--cors-origin",
        "*",
        "--allow-host",
        "q.lan:8443",
    )
    assert cfg.file.api.cors_origins == ("https://a.example", "https://b.example", "*")
    assert cfg.file.api.allow_hosts == ("p.lan", "q.lan:8443")
    with pytest.raises(ConfigError, match="--cors-origin"):
        _cfg(tmp_path, "--cors-origin", "https://x.example/app")
    with pytest.raises(ConfigError, match="--allow-host"):
        _cfg(tmp_path, "--allow-host", "a/b")


def test_api_key_file_and_its_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("HYDRA_API_KEY", raising=False)
    key = tmp_path / "key"
    key.write_text("file-secret-key\n")
    assert _cfg(tmp_path, "--api-key-file", str(key)).api_key == "file-secret-key"
    monkeypatch.setenv("HYDRA_API_KEY", "env-secret-key")
    assert _cfg(tmp_path, "--api-key-file", str(key)).api_key == "file-secret-key"  # the flag wins
    assert _cfg(tmp_path).api_key == "env-secret-key"
    with pytest.raises(ConfigError, match="exclude"):
        _cfg(tmp_path, "--api-key", "x" * 10, "--api-key-file", str(key))
    with pytest.raises(ConfigError, match="cannot read"):
        _cfg(tmp_path, "--api-key-file", str(tmp_path / "missing"))
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        _cfg(tmp_path, "--api-key-file", str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="printable ASCII"):
        _cfg(tmp_path, "--api-key", "cl\u00e9-secr\u00e8te")


def test_join_tokens_from_a_file_and_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("HYDRA_JOIN", raising=False)
    (tmp_path / "join").write_text("tok-file-1\ntok-file-2\n")
    cfg = _cfg(tmp_path, "--join", "tok-flag", "--join-file", str(tmp_path / "join"))
    assert cfg.mesh.join == ("tok-flag", "tok-file-1", "tok-file-2")
    monkeypatch.setenv("HYDRA_JOIN", "tok-env")
    assert _cfg(tmp_path).mesh.join == ("tok-env",)
    assert _cfg(tmp_path, command="client").mesh.join == ("tok-env",)  # the client's token need not be a flag
    monkeypatch.delenv("HYDRA_JOIN")
    with pytest.raises(ConfigError, match="needs an invite token"):
        _cfg(tmp_path, command="client")
    with pytest.raises(ConfigError, match="cannot read"):
        _cfg(tmp_path, "--join-file", str(tmp_path / "nope"))


def test_auto_refuses_a_token_from_any_source(tmp_path, monkeypatch):
    monkeypatch.setenv("HYDRA_JOIN", "tok-env")
    with pytest.raises(ConfigError, match="--auto"):
        _cfg(tmp_path, "--auto")


async def test_the_root_guards_both_listeners(tmp_path):
    import trio

    cfg = NodeConfig(
        home=tmp_path,
        no_model=True,
        api_port=0,
        console_port=0,
        rpc_worker=False,
        file=parse_config_text('[api]\ncors_origins = ["https://app.example"]\nallow_hosts = ["p.lan"]'),
    )
    node = Node(cfg)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(30):
            await nursery.start(node.run)
        api, console = node.api_server.guard, node.console_server.guard
        assert api.check_host and console.check_host and api.allowed_hosts == console.allowed_hosts == ("p.lan",)
        assert api.cors_origins == ("https://app.example",) and console.cors_origins == ()
        assert console.csrf and not api.csrf
        assert node.status()["config"]["api"] == {"cors_origins": ["https://app.example"], "allow_hosts": ["p.lan"]}
        node.request_stop()
