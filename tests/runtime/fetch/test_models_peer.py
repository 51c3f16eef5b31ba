"""Models between two live nodes over the encrypted mesh link (``artifact_fetch`` streams, and
``model_fetch`` for a holder that offers only that, as a node of the previous protocol generation),
and the ``hydra models`` commands against a running node; the Hub is a local stand-in server."""

from __future__ import annotations

import hashlib
import json

import pytest
from harness import NodeProcess, request
from test_models_download import BUNDLED, HubStandIn
from waiting import poll_until

from hydra_node.cli.main import main
from hydra_node.runtime.fetch import ModelCache, load_catalogue, resolve_remote
from hydra_node.runtime.fetch.cache import PartialMeta
from hydra_node.runtime.fetch.http_fetch import download_http

SHARED = "/mesh/models-GGUF/resolve/main/shared.gguf"
OTHER = "/mesh/models-GGUF/resolve/main/other.gguf"
THIRD = "/mesh/models-GGUF/resolve/main/third.gguf"
#: Held by B only, which offers its models over model_fetch alone (``[models] offer_artifacts = false``).
FOURTH = "/mesh/models-GGUF/resolve/main/fourth.gguf"
#: Bytes B already holds of the shared model before it asks (the transfer resumes at this offset).
HELD_BEFORE = 10 * 1024 * 1024


def cli(capsys, monkeypatch, *args, env=None):
    """The command line in this process (no interpreter start-up per command): (exit status, out, err)."""
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    root = tmp_path_factory.mktemp("models-peer")
    data = BUNDLED.read_bytes()
    hub = HubStandIn({SHARED: data, OTHER: data, THIRD: data, FOURTH: data})
    digest = hashlib.sha256(data).hexdigest()
    # A downloaded "shared" earlier; B holds its first bytes from an earlier, broken peer transfer.
    for name in ("third", "shared"):
        rec = download_http(
            resolve_remote(f"hf://mesh/models-GGUF/{name}.gguf", load_catalogue(), hub.url),
            ModelCache(root / "a" / "placement" / "cache"),
            token=None,
            read_timeout_s=10,
        )
    b_cache = ModelCache(root / "b" / "placement" / "cache")
    download_http(
        resolve_remote("hf://mesh/models-GGUF/fourth.gguf", load_catalogue(), hub.url),
        b_cache,
        token=None,
        read_timeout_s=10,
    )
    b_cache.partial_dir.mkdir(parents=True, exist_ok=True)
    b_cache.partial_path("shared").write_bytes(data[:HELD_BEFORE] + b"damaged tail, never recorded durable")
    b_cache.write_partial_meta(
        "shared",
        PartialMeta(url=f"peer-sha256:{digest}", resumable=True, total=len(data), durable=HELD_BEFORE),
    )
    (root / "b" / "config.toml").write_text("[models]\noffer_artifacts = false\n")  # B speaks model_fetch only
    a = NodeProcess(root / "a", "--no-model", "--no-rpc-worker", "--name", "a").start()
    b = NodeProcess(root / "b", "--no-model", "--no-rpc-worker", "--name", "b", "--join", a.invite())
    try:
        b.start()
        a_id = a.status()["node_id"]
        b.wait_status(
            lambda st: any(p["id"] == a_id and p["state"] == "alive" for p in st["peers"]), timeout=30, what="B sees A"
        )
        yield {"a": a, "b": b, "a_id": a_id, "hub": hub, "sha256": rec.sha256, "data": data}
    finally:
        b.kill_all()
        a.kill_all()
        hub.close()


def fetch(node: NodeProcess, model: str) -> tuple[int, dict]:
    code, body = request("POST", node.console_port, "/api/models/fetch", {"model": model}, timeout=120)
    return code, json.loads(body)


def test_a_model_comes_from_the_peer_that_holds_it_resumed_and_verified(two_nodes):
    a, b, hub = two_nodes["a"], two_nodes["b"], two_nodes["hub"]
    hub_requests = len(hub.requests)

    def fetched():  # A's announcement (extra.models_held) reaches B within a gossip round or two
        code, body = fetch(b, "hf://mesh/models-GGUF/shared.gguf")
        if code == 404 and body["error"]["code"] == "not_in_mesh":
            return None
        return code, body

    code, body = poll_until(fetched, timeout_s=30, what="B fetches from A")
    assert code == 200, body
    assert body["source"] == f"peer:{two_nodes['a_id']}" and body["sha256"] == two_nodes["sha256"]
    # no catalogue digest, nothing pinned on B: the digest is A's word, and recorded as such (issue 25)
    assert body["sha256_origin"] == f"peer:{two_nodes['a_id']}"
    with open(body["path"], "rb") as f:
        assert f.read() == two_nodes["data"]
    assert len(hub.requests) == hub_requests  # not one byte from the "internet"
    sent = a.status()["model_share"]
    assert sent["sent_files"] == 0  # A announces the digest in artifacts_held: one stream, artifact_fetch
    streamed = sent["artifact_fetch"]
    # resumed at B's durable length: the bytes before it were not sent again, the damaged tail was cut
    assert (streamed["sent_artifacts"], streamed["resumed"]) == (1, 1)
    assert streamed["sent_bytes"] == len(two_nodes["data"]) - HELD_BEFORE
    got = b.status()["model_share"]
    assert (got["fetched_files"], got["fetched_over_artifact_fetch"]) == (1, 1)
    assert "stream=artifact_fetch offset=%d" % HELD_BEFORE in b.log()
    code, again = fetch(b, "hf://mesh/models-GGUF/shared.gguf")
    assert code == 200 and again["source"] == "cache"


def test_a_model_no_peer_holds_is_404_and_a_bad_reference_400(two_nodes):
    code, body = fetch(two_nodes["b"], "hf://mesh/models-GGUF/nobody-has-this.gguf")
    assert code == 404 and body["error"]["code"] == "not_in_mesh"
    code, body = fetch(two_nodes["b"], "not a model")
    assert code == 400 and body["error"]["code"] == "invalid_model"


def test_models_pull_falls_back_to_the_hub_then_list_and_rm(two_nodes, capsys, monkeypatch):
    b, hub = two_nodes["b"], two_nodes["hub"]
    home = str(b.home)
    code, out, err = cli(
        capsys,
        monkeypatch,
        "models",
        "pull",
        "hf://mesh/models-GGUF/other.gguf",
        "--home",
        home,
        "--keep",
        "--json",
        env={"HF_ENDPOINT": hub.url},
    )
    assert code == 0, err
    assert "asking mesh peers" in err and "not_in_mesh" in err
    pulled = json.loads(out)
    assert pulled["sha256"] == two_nodes["sha256"] and pulled["keep"] and pulled["source"].endswith(OTHER)
    assert hub.requests[-1][0] == OTHER
    code, out, err = cli(capsys, monkeypatch, "models", "--json", "--home", home)
    listed = json.loads(out)
    assert sorted(m["model"] for m in listed["local"]) == ["fourth", "other", "shared"]
    assert "SmolLM2-135M-Instruct-Q4_1" in [e["name"] for e in listed["catalogue"]] and listed["mesh"] is not None
    code, out, err = cli(capsys, monkeypatch, "models", "rm", "other", "--home", home)
    assert code == 0 and "removed other" in out
    code, out, err = cli(capsys, monkeypatch, "models", "rm", "other", "--home", home)
    assert code == 1 and "not downloaded" in err


def test_swap_by_reference_fetches_from_the_mesh_then_hosts_it(two_nodes, capsys, monkeypatch):
    b, hub = two_nodes["b"], two_nodes["hub"]
    hub_requests = len(hub.requests)
    code, out, err = cli(
        capsys,
        monkeypatch,
        "swap",
        "hf://mesh/models-GGUF/third.gguf",
        "--keep",
        "--home",
        str(b.home),
        env={"HF_ENDPOINT": hub.url},
    )
    assert code == 0, err
    assert f"from peer:{two_nodes['a_id']}" in err and "loaded third" in out
    assert len(hub.requests) == hub_requests
    assert "third" in b.status()["serving_models"]
    code, out, err = cli(capsys, monkeypatch, "models", "rm", "third", "--home", str(b.home))
    assert code == 1 and "'third' is served" in err and "--force" in err  # refused while served (issue 25)
    assert ModelCache(b.home / "placement" / "cache").lookup("third") is not None


def test_serve_with_a_model_name_and_join_takes_it_from_a_peer_first(two_nodes, tmp_path):
    """``serve --model REF --join TOKEN`` with REF missing locally: the joined node fetches it from
    the one peer that holds it (B) and no request reaches the Hub, then serves it. B offers its
    models over ``model_fetch`` only (``[models] offer_artifacts = false``, as a node of the
    previous protocol generation): C falls back to that stream."""
    a, b, hub = two_nodes["a"], two_nodes["b"], two_nodes["hub"]
    hub_requests = len(hub.requests)
    b_id = b.status()["node_id"]
    c = NodeProcess(
        tmp_path / "c",
        "--no-rpc-worker",
        "--name",
        "c",
        "--model",
        "hf://mesh/models-GGUF/fourth.gguf",
        "--join",
        a.invite(),
        env={"HF_ENDPOINT": hub.url},
    )
    try:
        c.start()
        st = c.status()
        assert st["serving_models"] == ["fourth"], st["serving_models"]
        assert len(hub.requests) == hub_requests, hub.requests[hub_requests:]
        assert f"source=peer:{b_id}" in c.log() and "stream=model_fetch offset=0" in c.log(), c.log()[-2000:]
        got = st["model_share"]
        assert (got["fetched_files"], got["fetched_over_artifact_fetch"]) == (1, 0)
        held = b.status()["model_share"]
        assert held["sent_files"] == 1 and held["offer_artifacts"] is False  # the retired stream, still served
        assert held["artifact_fetch"]["sent_artifacts"] == 0
        assert ModelCache(tmp_path / "c" / "placement" / "cache").lookup("fourth").sha256 == two_nodes["sha256"]
    finally:
        c.kill_all()
