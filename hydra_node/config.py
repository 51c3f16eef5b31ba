"""Typed configuration: TOML (`--config FILE`) into frozen dataclasses, then CLI overrides.

The loader is the only place that reads environment variables (``HYDRA_HOME``,
``HYDRA_API_KEY``, ``HYDRA_JOIN``).  Unknown keys and bad values fail with :class:`ConfigError`
naming the key, e.g. ``[scheduler].mode: must be one of off, shadow, active``.

Sections follow the seed README.  Keys that the node does not act on yet are
*reserved*: they are accepted and validated for type, listed in
``docs/config.md`` and in ``RESERVED_KEYS``; those a file sets are in
``FileConfig.reserved_keys``, logged at start and reported in ``/api/status``
(``config.reserved_keys``) so nobody believes they took effect.  Every other key acts.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from hydra_node.routing._config import SchedulerConfig, SchedulerConfigError
from hydra_node.runtime.runner.llama_params import (
    FLASH_ATTENTION_MODES,
    KV_CACHE_TYPES,
    MMAP_MODES,
    kv_flash_conflict,
)

if TYPE_CHECKING:  # the config loader stays importable without the services it configures
    from hydra_node.discovery.node_choice import DiscoverySettings
    from hydra_node.mesh.settings import MeshSettings

DEFAULT_API_PORT = 9337
DEFAULT_CONSOLE_PORT = 3131
DEFAULT_MESH_PORT = 9338


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
        _check(isinstance(value, (int, str)) and not isinstance(value, bool), key, f"must be an integer or a string, not {value!r}")
    elif t.startswith("tuple"):
        _check(isinstance(value, list), key, f"must be an array, not {value!r}")
        value = tuple(value)
    return value


def _one_of(prefix: str, key: str, value: str, allowed: tuple[str, ...]) -> None:
    _check(value in allowed, f"[{prefix}].{key}", f"must be one of {', '.join(allowed)}, not {value!r}")


def _positive(prefix: str, key: str, value: float, *, zero_ok: bool = False) -> None:
    ok = value >= 0 if zero_ok else value > 0
    _check(ok, f"[{prefix}].{key}", f"must be {'>= 0' if zero_ok else '> 0'}, not {value!r}")


def _scheduler_section(data: Any) -> SchedulerConfig:
    """``[scheduler]`` is the routing package's own config (more keys than the seed's eight)."""
    try:
        return SchedulerConfig.from_mapping(data)
    except SchedulerConfigError as exc:
        raise ConfigError(str(exc)) from None


@dataclass(frozen=True)
class PrefixCacheSection:
    """Prefix reuse across a runner's slots (the engine's slot scheduler, docs/config.md)."""
    enabled: bool = True  # copy a prefix held by a slot that is still generating
    max_entries: int = 64  # free slots that keep their cached prefix (the oldest is dropped beyond)
    min_tokens: int = 64  # shortest prefix worth copying from another slot
    payload_mode: str = "auto"  # reserved: KV state across the mesh (placement)

    def validate(self, prefix: str) -> None:
        _check(isinstance(self.enabled, bool), f"[{prefix}].enabled", "must be true or false")
        for key in ("max_entries", "min_tokens"):
            v = getattr(self, key)
            _check(type(v) is int and 0 <= v <= 1 << 20, f"[{prefix}].{key}", f"must be an integer >= 0, not {v!r}")
        _check(self.min_tokens >= 1, f"[{prefix}].min_tokens", "must be at least 1")


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
    prefix_cache: PrefixCacheSection = field(default_factory=PrefixCacheSection,
                                             metadata={"section": PrefixCacheSection})

    @property
    def cache_type_k(self) -> str:
        return self.type_k or (self.kv_dtype if self.kv_dtype != "auto" else "f16")

    @property
    def cache_type_v(self) -> str:
        return self.type_v or (self.kv_dtype if self.kv_dtype != "auto" else "f16")

    def validate(self, prefix: str) -> None:
        _check(128 <= self.ctx_size <= 1 << 20, f"[{prefix}].ctx_size", f"must be between 128 and 1048576, not {self.ctx_size}")
        _positive(prefix, "batch", self.batch)
        _positive(prefix, "ubatch", self.ubatch)
        _one_of(prefix, "flash_attention", self.flash_attention, FLASH_ATTENTION_MODES)
        _one_of(prefix, "kv_cache_policy", self.kv_cache_policy, ("balanced", "quality", "memory"))
        _one_of(prefix, "kv_dtype", self.kv_dtype, ("auto", *KV_CACHE_TYPES))
        for key in ("type_k", "type_v"):
            if getattr(self, key):
                _one_of(prefix, key, getattr(self, key), KV_CACHE_TYPES)
        conflict = kv_flash_conflict(self.cache_type_v, self.flash_attention)
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
            _check(self.gpu_layers >= -1, f"[{prefix}].gpu_layers", f"must be -1 (all), >= 0 or \"auto\", not {self.gpu_layers}")


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
        _check(isinstance(self.parallel, int) and 1 <= self.parallel <= MAX_PARALLEL, f"[{prefix}].parallel",
               f"must be an integer between 1 and {MAX_PARALLEL}, not {self.parallel!r}")
        _check(self.continuous_batching or self.parallel == 1, f"[{prefix}].parallel",
               "parallel > 1 needs continuous_batching = true (without it the runner generates one sequence at a time)")
        _positive(prefix, "threads", self.threads, zero_ok=True)
        _positive(prefix, "threads_batch", self.threads_batch, zero_ok=True)
        _check(1 <= self.queue_size <= 4096, f"[{prefix}].queue_size", f"must be between 1 and 4096, not {self.queue_size}")
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
        _check(1 <= self.draft_min_tokens <= self.draft_max_tokens <= 64, f"[{prefix}].draft_max_tokens",
               "need 1 <= draft_min_tokens <= draft_max_tokens <= 64")
        _check(0.0 <= self.min_acceptance <= 1.0, f"[{prefix}].min_acceptance", "must be between 0 and 1")
        _check(0.0 < self.min_predicted_speedup <= 10.0, f"[{prefix}].min_predicted_speedup",
               "must be in (0, 10]")
        _check(self.strategy != "local" or bool(self.draft_model), f"[{prefix}].draft_model",
               "strategy \"local\" needs a draft_model")


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
    speculative: SpeculativeSection = field(default_factory=SpeculativeSection, metadata={"section": SpeculativeSection})
    skippy: SkippySection = field(default_factory=SkippySection, metadata={"section": SkippySection})


@dataclass(frozen=True)
class PlacementSection:
    posix_root: str = ""
    s3_endpoint: str = ""
    s3_bucket: str = ""
    cache_ttl_secs: int = 86400
    cache_capacity_gb: float = 0.0
    prefetch_threshold: float = 0.0
    vast_trigger_endpoint: str = ""


@dataclass(frozen=True)
class RunnerSection:
    """Supervision of model runner processes (Hydra-specific)."""

    load_timeout_s: float = 120.0
    restart_backoff_initial_s: float = 0.5
    restart_backoff_max_s: float = 30.0
    crash_loop_restarts: int = 5  # this many crashes within crash_loop_window_s -> state "failed"
    crash_loop_window_s: float = 60.0
    failed_retry_s: float = 300.0  # a failed runner (crash loop) is tried again after this long; 0 = never
    #: Test and benchmark knob: the runner sleeps this long after every generated token (default 0),
    #: making this host measurably slower, e.g. to watch the scheduler steer traffic away from it.
    inject_token_delay_ms: float = 0.0

    def validate(self, prefix: str) -> None:
        for f in fields(self):
            _positive(prefix, f.name, getattr(self, f.name),
                      zero_ok=f.name in ("inject_token_delay_ms", "failed_retry_s"))
        _check(self.inject_token_delay_ms <= MAX_INJECT_TOKEN_DELAY_MS, f"[{prefix}].inject_token_delay_ms",
               f"must be at most {MAX_INJECT_TOKEN_DELAY_MS:g}, not {self.inject_token_delay_ms}")


#: Upper bound on ``[runner].inject_token_delay_ms`` (a minute per token is already absurd).
MAX_INJECT_TOKEN_DELAY_MS = 60_000.0


#: Keys (or whole tables) accepted and validated but not acted on yet (documented in docs/config.md).
#: Those present in a file are listed in ``FileConfig.reserved_keys``: logged at start
#: (``event=config_reserved_keys``) and shown in ``/api/status`` ``config.reserved_keys``.
RESERVED_KEYS = (
    "defaults.model_fit.kv_cache_policy", "defaults.model_fit.prefix_cache.payload_mode", "defaults.hardware.device",
    "defaults.hardware.direct_io", "defaults.hardware.moe_cpu", "defaults.hardware.split_mode",
    "defaults.hardware.tensor_split", "defaults.throughput.tuning_profile",
    "defaults.throughput.priority", "defaults.throughput.numa", "defaults.throughput.cpu_affinity",
    "defaults.throughput.slot_prompt_similarity", "defaults.skippy", "placement",
)


def reserved_keys_in(data: Mapping[str, Any]) -> tuple[str, ...]:
    """The reserved keys set in parsed TOML ``data`` (a reserved table lists each key set in it)."""
    found: list[str] = []

    def leaves(path: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for key, sub in value.items():
                leaves(f"{path}.{key}", sub)
        else:
            found.append(path)

    for reserved in RESERVED_KEYS:
        node: Any = data
        for part in reserved.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        if node is not None:
            leaves(reserved, node)
    return tuple(sorted(found))


@dataclass(frozen=True)
class ApiSection:
    """``[api]``: who may reach the HTTP APIs (docs/security.md).  The flags ``--cors-origin`` and
    ``--allow-host`` add to these lists."""

    #: Origins a browser page may call the OpenAI API from (``"*"``: any); none by default.
    cors_origins: tuple = ()
    #: Host names (``name`` or ``name:port``) accepted besides 127.0.0.1, localhost and [::1], for reverse proxies.
    allow_hosts: tuple = ()

    def validate(self, prefix: str) -> None:
        from hydra_node.api.http_guard import normalize_origin, valid_host_name

        for origin in self.cors_origins:
            _check(isinstance(origin, str) and (origin == "*" or normalize_origin(origin) == origin),
                   f"[{prefix}].cors_origins", "each must be \"*\" or an origin as browsers send it "
                   f"(lower-case scheme://host[:port], no path or trailing slash), not {origin!r}")
        for host in self.allow_hosts:
            _check(isinstance(host, str) and valid_host_name(host), f"[{prefix}].allow_hosts",
                   f"each must be a host name, optionally with :port, not {host!r}")


@dataclass(frozen=True)
class FileConfig:
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig, metadata={"parse": _scheduler_section})
    defaults: DefaultsSection = field(default_factory=DefaultsSection, metadata={"section": DefaultsSection})
    placement: PlacementSection = field(default_factory=PlacementSection, metadata={"section": PlacementSection})
    runner: RunnerSection = field(default_factory=RunnerSection, metadata={"section": RunnerSection})
    api: ApiSection = field(default_factory=ApiSection, metadata={"section": ApiSection})
    #: The reserved keys (:data:`RESERVED_KEYS`) this file sets; computed by the loader, not a table.
    reserved_keys: tuple[str, ...] = field(default=(), metadata={"computed": True})


def parse_config_text(text: str, source: str = "<config>") -> FileConfig:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    known = {f.name: f for f in fields(FileConfig) if not f.metadata.get("computed")}
    kwargs = {}
    for key, value in data.items():
        if key not in known:
            raise ConfigError(f"[{key}]: unknown section (known: {', '.join(sorted(known))})")
        parse = known[key].metadata.get("parse")
        kwargs[key] = parse(value) if parse else _section(known[key].metadata["section"], value, key)
    return FileConfig(**kwargs, reserved_keys=reserved_keys_in(data))


def load_config_file(path: str | os.PathLike | None) -> FileConfig:
    if path is None:
        return FileConfig()
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--config {p}: cannot read: {exc.strerror or exc}") from None
    return parse_config_text(text, str(p))


def default_home() -> Path:
    return Path(os.environ.get("HYDRA_HOME") or Path.home() / ".hydra").expanduser()


def env_api_key() -> str | None:
    return os.environ.get("HYDRA_API_KEY") or None


def env_join() -> tuple[str, ...]:
    """Invite tokens from ``HYDRA_JOIN`` (whitespace-separated), so they need not be on the command line."""
    return tuple(os.environ.get("HYDRA_JOIN", "").split())


@dataclass(frozen=True)
class NodeConfig:
    """Everything `serve` needs, after merging file config, environment and flags."""

    home: Path
    models: tuple[str, ...] = ()  # --model values; empty = the bundled model
    no_model: bool = False
    name: str = ""
    api_host: str = "127.0.0.1"
    api_port: int = DEFAULT_API_PORT
    console_port: int = DEFAULT_CONSOLE_PORT
    headless: bool = False
    listen_all: bool = False
    api_key: str | None = None
    file: FileConfig = field(default_factory=FileConfig)
    log_format: str = "kv"
    role: str = "host"  # host | worker (--no-model) | client
    max_memory_bytes: int | None = None
    force_split: bool = False  # --split: split hosted models over mesh RPC workers even when they fit
    rpc_worker: bool = True  # --no-rpc-worker: lend no memory to other nodes' models
    split_stall_timeout_s: float = 60.0  # --stall-timeout: a split runner silent this long is killed
    tunnel_port: int = 0  # --tunnel-port: data port of this node's RPC tunnels (0: any free port)
    mesh: MeshSettings | None = None  # None: no mesh at all
    discovery: DiscoverySettings | None = None  # None: no discovery

    def validate(self) -> None:
        for name, port in (("--port", self.api_port), ("--console", self.console_port)):
            if not (0 <= port <= 65535):
                raise ConfigError(f"{name}: must be a TCP port between 0 and 65535, not {port}")
        if self.listen_all and not self.api_key:
            raise ConfigError("--listen-all: refusing to listen on all interfaces without an API key; "
                              "pass --api-key KEY or set HYDRA_API_KEY")
        if self.api_key is not None and (len(self.api_key) < 8 or not all("!" <= c <= "~" for c in self.api_key)):
            raise ConfigError("--api-key: must be at least 8 printable ASCII characters without spaces")

    def replace(self, **kw) -> "NodeConfig":
        return dataclasses.replace(self, **kw)
