"""Every speed knob of the config reaches llama.cpp, bad values are refused naming the key, and the
reserved keys a file sets are reported (issue 12 item 2).

Path under test: TOML → ``hydra_node/config.py`` → ``Node.runner_settings()`` → ``RunnerSettings`` →
the runner's argv (``RunnerSupervisor._argv``) → ``runtime/runner/llama_params.llama_kwargs`` →
``llama_cpp.Llama(...)`` → the runner's ``ready`` message and ``/api/status`` ``models[].llama``.
"""

from __future__ import annotations

import logging

import llama_cpp
import pytest
import trio

from hydra_node.config import RESERVED_KEYS, ConfigError, NodeConfig, parse_config_text
from hydra_node.inference import Finished, GenerationRequest
from hydra_node.models import resolve_model
from hydra_node.node import Node
from hydra_node.runtime.hosting.service import HostMemory
from hydra_node.runtime.runner import llama_params
from hydra_node.runtime.runner.records import RunnerSettings

GIB = 1 << 30


def _node(tmp_path, text: str = "", **kw) -> Node:
    return Node(
        NodeConfig(
            home=tmp_path,
            no_model=True,
            api_port=0,
            console_port=0,
            rpc_worker=False,
            file=parse_config_text(text),
            **kw,
        )
    )


def _argv(settings: RunnerSettings, home) -> list[str]:
    """The argv a runner is spawned with (nothing is spawned)."""
    from hydra_node.runtime.runner.supervisor import (
        RunnerSupervisor,  # here: at module level it marks all live
    )

    return RunnerSupervisor(resolve_model(None), home, settings)._argv(3)


def _flag(argv: list[str], name: str) -> str:
    assert argv.count(name) == 1, f"{name} should appear once in {argv}"
    return argv[argv.index(name) + 1]


# ---- parsing and validation -------------------------------------------------------------


def test_defaults_are_llama_cpps():
    cfg = parse_config_text("")
    mf, hw = cfg.defaults.model_fit, cfg.defaults.hardware
    assert (mf.ubatch, mf.flash_attention, mf.cache_type_k, mf.cache_type_v) == (512, "auto", "f16", "f16")
    assert (hw.mmap, hw.mlock, hw.n_gpu_layers, hw.safety_margin_gb) == ("auto", False, None, 1.0)
    assert cfg.reserved_keys == ()


@pytest.mark.parametrize(
    "text,attr,expected",
    [
        ("[defaults.model_fit]\nflash_attention = true", ("model_fit", "flash_attention"), "on"),
        ("[defaults.model_fit]\nflash_attention = false", ("model_fit", "flash_attention"), "off"),
        ("[defaults.model_fit]\nflash_attention = 'auto'", ("model_fit", "flash_attention"), "auto"),
        ("[defaults.model_fit]\nubatch = 64", ("model_fit", "ubatch"), 64),
        ("[defaults.model_fit]\nkv_dtype = 'q8_0'", ("model_fit", "cache_type_k"), "q8_0"),
        ("[defaults.model_fit]\nkv_dtype = 'q8_0'", ("model_fit", "cache_type_v"), "q8_0"),
        ("[defaults.model_fit]\nkv_dtype = 'q8_0'\ntype_k = 'f32'", ("model_fit", "cache_type_k"), "f32"),
        ("[defaults.model_fit]\ntype_v = 'q4_0'", ("model_fit", "cache_type_v"), "q4_0"),
        ("[defaults.hardware]\nmmap = false", ("hardware", "mmap"), "off"),
        ("[defaults.hardware]\nmmap = true", ("hardware", "mmap"), "on"),
        ("[defaults.hardware]\ngpu_layers = 12", ("hardware", "n_gpu_layers"), 12),
        ("[defaults.hardware]\ngpu_layers = -1", ("hardware", "n_gpu_layers"), -1),
        ("[defaults.hardware]\ngpu_layers = 'auto'", ("hardware", "n_gpu_layers"), None),
        ("[defaults.hardware]\nmlock = true", ("hardware", "mlock"), True),
        ("[defaults.hardware]\nsafety_margin_gb = 2.5", ("hardware", "safety_margin_gb"), 2.5),
        ("[defaults.throughput]\nthreads = 3", ("throughput", "threads"), 3),
        ("[defaults.throughput]\nthreads_batch = 5", ("throughput", "threads_batch"), 5),
    ],
)
def test_each_knob_parses(text, attr, expected):
    section, name = attr
    assert getattr(getattr(parse_config_text(text).defaults, section), name) == expected


@pytest.mark.parametrize(
    "text,key,words",
    [
        ("[defaults.model_fit]\nubatch = 0", "[defaults.model_fit].ubatch", "> 0"),
        ("[defaults.model_fit]\nflash_attention = 'maybe'", "[defaults.model_fit].flash_attention", "auto, on, off"),
        ("[defaults.model_fit]\nflash_attention = 1", "[defaults.model_fit].flash_attention", "true, false"),
        ("[defaults.model_fit]\nkv_dtype = 'q3_k'", "[defaults.model_fit].kv_dtype", "q8_0"),
        ("[defaults.model_fit]\ntype_k = 'q7'", "[defaults.model_fit].type_k", "q8_0"),
        ("[defaults.model_fit]\ntype_v = 'f8'", "[defaults.model_fit].type_v", "q8_0"),
        (
            "[defaults.model_fit]\ntype_v = 'q8_0'\nflash_attention = false",
            "[defaults.model_fit].type_v",
            "needs flash attention",
        ),
        (
            "[defaults.model_fit]\nkv_dtype = 'q4_0'\nflash_attention = 'off'",
            "[defaults.model_fit].kv_dtype",
            "needs flash attention",
        ),
        ("[defaults.hardware]\nmmap = 'sometimes'", "[defaults.hardware].mmap", "auto, on, off"),
        ("[defaults.hardware]\ngpu_layers = -2", "[defaults.hardware].gpu_layers", "-1"),
        ("[defaults.hardware]\ngpu_layers = 'all'", "[defaults.hardware].gpu_layers", "auto"),
        ("[defaults.hardware]\nsafety_margin_gb = -1", "[defaults.hardware].safety_margin_gb", ">= 0"),
        ("[defaults.throughput]\nthreads = -1", "[defaults.throughput].threads", ">= 0"),
        ("[defaults.throughput]\nthreads_batch = 1.5", "[defaults.throughput].threads_batch", "integer"),
        ("[defaults.model_fit]\nflashattention = true", "[defaults.model_fit].flashattention", "unknown key"),
    ],
)
def test_bad_values_are_refused_naming_the_key(text, key, words):
    with pytest.raises(ConfigError) as err:
        parse_config_text(text)
    assert key in str(err.value) and words in str(err.value)


def test_quantized_k_needs_no_flash_attention_and_quantized_v_takes_auto():
    """llama.cpp accepts a quantized K cache without flash attention, and turns auto on for a quantized V."""
    assert parse_config_text("[defaults.model_fit]\ntype_k = 'q8_0'\nflash_attention = 'off'")
    assert parse_config_text("[defaults.model_fit]\nkv_dtype = 'q8_0'").defaults.model_fit.flash_attention == "auto"


# ---- reserved keys --------------------------------------------------------------------------


def test_reserved_keys_set_in_the_file_are_listed():
    cfg = parse_config_text("""
[defaults.model_fit]
ubatch = 128
kv_cache_policy = "memory"
[defaults.model_fit.prefix_cache]
enabled = true
payload_mode = "auto"
[defaults.hardware]
device = "auto"
mlock = false
[defaults.skippy]
prefill_chunk_size = 256
[placement]
s3_bucket = "models"
""")  # [placement] acts (docs/placement.md): not reserved
    assert cfg.reserved_keys == (
        "defaults.hardware.device",
        "defaults.model_fit.kv_cache_policy",
        "defaults.model_fit.prefix_cache.payload_mode",
        "defaults.skippy.prefill_chunk_size",
    )


def test_implemented_keys_are_not_reserved():
    implemented = (
        "ubatch",
        "flash_attention",
        "kv_dtype",
        "type_k",
        "type_v",
        "mmap",
        "mlock",
        "gpu_layers",
        "threads",
        "threads_batch",
        "safety_margin_gb",
        "model_runtime",
    )
    assert not [k for k in RESERVED_KEYS if k.rsplit(".", 1)[-1] in implemented]


async def test_reserved_keys_are_logged_at_start_and_in_status(tmp_path, caplog):
    node = _node(tmp_path, "[defaults.throughput]\nnuma = 'off'\npriority = 'high'\n[placement]\ncache_ttl_secs = 5\n")
    assert node.status()["config"]["reserved_keys"] == ["defaults.throughput.numa", "defaults.throughput.priority"]
    caplog.set_level(logging.INFO, logger="hydra.node")
    async with trio.open_nursery() as nursery:
        with trio.fail_after(30):
            await nursery.start(node.run)
        node.request_stop()
    lines = [r.getMessage() for r in caplog.records if "config_reserved_keys" in r.getMessage()]
    assert lines == ["event=config_reserved_keys keys=defaults.throughput.numa,defaults.throughput.priority"]


async def test_status_shows_no_reserved_keys_without_any(tmp_path):
    assert _node(tmp_path, "[defaults.model_fit]\nubatch = 64\n").status()["config"]["reserved_keys"] == []


# ---- the memory budget: safety_margin_gb -----------------------------------------------------


def test_safety_margin_comes_off_the_available_memory_before_the_cap():
    assert HostMemory.budget(32 * GIB, 10 * GIB, safety_margin_bytes=GIB).usable_bytes == 9 * GIB
    assert (
        HostMemory.budget(32 * GIB, 10 * GIB, safety_margin_bytes=GIB, max_memory_bytes=4 * GIB).usable_bytes == 4 * GIB
    )
    assert HostMemory.budget(32 * GIB, 10 * GIB, safety_margin_bytes=20 * GIB).usable_bytes == 0
    assert HostMemory.budget(0, 0, safety_margin_bytes=GIB, max_memory_bytes=GIB).usable_bytes == GIB
    with pytest.raises(ValueError):
        HostMemory.budget(GIB, GIB, safety_margin_bytes=-1)


def test_the_nodes_placement_budget_applies_the_margin(tmp_path):
    roomy = _node(tmp_path / "a", "[defaults.hardware]\nsafety_margin_gb = 0\n").host_memory()
    assert roomy.usable_bytes > 0
    starved = _node(tmp_path / "b", "[defaults.hardware]\nsafety_margin_gb = 1000000\n").host_memory()
    assert starved.usable_bytes == 0 and starved.ram_bytes == roomy.ram_bytes


# ---- config → RunnerSettings → runner argv → Llama kwargs -----------------------------------

KNOBS = """
[defaults.model_fit]
batch = 256
ubatch = 64
flash_attention = true
type_k = "q8_0"
type_v = "q4_0"
[defaults.hardware]
mmap = false
mlock = true
gpu_layers = 7
[defaults.throughput]
threads = 3
threads_batch = 5
"""


def test_every_knob_reaches_the_runner_argv(tmp_path):
    settings = _node(tmp_path, KNOBS).runner_settings()
    argv = _argv(settings, tmp_path)
    assert {
        f: _flag(argv, f)
        for f in (
            "--n-batch",
            "--n-ubatch",
            "--flash-attn",
            "--type-k",
            "--type-v",
            "--mmap",
            "--n-gpu-layers",
            "--threads",
            "--threads-batch",
        )
    } == {
        "--n-batch": "256",
        "--n-ubatch": "64",
        "--flash-attn": "on",
        "--type-k": "q8_0",
        "--type-v": "q4_0",
        "--mmap": "off",
        "--n-gpu-layers": "7",
        "--threads": "3",
        "--threads-batch": "5",
    }
    assert "--mlock" in argv


def test_defaults_reach_the_runner_argv_as_auto(tmp_path):
    argv = _argv(_node(tmp_path).runner_settings(), tmp_path)
    assert (_flag(argv, "--flash-attn"), _flag(argv, "--mmap"), _flag(argv, "--type-k")) == ("auto", "auto", "f16")
    assert "--n-gpu-layers" not in argv and "--mlock" not in argv  # gpu_layers auto: the runner decides


def test_llama_kwargs_map_every_knob_to_llama_cpp():
    kw = llama_params.llama_kwargs(
        llama_cpp,
        n_ubatch=64,
        flash_attention="on",
        type_k="q8_0",
        type_v="q4_0",
        mmap="off",
        mlock=True,
        threads=3,
        threads_batch=0,
        n_gpu_layers=7,
        gpu_devices=0,
    )
    assert kw == {
        "n_ubatch": 64,
        "flash_attn": True,
        "type_k": llama_cpp.GGML_TYPE_Q8_0,
        "type_v": llama_cpp.GGML_TYPE_Q4_0,
        "use_mmap": False,
        "use_mlock": True,
        "n_threads": 3,
        "n_threads_batch": None,
        "n_gpu_layers": 7,
    }
    auto = {
        "n_ubatch": 512,
        "flash_attention": "auto",
        "type_k": "f16",
        "type_v": "f16",
        "mmap": "auto",
        "mlock": False,
        "threads": 0,
        "threads_batch": 0,
        "n_gpu_layers": None,
    }
    assert llama_params.llama_kwargs(llama_cpp, **auto, gpu_devices=0)["n_gpu_layers"] == 0
    assert llama_params.llama_kwargs(llama_cpp, **auto, gpu_devices=1)["n_gpu_layers"] == -1
    assert llama_params.llama_kwargs(llama_cpp, **auto, gpu_devices=0)["flash_attn"] is True
    with pytest.raises(ValueError, match="needs flash attention"):
        llama_params.llama_kwargs(llama_cpp, **{**auto, "flash_attention": "off", "type_v": "q8_0"}, gpu_devices=0)
    with pytest.raises(ValueError, match="KV cache type"):
        llama_params.llama_kwargs(llama_cpp, **{**auto, "type_k": "q3_k"}, gpu_devices=0)


def test_every_kv_cache_type_is_the_ggml_type_of_that_name():
    """Checked against the loaded ggml itself: ``ggml_type_name`` and ``ggml_is_quantized``."""
    import ctypes

    from hydra_node.runtime.rpc.ggml import llama_libdir

    base = ctypes.CDLL(str(llama_libdir() / "libggml-base.so.0"))
    base.ggml_type_name.restype, base.ggml_type_name.argtypes = ctypes.c_char_p, [ctypes.c_int]
    base.ggml_is_quantized.restype, base.ggml_is_quantized.argtypes = ctypes.c_bool, [ctypes.c_int]
    for name in llama_params.KV_CACHE_TYPES:
        value = llama_params.ggml_type(llama_cpp, name)
        assert base.ggml_type_name(value).decode() == name
        assert base.ggml_is_quantized(value) == (name in llama_params.QUANTIZED_KV_TYPES)


def test_gpu_layers_without_a_gpu_is_reported_not_silently_accepted():
    assert "no GPU device" in llama_params.gpu_report(12, gpu_devices=0, rpc_devices=0)["note"]
    assert "note" not in llama_params.gpu_report(12, gpu_devices=1, rpc_devices=0)
    assert "note" not in llama_params.gpu_report(None, gpu_devices=0, rpc_devices=0)
    assert "note" not in llama_params.gpu_report(12, gpu_devices=0, rpc_devices=2)  # a split offloads to RPC


# ---- live: a real runner with the knobs ----------------------------------------------------

LIVE_CASES = {  # TOML for [defaults.model_fit], and what the runner must report
    "flash-on-q8-k": ("flash_attention = true\nubatch = 64\ntype_k = \"q8_0\"", (64, "on", "q8_0", "f16")),
    "auto-q8-kv": ("kv_dtype = \"q8_0\"", (512, "auto: on", "q8_0", "q8_0")),  # quantized V: flash attention on
}


@pytest.mark.parametrize("case", sorted(LIVE_CASES))
async def test_a_runner_loads_with_the_knobs_and_generates(tmp_path, model_path, case):
    from hydra_node.runtime.runner.supervisor import RunnerSupervisor

    model_fit, expected = LIVE_CASES[case]
    text = (
        f"[defaults.model_fit]\nctx_size = 512\n{model_fit}\n"
        "[defaults.hardware]\nwarmup = false\ngpu_layers = 3\nmmap = false\n"
        "[defaults.throughput]\nthreads = 1\nthreads_batch = 2\n"
    )
    settings = _node(tmp_path / "node", text).runner_settings()
    sup = RunnerSupervisor(resolve_model(None), tmp_path, settings, node_id="n")
    req = GenerationRequest.from_wire(
        {"model": sup.model.id, "kind": "completion", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0.0}
    )
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            async with sup.generate(req) as events:
                got = [e async for e in events]
            nursery.cancel_scope.cancel()
    assert isinstance(got[-1], Finished) and got[-1].completion_tokens > 0
    report = sup.status().llama
    assert report is not None and report == sup.info["llama"]
    assert (report["n_ubatch"], report["flash_attn"], report["type_k"], report["type_v"]) == expected
    assert (report["use_mmap"], report["threads"], report["threads_batch"]) == (False, 1, 2)
    gpu = report["gpu_layers"]
    assert gpu["requested"] == 3 and gpu["n_gpu_layers"] == 3
    assert ("note" in gpu) == (gpu["gpu_devices"] == 0)  # a CPU-only build says gpu_layers did nothing


def test_prefix_cache_keys_reach_the_runner_and_its_engine(tmp_path):
    """[defaults.model_fit.prefix_cache] enabled/min_tokens/max_entries act (payload_mode stays reserved)."""
    text = "[defaults.model_fit.prefix_cache]\nenabled = false\nmin_tokens = 32\nmax_entries = 2\n"
    node = _node(tmp_path, text)
    assert node.config.file.reserved_keys == ()
    argv = _argv(node.runner_settings(), tmp_path)
    assert _flag(argv, "--prefix-min-tokens") == "32" and _flag(argv, "--prefix-max-entries") == "2"
    assert "--no-prefix-sharing" in argv
    assert "--no-prefix-sharing" not in _argv(_node(tmp_path / "d").runner_settings(), tmp_path)
    with pytest.raises(ConfigError, match=r"prefix_cache\]\.min_tokens"):
        NodeConfig(
            home=tmp_path, no_model=True, file=parse_config_text("[defaults.model_fit.prefix_cache]\nmin_tokens = 0\n")
        ).validate()
