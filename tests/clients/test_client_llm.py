"""Simon Willison's ``llm`` CLI against a live node, run as a subprocess: an OpenAI-compatible model
configured in ``extra-openai-models.yaml`` under a temporary ``LLM_USER_PATH``; ``--schema`` gives
JSON that validates. The subprocess is guarded like every client here: it may reach only loopback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from clientkit import MODEL, guarded_env, refused

pytestmark = pytest.mark.live

LLM = str(Path(sys.executable).with_name("llm"))


@pytest.fixture(scope="module")
def llm_env(base_url, tmp_path_factory):
    home = tmp_path_factory.mktemp("llm-user")
    (home / "extra-openai-models.yaml").write_text(
        f"- model_id: hydra-smol\n  model_name: {MODEL}\n  api_base: \"{base_url}\"\n"
        "  supports_schema: true\n  supports_tools: true\n"
    )
    return home


def llm(home: Path, tmp_path: Path, *args: str) -> str:
    env, record = guarded_env(tmp_path, LLM_USER_PATH=str(home))
    r = subprocess.run([LLM, *args], env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    assert refused(record) == []
    return r.stdout


def test_schema(llm_env, tmp_path):
    out = llm(
        llm_env,
        tmp_path,
        "-m",
        "hydra-smol",
        "--schema",
        "name, country, population int",
        "-o",
        "temperature",
        "0",
        "-o",
        "max_tokens",
        "96",
        "Describe the city of Paris.",
    )
    data = json.loads(out)
    assert isinstance(data["name"], str) and isinstance(data["country"], str)
    assert isinstance(data["population"], int)
