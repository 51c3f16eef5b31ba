"""What the client tests share: the model id, the no-network environment, guarded subprocesses.

Imported by ``conftest.py`` before any client library is imported, so the variables that keep
the clients off the network are set in time (litellm reads its cost map at import).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from hydra_node.models import BUNDLED_MODEL_ID

MODEL = BUNDLED_MODEL_ID
NETGUARD_DIR = Path(__file__).resolve().parent / "netguard"

#: What each client documents to stay off the network (telemetry, tracing, remote catalogs).
NO_NETWORK_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm: the bundled cost map, not a fetch at import
    "LITELLM_OFFLINE_MODE": "true",  # litellm: no catalog, check or tokenizer fetched on its own
    "OPENAI_AGENTS_DISABLE_TRACING": "true",  # openai-agents: no trace export to OpenAI
    "LANGSMITH_TRACING": "false",  # langchain: no LangSmith runs
    "LANGCHAIN_TRACING_V2": "false",
    "HF_HUB_OFFLINE": "1",  # tokenizers through huggingface_hub (litellm) stay local
    "DO_NOT_TRACK": "1",
    "OTEL_SDK_DISABLED": "true",
    "OPENAI_API_KEY": "unused-by-the-tests",  # so no client looks further for a key
}
#: What those variables were before this package set them (None: unset), for restore_env().
_PREVIOUS_ENV = {key: os.environ.get(key) for key in NO_NETWORK_ENV}
os.environ.update(NO_NETWORK_ENV)

if str(NETGUARD_DIR) not in sys.path:
    sys.path.insert(0, str(NETGUARD_DIR))
import netguard  # noqa: E402

__all__ = [
    "CITY_QUESTION",
    "MODEL",
    "NO_NETWORK_ENV",
    "TIME_TOOL",
    "WEATHER_PARAMETERS",
    "WEATHER_QUESTION",
    "WEATHER_TOOL",
    "City",
    "WeatherArgs",
    "guarded_env",
    "netguard",
    "refused",
    "restore_env",
    "weather_result",
]


def restore_env() -> None:
    """Put the variables back as they were, for the tests that run after this package."""
    for key, value in _PREVIOUS_ENV.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def guarded_env(tmp_path: Path, **extra: str) -> tuple[dict, Path]:
    """The environment for a client subprocess: the no-network variables and the guard loaded at
    start-up (``netguard/sitecustomize.py``), which writes what it refused to the returned file."""
    record = tmp_path / "netguard.json"
    env = {
        **os.environ,
        **NO_NETWORK_ENV,
        **extra,
        "HYDRA_NETGUARD_RECORD": str(record),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(NETGUARD_DIR), os.environ.get("PYTHONPATH")])),
    }
    return env, record


def refused(record: Path) -> list[str]:
    """What a guarded subprocess tried to reach (it must have exited normally and written it)."""
    return json.loads(record.read_text())


# ---- what the tests ask for: one function tool, one structured answer -------------------------


class WeatherArgs(BaseModel):
    """The arguments of the ``get_weather`` tool."""

    model_config = ConfigDict(extra="forbid")
    city: str = Field(max_length=40)
    unit: Literal["celsius", "fahrenheit"]


class City(BaseModel):
    """A structured answer."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=40)
    country: str = Field(max_length=40)
    population: int


WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
#: ``get_weather`` as a Chat Completions tool.
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": WEATHER_PARAMETERS,
    },
}
#: A second tool, so that a named choice has something to choose from.
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The current time in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 40}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris right now?"}]
CITY_QUESTION = [{"role": "user", "content": "Describe the city of Paris as JSON with name, country and population."}]


def weather_result(city: str, unit: str) -> str:
    """What the ``get_weather`` tool answers (the tests' real tool function)."""
    return f"It is 21 degrees {unit} and sunny in {city}."
