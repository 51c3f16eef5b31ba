"""The speed knobs of a runner's llama.cpp model and context: names, rules, and their ``Llama`` kwargs.

Pure (llama-cpp-python is passed in, never imported here), so the config loader validates with
the same tables the runner child applies:

* KV cache types are llama-server's ``--cache-type-k/-v`` list (``common/arg.cpp``
  ``kv_cache_types`` in the llama.cpp that llama-cpp-python 0.3.36 vendors);
* a quantized V cache needs flash attention: llama.cpp (``llama_init_from_model``) turns
  ``flash_attn_type = auto`` on for it and refuses it with flash attention off, and so do we
  (:func:`kv_flash_conflict`), with a message naming the keys instead of a failed load;
* ``flash_attention = "auto"``: llama.cpp's auto enables flash attention wherever the device
  runs the fused op (every CPU, and the CUDA/Vulkan builds for the usual head sizes);
  llama-cpp-python's ``Llama`` takes only a bool, so the runner resolves auto to on there
  (:func:`resolve_flash_attention`);
* ``gpu_layers``: None means auto, every layer on the GPU when ggml has a GPU device, else 0.
  On a build without one llama.cpp ignores ``n_gpu_layers``; :func:`gpu_report` says so instead.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "FLASH_ATTENTION_MODES",
    "KV_CACHE_TYPES",
    "MMAP_MODES",
    "QUANTIZED_KV_TYPES",
    "count_gpu_devices",
    "ggml_type",
    "gpu_report",
    "kv_flash_conflict",
    "llama_kwargs",
    "resolve_flash_attention",
]

#: ``[defaults.model_fit].flash_attention`` after normalising booleans (true → on, false → off).
FLASH_ATTENTION_MODES = ("auto", "on", "off")
#: Cache types llama.cpp accepts for K and V (llama-server's list), by ggml type name.
KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
#: The block-quantized ones (``ggml_is_quantized``): a V cache of these needs flash attention.
QUANTIZED_KV_TYPES = frozenset({"q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"})
#: ``[defaults.hardware].mmap``: auto = llama.cpp's default (mmap where the platform supports it).
MMAP_MODES = ("auto", "on", "off")


def kv_flash_conflict(type_v: str, flash_attention: str) -> str | None:
    """Why llama.cpp would refuse this V cache type with this flash-attention mode (None: it accepts)."""
    if type_v in QUANTIZED_KV_TYPES and flash_attention == "off":
        return (
            f"a quantized V cache ({type_v}) needs flash attention, which llama.cpp refuses to run "
            f"with flash_attention = \"off\"; set flash_attention to \"auto\" or \"on\", or type_v to f16"
        )
    return None


def resolve_flash_attention(mode: str) -> bool:
    """The ``Llama(flash_attn=...)`` bool for a mode (auto → on, see the module docstring)."""
    if mode not in FLASH_ATTENTION_MODES:
        raise ValueError(f"flash attention mode must be one of {', '.join(FLASH_ATTENTION_MODES)}, not {mode!r}")
    return mode != "off"


#: ``enum ggml_type`` values llama-cpp-python 0.3.36 does not export (from ``ggml.h``; the test
#: checks them against ``ggml_type_name`` in the loaded library).
_GGML_TYPES_UNEXPORTED = {"bf16": 30}


def ggml_type(llama_cpp: Any, name: str) -> int:
    """The ``enum ggml_type`` value of a KV cache type name."""
    if name not in KV_CACHE_TYPES:
        raise ValueError(f"KV cache type must be one of {', '.join(KV_CACHE_TYPES)}, not {name!r}")
    value = getattr(llama_cpp, f"GGML_TYPE_{name.upper()}", None)
    return int(_GGML_TYPES_UNEXPORTED[name] if value is None else value)


def llama_kwargs(
    llama_cpp: Any,
    *,
    n_ubatch: int,
    flash_attention: str,
    type_k: str,
    type_v: str,
    mmap: str,
    mlock: bool,
    threads: int,
    threads_batch: int,
    n_gpu_layers: int | None,
    gpu_devices: int,
) -> dict[str, Any]:
    """Keyword arguments of ``llama_cpp.Llama`` for these knobs (``n_gpu_layers`` None: auto)."""
    conflict = kv_flash_conflict(type_v, flash_attention)
    if conflict is not None:
        raise ValueError(conflict)
    if mmap not in MMAP_MODES:
        raise ValueError(f"mmap must be one of {', '.join(MMAP_MODES)}, not {mmap!r}")
    if n_gpu_layers is None:
        n_gpu_layers = -1 if gpu_devices > 0 else 0
    return {
        "n_ubatch": n_ubatch,
        "flash_attn": resolve_flash_attention(flash_attention),
        "type_k": ggml_type(llama_cpp, type_k),
        "type_v": ggml_type(llama_cpp, type_v),
        "use_mmap": mmap != "off",
        "use_mlock": mlock,
        "n_threads": threads or None,
        "n_threads_batch": threads_batch or None,
        "n_gpu_layers": n_gpu_layers,
    }


def gpu_report(requested: int | None, gpu_devices: int, rpc_devices: int) -> dict[str, Any]:
    """What ``gpu_layers`` did, for the runner's ready message (``requested`` None: auto)."""
    report: dict[str, Any] = {"requested": "auto" if requested is None else requested, "gpu_devices": gpu_devices}
    if requested not in (None, 0) and gpu_devices == 0 and rpc_devices == 0:
        report["note"] = (
            "no GPU device in this llama.cpp build: llama.cpp ignores gpu_layers and runs "
            "every layer on the CPU (make install GPU=cuda or GPU=vulkan builds one)"
        )
    return report


#: ggml ``enum ggml_backend_dev_type``: the GPU kinds (discrete GPU, integrated GPU).
_GPU_DEVICE_TYPES = (1, 2)


def count_gpu_devices(ggml: Any) -> int:
    """GPU devices in ggml's registry (``ggml`` is :func:`hydra_node.runtime.rpc.ggml.load`'s)."""
    return sum(1 for i in range(ggml.dev_count()) if ggml.dev_type(ggml.dev_get(i)) in _GPU_DEVICE_TYPES)
