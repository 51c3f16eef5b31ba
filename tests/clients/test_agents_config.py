"""The launchers' plans (pure): what each agent is given, and that nothing lands outside hydra's folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hydra_node.cli.agents import _origin, AgentLaunchError
from hydra_node.cli.agents_config import AGENTS, PLACEHOLDER_KEY, launch_plan

ORIGIN, MODEL = "http://127.0.0.1:9337", "Qwen2.5-7B-Instruct"


def test_claude_gets_the_anthropic_environment():
    plan = launch_plan("claude", ORIGIN + "/", MODEL, None, ("-p", "hi"), Path("/h/agents"), "tool:Read")
    assert plan.argv == ("claude", "-p", "hi") and plan.files == {}
    assert plan.env["ANTHROPIC_BASE_URL"] == ORIGIN and plan.env["ANTHROPIC_AUTH_TOKEN"] == PLACEHOLDER_KEY
    assert {plan.env[k] for k in plan.env if k.endswith("_MODEL")} == {MODEL}
    assert plan.env["ANTHROPIC_CUSTOM_HEADERS"] == "x-hydra-tool-choice: tool:Read"
    env = plan.environment({"ANTHROPIC_API_KEY": "sk-real", "PATH": "/bin"})
    assert "ANTHROPIC_API_KEY" not in env and env["PATH"] == "/bin"  # the real key would win over the token


def test_opencode_and_pi_configs_live_under_the_agents_folder(tmp_path):
    oc = launch_plan("opencode", ORIGIN, MODEL, "k", (), tmp_path, "required")
    (path,) = oc.files
    assert Path(path).parent == tmp_path / "opencode" and oc.env["OPENCODE_CONFIG"] == path
    cfg = json.loads(oc.files[path])
    assert cfg["model"] == f"hydra/{MODEL}" and MODEL in cfg["provider"]["hydra"]["models"]
    assert cfg["provider"]["hydra"]["options"] == {
        "baseURL": ORIGIN + "/v1",
        "apiKey": "k",
        "headers": {"x-hydra-tool-choice": "required"},
    }
    pi = launch_plan("pi", ORIGIN, MODEL, "k", ("-p", "x"), tmp_path)
    assert pi.env == {"PI_CODING_AGENT_DIR": str(tmp_path / "pi")}
    models = json.loads(pi.files[str(tmp_path / "pi" / "models.json")])["providers"]["hydra"]
    assert models["baseUrl"] == ORIGIN + "/v1" and models["api"] == "openai-completions" and "headers" not in models
    assert json.loads(pi.files[str(tmp_path / "pi" / "settings.json")]) == {
        "defaultProvider": "hydra",
        "defaultModel": MODEL,
    }


def test_goose_is_configured_by_its_environment():
    plan = launch_plan("goose", ORIGIN, MODEL, "k", ("session",), Path("/h"), "none")
    assert plan.env == {
        "GOOSE_PROVIDER": "openai",
        "GOOSE_MODEL": MODEL,
        "OPENAI_HOST": ORIGIN,
        "OPENAI_BASE_PATH": "v1/chat/completions",
        "OPENAI_API_KEY": "k",
        "OPENAI_CUSTOM_HEADERS": "x-hydra-tool-choice=none",
    }


def test_every_agent_has_an_install_hint_and_unknown_ones_are_refused():
    assert set(AGENTS) == {"claude", "opencode", "pi", "goose"} and all(a.install for a in AGENTS.values())
    with pytest.raises(ValueError):
        launch_plan("codex", ORIGIN, MODEL, None, (), Path("/h"))


@pytest.mark.parametrize(
    "url, origin",
    [
        ("http://10.0.0.5:9337/v1", "http://10.0.0.5:9337"),
        ("127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("http://[::1]:9337/", "http://[::1]:9337"),
        ("http://node.local", "http://node.local:9337"),
    ],
)
def test_node_urls(url, origin):
    assert _origin(url)[0] == origin


def test_node_urls_must_be_http():
    with pytest.raises(AgentLaunchError):
        _origin("https://example.com")


def test_pi_is_told_when_the_model_reasons(tmp_path):
    def entry(**kw):
        pi = launch_plan("pi", ORIGIN, MODEL, "k", (), tmp_path, **kw)
        provider = json.loads(pi.files[str(tmp_path / "pi" / "models.json")])["providers"]["hydra"]
        return provider["models"][0]["reasoning"], provider["compat"]["supportsReasoningEffort"]

    assert entry() == (False, False)
    assert entry(reasoning=True) == (True, True)  # pi sends reasoning_effort and shows reasoning_content
