"""The building blocks of the configuration (:mod:`hydra_node.config`): the error type, the
table → dataclass parser with its value checks, and the ``[defaults.*]`` sections (model fit,
hardware, throughput, speculative, skippy).  Split from ``config.py`` to keep each module
small; import these names from :mod:`hydra_node.config`, which re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping, cast

from hydra_node.runtime.runner.llama_params import (
    FLASH_ATTENTION_MODES,
    KV_CACHE_TYPES,
    MMAP_MODES,
    kv_flash_conflict,
)
from hydra_node.runtime.runner.records import REASONING_FORMAT_SETTINGS

__all__ = [
    "DEFAULT_PARALLEL",
    "MAX_PARALLEL",
    "ConfigError",
    "DefaultsSection",
    "HardwareSection",
    "ModelFitSection",
    "PrefixCacheSection",
    "SkippySection",
    "SpeculativeSection",
    "ThroughputSection",
]


class ConfigError(ValueError):
    """The configuration is invalid; the message names the offending key."""


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{key}: {msg}")


def _section(cls, data: Mapping[str, Any], prefix: str, reserved: set[str] | None = None):
    """Build dataclass ``cls`` from ``data``; unknown keys are errors naming the key."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"[{prefix}]: must be a table")
    known = {f.name: f for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        full = f"[{prefix}].{key}"
        if key not in known:
            raise ConfigError(f"{full}: unknown key (known: {', '.join(sorted(known))})")
        f = known[key]
        sub = f.metadata.get("section")
        if sub is not None:
            kwargs[key] = _section(sub, value, f"{prefix}.{key}")
            continue
        kwargs[key] = _coerce(full, f.type, value)
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        validate(prefix)
    return obj


def _coerce(key: str, typ: Any, value: Any) -> Any:
    t = typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
    if t == "bool":
        _check(isinstance(value, bool), key, f"must be true or false, not {value!r}")
    elif t == "int":
        _check(isinstance(value, int) and not isinstance(value, bool), key, f"must be an integer, not {value!r}")
    elif t == "float":
        _check(isinstance(value, (int, float)) and not isinstance(value, bool), key, f"must be a number, not {value!r}")
        value = float(value)
    elif t == "str":
        _check(isinstance(value, str), key, f"must be a string, not {value!r}")
    elif t == "str | bool":  # a switch that also has "auto": true → "on", false → "off"
        _check(isinstance(value, (bool, str)), key, f"must be true, false or a string, not {value!r}")
        value = ("on" if value else "off") if isinstance(value, bool) else value
    elif t.startswith("int | str") or t == "str | int":
        _check(
            isinstance(value, (int, str)) and not isinstance(value, bool),
            key,
            f"must be an integer or a string, not {value!r}",
        )
    elif t.startswith("tuple"):
        _check(isinstance(value, list), key, f"must be an array, not {value!r}")
        value = tuple(value)
    return value


def _one_of(prefix: str, key: str, value: object, allowed: tuple[str, ...]) -> None:
    _check(value in allowed, f"[{prefix}].{key}", f"must be one of {', '.join(allowed)}, not {value!r}")


def _positive(prefix: str, key: str, value: float, *, zero_ok: bool = False) -> None:
    ok = value >= 0 if zero_ok else value > 0
    _check(ok, f"[{prefix}].{key}", f"must be {'>= 0' if zero_ok else '> 0'}, not {value!r}")


@dataclass(frozen=True)
class PrefixCacheSection:
    """Prefix reuse across a runner's slots (the engine's slot scheduler, docs/config.md)."""

    enabled: bool = True  # copy a prefix held by a slot that is still generating
    max_entries: int = 64  # free slots that keep their cached prefix (the oldest is dropped beyond)
    min_tokens: int = 64  # shortest prefix worth copying from another slot
    payload_mode: str = "auto"  # reserved: KV state across the mesh (placement)
    #: the prompt cache's tiers, per hosted model (docs/prompt-cache.md): the KV state of prefixes
    #: slots lose, kept in RAM (MB) and on disk under HOME/prompt-cache (GB); 0 disables a tier
    ram_mb: int = 1024
    disk_gb: float = 8.0

    def validate(self, prefix: str) -> None:
        _check(isinstance(self.enabled, bool), f"[{prefix}].enabled", "must be true or false")
        for key in ("max_entries", "min_tokens"):
            v = getattr(self, key)
            _check(type(v) is int and 0 <= v <= 1 << 20, f"[{prefix}].{key}", f"must be an integer >= 0, not {v!r}")
        _check(self.min_tokens >= 1, f"[{prefix}].min_tokens", "must be at least 1")
        _check(
            type(self.ram_mb) is int and 0 <= self.ram_mb <= 1 << 24,
            f"[{prefix}].ram_mb",
            f"must be an integer from 0 (no RAM tier) to {1 << 24}, not {self.ram_mb!r}",
        )
        _check(
            type(self.disk_gb) in (int, float) and 0 <= self.disk_gb <= 1 << 20,
            f"[{prefix}].disk_gb",
            f"must be a number from 0 (no disk tier) to {1 << 20}, not {self.disk_gb!r}",
        )


@dataclass(frozen=True)
class ModelFitSection:
    ctx_size: int = 4096
    batch: int = 512
    ubatch: int = 512  # llama.cpp n_ubatch, capped at batch (as llama.cpp does)
    flash_attention: str | bool = "auto"  # auto | on | off (true = on, false = off)
    kv_cache_policy: str = "balanced"
    kv_dtype: str = "auto"  # K and V cache type; auto = f16 (llama.cpp's default)
    type_k: str = ""  # K cache type; "" = kv_dtype
    type_v: str = ""  # V cache type; "" = kv_dtype
    prompt_cache: bool = True
    #: auto | none | think | gpt-oss: the model's reasoning format, as llama-server's --reasoning-format
    #: (auto: detected from its chat template; docs/reasoning.md "Override")
    reasoning_format: str = "auto"
    prefix_cache: PrefixCacheSection = field(
        default_factory=PrefixCacheSection, metadata={"section": PrefixCacheSection}
    )

    @property
    def cache_type_k(self) -> str:
        return self.type_k or (self.kv_dtype if self.kv_dtype != "auto" else "f16")

    @property
    def cache_type_v(self) -> str:
        return self.type_v or (self.kv_dtype if self.kv_dtype != "auto" else "f16")

    def validate(self, prefix: str) -> None:
        _check(
            128 <= self.ctx_size <= 1 << 20,
            f"[{prefix}].ctx_size",
            f"must be between 128 and 1048576, not {self.ctx_size}",
        )
        _positive(prefix, "batch", self.batch)
        _positive(prefix, "ubatch", self.ubatch)
        _one_of(prefix, "flash_attention", self.flash_attention, FLASH_ATTENTION_MODES)
        _one_of(prefix, "kv_cache_policy", self.kv_cache_policy, ("balanced", "quality", "memory"))
        _one_of(prefix, "kv_dtype", self.kv_dtype, ("auto", *KV_CACHE_TYPES))
        _one_of(prefix, "reasoning_format", self.reasoning_format, REASONING_FORMAT_SETTINGS)
        for key in ("type_k", "type_v"):
            if getattr(self, key):
                _one_of(prefix, key, getattr(self, key), KV_CACHE_TYPES)
        # (a str now: loading normalised true/false, and _one_of refused anything else)
        conflict = kv_flash_conflict(self.cache_type_v, cast(str, self.flash_attention))
        _check(conflict is None, f"[{prefix}].{'type_v' if self.type_v else 'kv_dtype'}", conflict or "")
        self.prefix_cache.validate(f"{prefix}.prefix_cache")


@dataclass(frozen=True)
class HardwareSection:
    model_runtime: str = "auto"
    device: str = "auto"
    gpu_layers: int | str = "auto"  # layers offloaded to a GPU; auto = all when ggml has a GPU device
    split_mode: str = "layer"
    tensor_split: tuple = ()
    mmap: str | bool = "auto"  # auto | on | off (true = on, false = off)
    mlock: bool = False
    direct_io: bool = False
    warmup: bool = True
    safety_margin_gb: float = 1.0  # free memory placement leaves unplanned
    moe_cpu: bool = False

    @property
    def n_gpu_layers(self) -> int | None:
        """llama.cpp ``n_gpu_layers`` (None: auto)."""
        return None if self.gpu_layers == "auto" else int(self.gpu_layers)

    def validate(self, prefix: str) -> None:
        _one_of(prefix, "model_runtime", self.model_runtime, ("auto", "llama.cpp"))
        _one_of(prefix, "split_mode", self.split_mode, ("layer", "row", "none"))
        _one_of(prefix, "mmap", self.mmap, MMAP_MODES)
        _positive(prefix, "safety_margin_gb", self.safety_margin_gb, zero_ok=True)
        if isinstance(self.gpu_layers, str):
            _check(self.gpu_layers == "auto", f"[{prefix}].gpu_layers", "must be an integer or \"auto\"")
        else:
            _check(
                self.gpu_layers >= -1,
                f"[{prefix}].gpu_layers",
                f"must be -1 (all), >= 0 or \"auto\", not {self.gpu_layers}",
            )


#: ``[defaults.throughput].parallel``: default sequences per runner, and the most (the engine's slot bound).
DEFAULT_PARALLEL = 4
MAX_PARALLEL = 64


@dataclass(frozen=True)
class ThroughputSection:
    #: Sequences one runner decodes together (llama-server -np); they share the ctx_size KV cells.
    parallel: int = DEFAULT_PARALLEL
    #: false: one sequence at a time through Llama.generate (then parallel must be 1).
    continuous_batching: bool = True
    threads: int = 0  # 0 = all cores
    threads_batch: int = 0
    tuning_profile: str = "balanced"
    priority: str = "normal"
    numa: str = "off"
    cpu_affinity: str = ""
    slot_prompt_similarity: float = 0.5
    queue_size: int = 16  # requests waiting per runner before 429

    def validate(self, prefix: str) -> None:
        _check(
            isinstance(self.parallel, int) and 1 <= self.parallel <= MAX_PARALLEL,
            f"[{prefix}].parallel",
            f"must be an integer between 1 and {MAX_PARALLEL}, not {self.parallel!r}",
        )
        _check(
            self.continuous_batching or self.parallel == 1,
            f"[{prefix}].parallel",
            "parallel > 1 needs continuous_batching = true (without it the runner generates one sequence at a time)",
        )
        _positive(prefix, "threads", self.threads, zero_ok=True)
        _positive(prefix, "threads_batch", self.threads_batch, zero_ok=True)
        _check(
            1 <= self.queue_size <= 4096, f"[{prefix}].queue_size", f"must be between 1 and 4096, not {self.queue_size}"
        )
        _one_of(prefix, "tuning_profile", self.tuning_profile, ("balanced", "latency", "throughput"))


@dataclass(frozen=True)
class SpeculativeSection:
    strategy: str = "off"
    draft_model: str = ""
    draft_max_tokens: int = 8
    draft_min_tokens: int = 1
    min_acceptance: float = 0.3
    min_predicted_speedup: float = 1.0
    #: A draft model this node serves to the mesh's targets (``serve --draft-server MODEL``).
    serve_draft: str = ""

    def validate(self, prefix: str) -> None:
        _one_of(prefix, "strategy", self.strategy, ("off", "auto", "local", "mesh"))
        _check(
            1 <= self.draft_min_tokens <= self.draft_max_tokens <= 64,
            f"[{prefix}].draft_max_tokens",
            "need 1 <= draft_min_tokens <= draft_max_tokens <= 64",
        )
        _check(0.0 <= self.min_acceptance <= 1.0, f"[{prefix}].min_acceptance", "must be between 0 and 1")
        _check(0.0 < self.min_predicted_speedup <= 10.0, f"[{prefix}].min_predicted_speedup", "must be in (0, 10]")
        _check(
            self.strategy != "local" or bool(self.draft_model),
            f"[{prefix}].draft_model",
            "strategy \"local\" needs a draft_model",
        )


@dataclass(frozen=True)
class SkippySection:
    activation_wire_dtype: str = "auto"
    binary_stage_transport: str = "auto"
    prefill_chunking: str = "fixed"
    prefill_chunk_size: int = 512


@dataclass(frozen=True)
class DefaultsSection:
    model_fit: ModelFitSection = field(default_factory=ModelFitSection, metadata={"section": ModelFitSection})
    hardware: HardwareSection = field(default_factory=HardwareSection, metadata={"section": HardwareSection})
    throughput: ThroughputSection = field(default_factory=ThroughputSection, metadata={"section": ThroughputSection})
    speculative: SpeculativeSection = field(
        default_factory=SpeculativeSection, metadata={"section": SpeculativeSection}
    )
    skippy: SkippySection = field(default_factory=SkippySection, metadata={"section": SkippySection})
