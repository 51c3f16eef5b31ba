"""``serve --model ID=PATH --mmproj P`` end to end (docs/vision.md): a real node whose real runner is
started with the projector beside the model; ``/api/status`` shows the projector's file and the
model's ``vision`` capability; a hot swap loads a second model with a projector through the management
API. The projector is the synthetic ``mlp`` fixture (tests/fixtures/vision_model.py), the model the
bundled GGUF."""

from __future__ import annotations

from pathlib import Path

from harness import NodeProcess, request

from hydra_node.models import bundled_model_path
from tests.fixtures.vision_model import projector_path


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def test_a_model_served_with_a_projector_reaches_its_runner_and_the_status(tmp_path):
    projector = projector_path().resolve()
    node = NodeProcess(tmp_path / "home", "--model", f"vis={bundled_model_path()}", "--mmproj", str(projector))
    node.start()
    try:
        st = node.wait_status(
            lambda s: bool((s.get("model_caps") or {}).get("vis", {}).get("vision")),
            timeout=60,
            what="the model reports vision",
        )
        (model,) = st["models"]
        assert model["id"] == "vis" and model["mmproj"] == str(projector)
        argv = _cmdline(node.runner_pid())
        assert argv[argv.index("--mmproj") + 1] == str(projector)
        # hot swap: a second model with the projector, through the management API
        status, body = request(
            "POST",
            node.console_port,
            "/api/runtime/models",
            {"model": f"vis2={bundled_model_path()}", "mmproj": str(projector), "wait": True, "timeout_s": 60},
            timeout=90,
        )
        assert status == 200, body
        st = node.wait_status(
            lambda s: bool((s.get("model_caps") or {}).get("vis2", {}).get("vision")), what="vis2 reports vision"
        )
        assert {m["id"]: m["mmproj"] for m in st["models"]} == {"vis": str(projector), "vis2": str(projector)}
    finally:
        node.stop()
        node.kill_all()
