"""The pure parts of models by name: catalogue and references, response decisions, progress maths,
eviction, the model_fetch reply checker, the [models] section, and `hydra setup`'s verdicts."""

from __future__ import annotations

import pytest

from hydra_node.cli.setup_cmd import STARTER_CONFIG, MachineFacts, judge
from hydra_node.config import ConfigError, parse_config_text
from hydra_node.runtime.fetch import (
    BadModelSource,
    load_catalogue,
    needs_fetch,
    parse_models_section,
    resolve_remote,
)
from hydra_node.runtime.fetch.cache import cache_key
from hydra_node.runtime.fetch.catalogue import CatalogueError, hf_url, parse_catalogue
from hydra_node.runtime.fetch.errors import (
    NotFound,
    RemoteStatusError,
    SizeMismatch,
    Unauthorized,
)
from hydra_node.runtime.fetch.peer_wire import (
    DATA_FRAME_BYTES,
    FetchRequest,
    ReplyChecker,
    WireError,
    held_from_extra,
)
from hydra_node.runtime.fetch.transfer import (
    ProgressMeter,
    RateFloor,
    check_loose_size,
    check_total,
    hub_lfs_sha256,
    plan_response,
    range_header,
    same_origin,
)

SHA = "ab" * 32


def test_catalogue_holds_the_seed_names_and_the_bundled_model():
    cat = load_catalogue()
    assert {"Qwen3-8B-Q4_K_M", "GLM-4.7-Flash-Q4_K_M", "SmolLM2-135M-Instruct-Q4_1"} <= set(cat)
    assert cat["SmolLM2-135M-Instruct-Q4_1"].bundled
    # an entry without a published digest says so instead of inventing one
    assert cat["Qwen3-8B-Q4_K_M"].sha256 is None and "pinned on first download" in cat["Qwen3-8B-Q4_K_M"].note


@pytest.mark.parametrize(
    "text, needle",
    [
        ("[models.x]\nfile = 'x.gguf'\n", "needs sources"),
        ("[models.x]\nsources = ['ftp://h/x.gguf']\nfile = 'x.gguf'\n", "hf:// or https://"),
        ("[models.x]\nsources = ['hf://a/b/x.gguf']\nfile = '../x.gguf'\n", "plain .gguf"),
        ("[models.x]\nsources = ['hf://a/b/x.gguf']\nfile = 'x.gguf'\nsha256 = 'zz'\n", "sha256"),
        ("[models.x]\nsources = ['hf://a/b/x.gguf']\nfile = 'x.gguf'\nsize = 3\n", "unknown field"),
        ("[other]\n", "exactly one table"),
    ],
)
def test_a_malformed_catalogue_names_the_entry_and_field(text, needle):
    with pytest.raises(CatalogueError, match=needle):
        parse_catalogue(text)


def test_hf_references_map_to_resolve_urls():
    assert hf_url("hf://Qwen/Qwen3-8B-GGUF/Qwen3-8B-Q4_K_M.gguf") == (
        "https://huggingface.co/Qwen/Qwen3-8B-GGUF/resolve/main/Qwen3-8B-Q4_K_M.gguf",
        "Qwen3-8B-Q4_K_M.gguf",
    )
    assert (
        hf_url("hf://o/r@abc123/sub/m.gguf", "http://127.0.0.1:8/")[0]
        == "http://127.0.0.1:8/o/r/resolve/abc123/sub/m.gguf"
    )
    for bad in ("hf://o/m.gguf", "hf://o/r/../m.gguf", "hf://o w/r/m.gguf", "hf://o/r@/x/../m.gguf"):
        with pytest.raises(BadModelSource):
            hf_url(bad)


def test_references_resolve_or_fail_with_what_is_accepted():
    cat = load_catalogue()
    r = resolve_remote("mine=https://example.org/d/model.gguf", cat)
    assert (r.model_id, r.file, r.hub) == ("mine", "model.gguf", False)
    assert resolve_remote("hf://o/r/m.gguf", cat).hub
    for bad in ("no-such-model", "https://example.org/notgguf.bin", "https:///x.gguf"):
        with pytest.raises(BadModelSource):
            resolve_remote(bad, cat)
    assert needs_fetch("Qwen3-8B-Q4_K_M") and needs_fetch("x=hf://o/r/m.gguf")
    assert not needs_fetch("SmolLM2-135M-Instruct-Q4_1") and not needs_fetch("/models/x.gguf")


def test_response_decisions():
    assert range_header(0) == {} and range_header(10) == {"Range": "bytes=10-"}
    p = plan_response(10, 206, {"Content-Range": "bytes 10-99/100"})
    assert (p.offset, p.total, p.resumable, p.complete) == (10, 100, True, False)
    p = plan_response(10, 200, {"Content-Length": "100"})  # the server ignored the range: start over
    assert (p.offset, p.total, p.resumable) == (0, 100, False)
    assert plan_response(0, 200, {"content-length": "5", "accept-ranges": "bytes"}).resumable
    assert plan_response(100, 416, {"Content-Range": "bytes */100"}).complete
    with pytest.raises(RemoteStatusError, match="Content-Range"):
        plan_response(10, 206, {"Content-Range": "bytes 0-99/100"})
    with pytest.raises(RemoteStatusError, match="refused to resume"):
        plan_response(10, 416, {"Content-Range": "bytes */200"})
    with pytest.raises(NotFound):
        plan_response(0, 404, {})
    with pytest.raises(Unauthorized, match="HF_TOKEN"):
        plan_response(0, 403, {})
    with pytest.raises(RemoteStatusError, match="503"):
        plan_response(0, 503, {})
    with pytest.raises(SizeMismatch):
        check_total(100, 101, "u")
    check_total(None, 101, "u")


def test_progress_rate_and_eta_follow_the_injected_clock():
    m = ProgressMeter(total=1000, start=100, now=0.0)
    assert m.rate == 0 and m.eta_s is None
    m.update(300, 2.0)
    assert m.rate == 100 and m.eta_s == 7.0
    line = m.line("pull x", width=10)
    assert "30.0%" in line and "100 B/s" in line and "ETA 0m07s" in line and "[###       ]" in line
    assert "ETA" not in ProgressMeter(None, 0, 0.0).line("x")


def test_partial_file_keys():
    assert cache_key("Qwen3-8B-Q4_K_M") == "Qwen3-8B-Q4_K_M" and cache_key("a/b").startswith("m-")


def test_reply_checker_accepts_exactly_one_well_formed_reply():
    c = ReplyChecker(offset=2, expected_size=5)
    assert c.feed({"op": "file", "size": 5}) == b""
    assert c.feed({"op": "data", "b": b"abc"}) == b"abc"
    c.feed({"op": "end"})
    assert c.ended and c.received == 5
    for msgs in (
        [{"op": "data", "b": b"x"}],  # no file first
        [{"op": "file", "size": 6}],  # not the expected size
        [{"op": "file", "size": 5}, {"op": "data", "b": b"abcd"}],  # past the end
        [{"op": "file", "size": 5}, {"op": "end"}],  # early end
        [{"op": "file", "size": 5}, {"op": "data", "b": b"x" * (DATA_FRAME_BYTES + 1)}],
        [{"op": "error", "code": "nope", "message": "m"}],
    ):
        c = ReplyChecker(2, 5)
        with pytest.raises(WireError):
            for m in msgs:
                c.feed(m)
    c = ReplyChecker(0, None)
    c.feed({"op": "error", "code": "busy", "message": "later"})
    assert c.error == ("busy", "later")


def test_fetch_headers_and_announced_holdings_are_strict():
    assert FetchRequest.from_header(FetchRequest(SHA, 7).header()) == FetchRequest(SHA, 7)
    for h in (
        {"kind": "model_fetch", "sha256": "AB" * 32, "offset": 0},
        {"kind": "model_fetch", "sha256": SHA, "offset": -1},
        {"kind": "model_fetch", "sha256": SHA, "offset": True},
        {"kind": "model_fetch", "sha256": SHA, "offset": 0, "path": "/etc/passwd"},
    ):
        with pytest.raises(WireError):
            FetchRequest.from_header(h)
    assert held_from_extra({"models_held": [["m", SHA], ["bad", "x"], "junk"]}) == {"m": SHA}
    assert held_from_extra({"models_held": "nope"}) == {}


def test_models_section_parses_and_refuses_bad_values():
    s = parse_models_section({"cache_limit_gb": 50, "peer_fetch": False}, ConfigError)
    assert s.cache_limit_gb == 50 and not s.peer_fetch and s.share
    for data, needle in (
        ({"cache_limit_gb": -1}, "cache_limit_gb"),
        ({"read_timeout_s": 0}, "read_timeout_s"),
        ({"min_rate_bytes_s": -1}, "min_rate_bytes_s"),
        ({"min_rate_bytes_s": float("inf")}, "min_rate_bytes_s"),
        ({"share": "yes"}, "true or false"),
        ({"colour": 1}, "unknown key"),
    ):
        with pytest.raises(ConfigError, match=needle):
            parse_models_section(data, ConfigError)


def facts(**kw):
    base = dict(
        python=(3, 11, 7),
        platform="Linux x86_64",
        cores=4,
        compiler="/usr/bin/cc",
        cmake="/usr/bin/cmake",
        llama_cpp_version="0.3.36",
        rpc=True,
        backends=("CPU", "RPC"),
        mem_total_bytes=16 * 10**9,
        mem_available_bytes=12 * 10**9,
        disk_free_bytes=100 * 10**9,
        home="/h",
    )
    return MachineFacts(**{**base, **kw})


def test_setup_verdicts_name_the_fix():
    assert all(c.status == "ok" for c in judge(facts()))
    by = {
        c.name: c
        for c in judge(
            facts(
                python=(3, 10, 1),
                compiler=None,
                cmake=None,
                rpc=False,
                gpu_tools={"nvidia-smi": "/usr/bin/nvidia-smi"},
                mem_available_bytes=10**9,
                disk_free_bytes=10**9,
            )
        )
    }
    assert by["python"].status == "missing" and "3.11" in by["python"].fix
    assert by["compiler"].status == "missing" and "build-essential" in by["compiler"].fix
    assert by["cmake"].status == "missing" and "cmake" in by["cmake"].fix
    assert by["rpc"].status == "missing" and "make install" in by["rpc"].fix
    assert by["gpu"].status == "warn" and "GPU=cuda" in by["gpu"].fix
    assert by["memory"].status == "warn" and by["disk"].status == "warn"
    assert {c.name: c for c in judge(facts(llama_cpp_version=None, rpc=None))}["llama-cpp-python"].status == "missing"
    assert {c.name: c for c in judge(facts(backends=("CPU", "CUDA", "RPC")))}["gpu"].detail.endswith("CPU, CUDA, RPC")


def test_the_starter_config_is_a_valid_config():
    cfg = parse_config_text(STARTER_CONFIG.format(parallel=2, threads=0))
    assert cfg.defaults.throughput.parallel == 2 and cfg.defaults.model_fit.ctx_size == 4096


class FakeStream:
    def __init__(self, tty: bool) -> None:
        self.tty, self.text = tty, ""

    def isatty(self) -> bool:
        return self.tty

    def write(self, s: str) -> None:
        self.text += s

    def flush(self) -> None:
        pass


def test_progress_is_redrawn_on_a_terminal_and_logged_sparsely_otherwise():
    from hydra_node.cli.models import PROGRESS_LOG_EVERY_S, StderrProgress

    for tty in (True, False):
        now = [0.0]
        stream = FakeStream(tty)
        bar = StderrProgress("pull m", stream, clock=lambda now=now: now[0])
        meter = ProgressMeter(total=100, start=0, now=0.0)
        for step in range(1, 11):  # one chunk a second for ten seconds
            now[0] = float(step)
            meter.update(step * 10, now[0])
            bar(meter)
        bar.finish()
        if tty:
            assert stream.text.count("\r") == 11 and stream.text.endswith("\n") and "100.0%" in stream.text
        else:
            assert stream.text.count("\n") == 1 + 10 // int(PROGRESS_LOG_EVERY_S) and "\r" not in stream.text


def test_rate_floor_trips_only_after_a_whole_window_below_the_rate():
    floor = RateFloor(100.0, 10.0, done=0, now=0.0)
    assert not floor.slow(5, 9.9)  # the window is not over yet
    assert floor.slow(50, 10.0) and floor.rate == 5.0  # 50 bytes in 10 s: below 100 B/s
    ok = RateFloor(100.0, 10.0, done=0, now=0.0)
    assert not ok.slow(2000, 10.0) and not ok.slow(3500, 20.0)  # 200 then 150 B/s
    assert not RateFloor(0.0, 10.0, 0, 0.0).slow(0, 1e6)  # 0: no floor


def test_same_origin_compares_scheme_host_and_port():
    assert same_origin("https://h.co/a", "https://H.co:443/b")
    assert not same_origin("http://127.0.0.1:8000/a", "http://127.0.0.1:8001/a")
    assert not same_origin("https://h.co/a", "http://h.co/a")
    assert not same_origin("https://h.co/a", "https://cdn.h.co/a")


def test_hub_lfs_sha256_is_read_from_x_linked_etag_only_when_it_is_a_sha256():
    assert hub_lfs_sha256({"X-Linked-Etag": f'"{SHA}"'}) == SHA
    assert hub_lfs_sha256({"x-linked-etag": f'W/"{SHA.upper()}"'}) == SHA
    assert hub_lfs_sha256({"ETag": f'"{SHA}"'}) is None  # a plain ETag is not the LFS digest
    assert hub_lfs_sha256({"X-Linked-Etag": '"' + "a" * 40 + '"'}) is None  # a git blob sha1


def test_the_catalogue_size_is_checked_loosely():
    check_loose_size("m", 640_000_000, 639_447_744)
    check_loose_size("m", None, 1)
    with pytest.raises(SizeMismatch, match="far from"):
        check_loose_size("m", 640_000_000, 880_000)
