"""Downloads that are bounded and digests that can be trusted (issue 25 items 7 and 8), against real
HTTP servers on 127.0.0.1 that misbehave on purpose: a body without ``Content-Length`` past the
cache limit, a server trickling bytes, redirects to ``ftp://`` and to another port of the same host,
a Hub stand-in stating the LFS sha256 (:class:`FakeHubServer`: a mock of a third party we cannot run
here), ``models pull URL --sha256``, and resumes of a damaged partial file. Small synthetic files: no
model is loaded."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import pytest

from hydra_node.cli.main import main
from hydra_node.runtime.fetch import FetchSettings, ModelCache, ModelsSection, ensure_local, load_catalogue
from hydra_node.runtime.fetch.catalogue import resolve_remote, with_sha256
from hydra_node.runtime.fetch.errors import (
    BadRedirect,
    ChecksumMismatch,
    DiskError,
    NoNetwork,
    SizeMismatch,
    TransferTimeout,
)
from hydra_node.runtime.fetch.http_fetch import download_http, verify_and_commit

DATA = bytes(range(256)) * 200  # 51 200 bytes
DIGEST = hashlib.sha256(DATA).hexdigest()

Route = Callable[[http.server.BaseHTTPRequestHandler], None]


class Server:
    """A real ``http.server`` on 127.0.0.1: ``routes`` maps a URL path to a function answering the
    request; ``requests`` records (path, headers) of each request."""

    def __init__(self, routes: dict[str, Route] | None = None) -> None:
        self.routes: dict[str, Route] = dict(routes or {})
        self.requests: list[tuple[str, dict]] = []
        self.stop = threading.Event()
        srv = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                srv.requests.append((self.path, dict(self.headers)))
                route = srv.routes.get(self.path)
                if route is None:
                    return self.send_error(404)
                try:
                    route(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


def ranged(data: bytes, *, cut_first_at: int | None = None) -> Route:
    """Serve ``data`` with range support; the first answer is cut after ``cut_first_at`` bytes."""
    cut = [cut_first_at]

    def route(h):
        start, rng = 0, h.headers.get("Range")
        if rng and rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[6:-1])
            h.send_response(206)
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            h.send_response(200)
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Length", str(len(data) - start))
        h.end_headers()
        end = len(data) if cut[0] is None else start + cut[0]
        cut[0] = None
        h.wfile.write(data[start:end])  # the handler returns: a cut answer closes mid-body

    return route


def redirect(location: str, **headers: str) -> Route:
    def route(h):
        h.send_response(302)
        h.send_header("Location", location)
        for k, v in headers.items():
            h.send_header(k.replace("_", "-"), v)
        h.send_header("Content-Length", "0")
        h.end_headers()

    return route


def url_remote(url: str):
    return resolve_remote(url, {})


def get(remote, tmp_path, capacity_bytes=0, **kw):
    cache = ModelCache(tmp_path / "placement" / "cache", capacity_bytes=capacity_bytes)
    return download_http(remote, cache, token=kw.pop("token", None), read_timeout_s=10, **kw)


def nothing_committed(tmp_path) -> bool:
    cache = ModelCache(tmp_path / "placement" / "cache")
    return not cache.records() and not any(cache.partial_dir.glob("*.part"))


# ---- item 7: bounded downloads -------------------------------------------------------------------


def test_a_body_without_content_length_is_held_to_the_cache_capacity_while_it_streams(server, tmp_path):
    def no_length(h):  # HTTP/1.0: the body ends when the connection closes
        h.send_response(200)
        h.end_headers()
        h.wfile.write(DATA)

    server.routes["/big.gguf"] = no_length
    with pytest.raises(DiskError, match="cache_capacity_gb"):
        get(url_remote(f"{server.url}/big.gguf"), tmp_path, capacity_bytes=len(DATA) // 4)
    assert nothing_committed(tmp_path)
    rec = get(url_remote(f"{server.url}/big.gguf"), tmp_path, capacity_bytes=2 * len(DATA))  # it fits: stored
    assert rec.sha256 == DIGEST


def test_a_trickling_server_is_refused_below_the_minimum_rate(server, tmp_path):
    """1 byte every 0.4 s never trips the 1.5 s per-read timeout; the rate floor (a setting) does."""

    def trickle(h):
        body = DATA[:12]
        h.send_response(200)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        for i in range(len(body)):
            h.wfile.write(body[i : i + 1])
            h.wfile.flush()
            if server.stop.wait(0.4):
                return

    server.routes["/slow.gguf"] = trickle
    url = f"{server.url}/slow.gguf"
    settings = FetchSettings(
        cache_dir=tmp_path / "placement" / "cache", models=ModelsSection(read_timeout_s=1.5, min_rate_bytes_s=100.0)
    )
    with pytest.raises(TransferTimeout) as err:
        ensure_local(url, settings)
    assert url in str(err.value) and "[models].min_rate_bytes_s" in str(err.value)
    assert not ModelCache(tmp_path / "placement" / "cache").records()


def test_a_redirect_to_ftp_is_not_followed(server, tmp_path):
    server.routes["/m.gguf"] = redirect("ftp://127.0.0.1:9/m.gguf")
    with pytest.raises(BadRedirect, match="ftp://127.0.0.1:9/m.gguf"):
        get(url_remote(f"{server.url}/m.gguf"), tmp_path)
    assert nothing_committed(tmp_path)


def test_the_token_does_not_follow_a_redirect_to_another_port_of_the_same_host(server, tmp_path):
    other = Server({"/f.gguf": ranged(DATA)})
    try:
        server.routes["/o/r/resolve/main/f.gguf"] = redirect(f"http://127.0.0.1:{other.port}/f.gguf")
        remote = resolve_remote("hf://o/r/f.gguf", {}, server.url)
        rec = get(remote, tmp_path, token="hf_secret")
    finally:
        other.close()
    assert rec.sha256 == DIGEST
    assert server.requests[0][1].get("Authorization") == "Bearer hf_secret"  # the Hub itself gets it
    assert other.requests and all("Authorization" not in h for _, h in other.requests)


# ---- item 8: digests known before first use ------------------------------------------------------


class FakeHubServer(Server):
    """A mock of the Hugging Face Hub (a third party we cannot run here): ``resolve`` answers 302 to a
    CDN path with ``X-Linked-Etag: "<sha256>"`` and ``X-Linked-Size``, as the Hub does for LFS files."""

    def __init__(self, data: bytes, stated_sha256: str) -> None:
        super().__init__()
        self.routes["/o/r/resolve/main/f.gguf"] = redirect(
            f"{self.url}/cdn/f.gguf", X_Linked_Etag=f'"{stated_sha256}"', X_Linked_Size=str(len(data))
        )
        self.routes["/cdn/f.gguf"] = ranged(data)


def test_an_hf_download_is_verified_against_the_hub_lfs_sha256(tmp_path):
    hub = FakeHubServer(DATA, DIGEST)
    try:
        rec = get(resolve_remote("hf://o/r/f.gguf", {}, hub.url), tmp_path)
    finally:
        hub.close()
    assert rec.sha256 == DIGEST and rec.sha256_origin == "hub-lfs"
    lying = FakeHubServer(DATA, "0" * 64)  # the Hub states another digest than the bytes have
    try:
        with pytest.raises(ChecksumMismatch, match="Hub's LFS sha256"):
            get(resolve_remote("hf://o/r/f.gguf", {}, lying.url), tmp_path / "again")
    finally:
        lying.close()
    assert nothing_committed(tmp_path / "again")


def cli(capsys, *args) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_models_pull_with_sha256_refuses_other_bytes_and_pins_the_given_digest(server, tmp_path, capsys):
    server.routes["/m.gguf"] = ranged(DATA)
    url, home = f"{server.url}/m.gguf", str(tmp_path)
    code, out, err = cli(capsys, "models", "pull", url, "--sha256", "ab" * 32, "--home", home, "--no-peers")
    assert code == 1 and "checksum_mismatch" in err and "--sha256" in err
    assert nothing_committed(tmp_path)
    code, out, err = cli(capsys, "models", "pull", url, "--sha256", "xyz", "--home", home, "--no-peers")
    assert code == 2 and "64 hex digits" in err
    code, out, err = cli(capsys, "models", "pull", url, "--sha256", DIGEST.upper(), "--home", home, "--json")
    assert code == 0, err
    pulled = json.loads(out)
    assert pulled["sha256"] == DIGEST and pulled["sha256_origin"] == "given"
    code, out, err = cli(capsys, "models", "--home", home)
    assert "(--sha256 given)" in out
    code, out, err = cli(capsys, "models", "pull", "SmolLM2-135M-Instruct-Q4_1", "--sha256", "ab" * 32, "--home", home)
    assert code == 2 and "contradicts the catalogue" in err  # not ignored for the bundled model either


def test_a_damaged_partial_without_a_digest_is_downloaded_again_from_zero(server, tmp_path):
    """No digest known (a plain URL, nothing pinned): a resumed file could not be checked, so the
    damaged partial is dropped and the file fetched whole (it used to be resumed and pinned as is)."""
    server.routes["/m.gguf"] = ranged(DATA, cut_first_at=len(DATA) // 2)
    remote = url_remote(f"{server.url}/m.gguf")
    with pytest.raises(NoNetwork) as err:
        get(remote, tmp_path)
    assert err.value.partial_kept
    part = ModelCache(tmp_path / "placement" / "cache").partial_path(remote.model_id)
    with open(part, "r+b") as f:  # the bytes on disk went bad (a crash, a bad sector)
        f.seek(100)
        f.write(b"\0" * 100)
    rec = get(remote, tmp_path)
    assert rec.sha256 == DIGEST and rec.sha256_origin == "pinned"
    assert "Range" not in server.requests[-1][1]


def test_a_resume_starts_at_the_recorded_durable_length_and_is_verified(server, tmp_path):
    """With a digest (here ``--sha256``) a partial file resumes, from the length recorded after an
    fsync, not from the file's length: a crash can leave a longer tail that never made it whole."""
    server.routes["/m.gguf"] = ranged(DATA, cut_first_at=len(DATA) // 2)
    remote = with_sha256(url_remote(f"{server.url}/m.gguf"), DIGEST)
    with pytest.raises(NoNetwork):
        get(remote, tmp_path)
    cache = ModelCache(tmp_path / "placement" / "cache")
    meta = cache.partial_meta(remote.model_id)
    assert meta is not None and meta.durable == len(DATA) // 2
    with open(cache.partial_path(remote.model_id), "ab") as f:
        f.write(b"\xff" * 1000)  # a tail past the durable length, not the file's bytes
    rec = get(remote, tmp_path)
    assert rec.sha256 == DIGEST and rec.sha256_origin == "given"
    assert server.requests[-1][1].get("Range") == f"bytes={len(DATA) // 2}-"


def test_a_peer_vouched_digest_is_labelled_so_and_the_catalogue_size_checked_loosely(tmp_path, capsys):
    """The 880 KB file a member pinned as Qwen3-0.6B-Q8_0 (~0.64 GB in the catalogue) is refused;
    a peer's digest that is the only one known is recorded as that peer's, and shown so."""
    cache = ModelCache(tmp_path / "placement" / "cache")
    small = os.urandom(880_000)
    qwen = resolve_remote("Qwen3-0.6B-Q8_0", load_catalogue())
    vouched = replace(qwen, sha256=hashlib.sha256(small).hexdigest(), sha256_origin="peer:" + "ab" * 32)
    cache.partial_dir.mkdir(parents=True)
    cache.partial_path(qwen.model_id).write_bytes(small)
    with pytest.raises(SizeMismatch, match="Qwen3-0.6B-Q8_0.*0.64 GB"):
        verify_and_commit(vouched, cache, source="peer:" + "ab" * 32, now=time.time())
    assert not cache.records() and not cache.partial_path(qwen.model_id).exists()
    other = replace(url_remote("https://example.org/m.gguf"), sha256=DIGEST, sha256_origin="peer:" + "cd" * 32)
    cache.partial_path(other.model_id).write_bytes(DATA)
    rec = verify_and_commit(other, cache, source="peer:" + "cd" * 32, now=time.time())
    assert rec.sha256_origin == "peer:" + "cd" * 32
    code, out, err = cli(capsys, "models", "--home", str(tmp_path))
    assert code == 0 and "vouched for by peer cdcdcdcdcdcd only" in out
