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

from hydra_node.moa.config import MoaSettings, parse_moa_section
from hydra_node.config.testing import LinkFaultsSection
from hydra_node.config.defaults import (  # noqa: F401 - re-exported: the sections are part of this module's API
    DEFAULT_PARALLEL,
    MAX_PARALLEL,
    ConfigError,
    DefaultsSection,
    HardwareSection,
    ModelFitSection,
    PrefixCacheSection,
    SkippySection,
    SpeculativeSection,
    ThroughputSection,
    _check,
    _coerce,
    _one_of,
    _positive,
    _section,
)
from hydra_node.config.rehost import RehostSection, parse_rehost_section
from hydra_node.runtime.fetch.settings import ModelsSection, one_capacity, parse_models_section
from hydra_node.routing.scheduler_config import SchedulerConfig, SchedulerConfigError

if TYPE_CHECKING:  # the config loader stays importable without the services it configures
    from hydra_node.discovery.node_choice import DiscoverySettings
    from hydra_node.mesh.settings import MeshSettings

DEFAULT_API_PORT = 9337
DEFAULT_CONSOLE_PORT = 3131
DEFAULT_MESH_PORT = 9338


def _scheduler_section(data: Any) -> SchedulerConfig:
    """``[scheduler]`` is the routing package's own config (more keys than the seed's eight)."""
    try:
        return SchedulerConfig.from_mapping(data)
    except SchedulerConfigError as exc:
        raise ConfigError(str(exc)) from None


@dataclass(frozen=True)
class PlacementSection:
    """``[placement]``: shared namespaces, the local artifact cache, the VAST trigger (docs/placement.md)."""

    posix_root: str = ""
    s3_endpoint: str = ""
    s3_bucket: str = ""
    s3_region: str = ""
    s3_prefix: str = ""
    s3_multipart_threshold_mb: float = 8.0  # files above this go up in parts (boto3's transfer manager)
    s3_part_size_mb: float = 8.0  # one part (S3: 5 MiB .. 5 GiB, at most 10,000 parts a file)
    cache_ttl_secs: int = 86400
    cache_capacity_gb: float = 0.0
    prefetch_threshold: float = 0.0  # refused unless 0 (docs/placement.md)
    vast_trigger_endpoint: str = ""
    vast_tenant: str = ""
    vast_dataspace: str = ""
    vast_source_namespace: str = ""
    vast_destination_namespace: str = ""
    vast_target_site: str = ""

    def validate(self, prefix: str) -> None:
        from hydra_node.runtime.artifacts.settings import check_placement

        check_placement(self, prefix, ConfigError)


@dataclass(frozen=True)
class RelaySection:
    """``[relay]``: links through relays for peers that cannot be dialled (docs/relays.md); the flags
    ``--relay``, ``--relay-rate`` and ``--hole-punch`` override the file."""

    mode: str = "auto"  # relay for others: auto (when we can be dialled and are not a client), on, off
    rate_mb_s: float = 4.0  # the bytes per second we relay for others, all circuits together
    use_relays: bool = True  # when we cannot be dialled: reserve at relays and announce them
    hole_punch: bool = True  # move relayed links to a direct path (direct dial or TCP hole punching)

    def validate(self, prefix: str) -> None:
        _check(self.mode in ("auto", "on", "off"), f"[{prefix}].mode", f"must be auto, on or off, not {self.mode!r}")
        _check(
            0.001 <= self.rate_mb_s <= 10_000,
            f"[{prefix}].rate_mb_s",
            f"must be between 0.001 and 10000 MB/s, not {self.rate_mb_s}",
        )


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
    #: Grammar work (response_format / tools constraints) one token may take, and one request, before
    #: THAT request fails with 422 grammar_too_slow (hydra_node/runtime/child/engine/grammar_budget.py).
    grammar_token_budget_ms: float = 5000.0
    grammar_request_budget_s: float = 60.0

    def validate(self, prefix: str) -> None:
        for f in fields(self):
            _positive(
                prefix, f.name, getattr(self, f.name), zero_ok=f.name in ("inject_token_delay_ms", "failed_retry_s")
            )
        _check(
            self.inject_token_delay_ms <= MAX_INJECT_TOKEN_DELAY_MS,
            f"[{prefix}].inject_token_delay_ms",
            f"must be at most {MAX_INJECT_TOKEN_DELAY_MS:g}, not {self.inject_token_delay_ms}",
        )


#: Upper bound on ``[node].handover_grace_s``.
MAX_HANDOVER_GRACE_S = 600.0


@dataclass(frozen=True)
class NodeSection:
    """``[node]``: the node's own life (Hydra-specific; docs/config.md)."""

    #: On stop, generations that finish within this many seconds complete here; the others are
    #: handed over to other hosts of their model (docs/scheduler.md "Hand-over on stop"). 0: at once.
    handover_grace_s: float = 3.0

    def validate(self, prefix: str) -> None:
        _check(
            0.0 <= self.handover_grace_s <= MAX_HANDOVER_GRACE_S,
            f"[{prefix}].handover_grace_s",
            f"must be between 0 and {MAX_HANDOVER_GRACE_S:g} seconds, not {self.handover_grace_s}",
        )


#: Upper bound on ``[runner].inject_token_delay_ms`` (a minute per token is already absurd).
MAX_INJECT_TOKEN_DELAY_MS = 60_000.0


#: Keys (or whole tables) accepted and validated but not acted on yet (documented in docs/config.md).
#: Those present in a file are listed in ``FileConfig.reserved_keys``: logged at start
#: (``event=config_reserved_keys``) and shown in ``/api/status`` ``config.reserved_keys``.
RESERVED_KEYS = (
    "defaults.model_fit.kv_cache_policy",
    "defaults.model_fit.prefix_cache.payload_mode",
    "defaults.hardware.device",
    "defaults.hardware.direct_io",
    "defaults.hardware.moe_cpu",
    "defaults.hardware.split_mode",
    "defaults.hardware.tensor_split",
    "defaults.throughput.tuning_profile",
    "defaults.throughput.priority",
    "defaults.throughput.numa",
    "defaults.throughput.cpu_affinity",
    "defaults.throughput.slot_prompt_similarity",
    "defaults.skippy",
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
    #: The model ``claude-*`` ids ask for on /v1/messages (any mesh model id, or "mesh"); "": the largest.
    claude_model: str = ""
    #: Image parts given by http(s) URL (docs/vision.md): fetch from hosts that resolve to private,
    #: loopback or link-local addresses too (off: only public addresses, against SSRF).
    image_fetch_private: bool = False
    #: Longest an image URL's download may take, in seconds (0 < s <= 120).
    image_fetch_timeout_s: float = 10.0

    def validate(self, prefix: str) -> None:
        from hydra_node.http.guard import normalize_origin, valid_host_name

        _check(
            self.claude_model == self.claude_model.strip() and not self.claude_model.startswith("claude"),
            f"[{prefix}].claude_model",
            f"must be a mesh model id (or \"mesh\"), not {self.claude_model!r}",
        )
        _check(
            0 < self.image_fetch_timeout_s <= 120,
            f"[{prefix}].image_fetch_timeout_s",
            f"must be more than 0 and at most 120 seconds, not {self.image_fetch_timeout_s!r}",
        )

        for origin in self.cors_origins:
            _check(
                isinstance(origin, str) and (origin == "*" or normalize_origin(origin) == origin),
                f"[{prefix}].cors_origins",
                "each must be \"*\" or an origin as browsers send it "
                f"(lower-case scheme://host[:port], no path or trailing slash), not {origin!r}",
            )
        for host in self.allow_hosts:
            _check(
                isinstance(host, str) and valid_host_name(host),
                f"[{prefix}].allow_hosts",
                f"each must be a host name, optionally with :port, not {host!r}",
            )


@dataclass(frozen=True)
class FileConfig:
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig, metadata={"parse": _scheduler_section})
    defaults: DefaultsSection = field(default_factory=DefaultsSection, metadata={"section": DefaultsSection})
    placement: PlacementSection = field(default_factory=PlacementSection, metadata={"section": PlacementSection})
    runner: RunnerSection = field(default_factory=RunnerSection, metadata={"section": RunnerSection})
    node: NodeSection = field(default_factory=NodeSection, metadata={"section": NodeSection})
    relay: RelaySection = field(default_factory=RelaySection, metadata={"section": RelaySection})
    api: ApiSection = field(default_factory=ApiSection, metadata={"section": ApiSection})
    #: Testing only: fault injection on every mesh link of this node (hydra_node/config/testing.py).
    testing: LinkFaultsSection = field(default_factory=LinkFaultsSection, metadata={"section": LinkFaultsSection})
    moa: MoaSettings = field(
        default_factory=MoaSettings, metadata={"parse": lambda d: parse_moa_section(d, ConfigError)}
    )
    models: ModelsSection = field(
        default_factory=ModelsSection, metadata={"parse": lambda d: parse_models_section(d, ConfigError)}
    )
    rehost: RehostSection = field(default_factory=RehostSection, metadata={"parse": parse_rehost_section})
    #: The reserved keys (:data:`RESERVED_KEYS`) this file sets; computed by the loader, not a table.
    reserved_keys: tuple[str, ...] = field(default=(), metadata={"computed": True})


def parse_config_text(text: str, source: str = "<config>") -> FileConfig:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    return parse_config_data(data)


def parse_config_data(data: Mapping[str, Any]) -> FileConfig:
    """Parsed TOML (one file, or layered files merged: hydra_node/cli/config_sources.py) → typed."""
    known = {f.name: f for f in fields(FileConfig) if not f.metadata.get("computed")}
    kwargs = {}
    for key, value in data.items():
        if key not in known:
            raise ConfigError(f"[{key}]: unknown section (known: {', '.join(sorted(known))})")
        parse = known[key].metadata.get("parse")
        kwargs[key] = parse(value) if parse else _section(known[key].metadata["section"], value, key)
    capacity = one_capacity(data, ConfigError)  # one cache, one capacity (docs/config.md)
    if capacity is not None:
        kwargs["placement"] = dataclasses.replace(
            kwargs.get("placement", PlacementSection()), cache_capacity_gb=capacity
        )
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
    #: ``--mmproj``: (model id, projector) pairs; a local GGUF path once ``prepare_models`` fetched it
    #: (hydra_node/cli/models.py); the node refuses an id it does not serve (docs/vision.md)
    mmproj: tuple[tuple[str, str], ...] = ()
    no_model: bool = False
    #: ``serve --standby``: host nothing, offer the room to re-host a model the mesh lost (chosen first)
    standby: bool = False
    name: str = ""
    api_host: str = "127.0.0.1"
    api_port: int = DEFAULT_API_PORT
    console_port: int = DEFAULT_CONSOLE_PORT
    headless: bool = False
    listen_all: bool = False
    api_key: str | None = None
    file: FileConfig = field(default_factory=FileConfig)
    config_files: tuple[str, ...] = ()  # the TOML files read, in layering order (<home>/config.toml, --config)
    log_format: str = "kv"
    role: str = "host"  # host | worker (--no-model) | client
    max_memory_bytes: int | None = None
    force_split: bool = False  # --split: split hosted models over mesh RPC workers even when they fit
    rpc_worker: bool = True  # --no-rpc-worker: lend no memory to other nodes' models
    split_stall_timeout_s: float = 60.0  # --stall-timeout: a split runner silent this long is killed
    tunnel_port: int = 0  # --tunnel-port: data port of this node's RPC tunnels (0: any free port)
    mesh: MeshSettings | None = None  # None: no mesh at all
    discovery: DiscoverySettings | None = None  # None: no discovery
    #: ``--model NAME|URL`` not yet downloaded while joining a mesh: the node fetches them from a peer
    #: first, then the internet (runtime/fetch/serve_fetch.py), with these ``FetchSettings``.
    fetch_models: tuple[str, ...] = ()
    fetch_settings: Any = None

    def validate(self) -> None:
        for name, port in (("--port", self.api_port), ("--console", self.console_port)):
            if not (0 <= port <= 65535):
                raise ConfigError(f"{name}: must be a TCP port between 0 and 65535, not {port}")
        if self.listen_all and not self.api_key:
            raise ConfigError(
                "--listen-all: refusing to listen on all interfaces without an API key; "
                "pass --api-key KEY or set HYDRA_API_KEY"
            )
        if self.api_key is not None and (len(self.api_key) < 8 or not all("!" <= c <= "~" for c in self.api_key)):
            raise ConfigError("--api-key: must be at least 8 printable ASCII characters without spaces")

    def replace(self, **kw) -> "NodeConfig":
        return dataclasses.replace(self, **kw)
