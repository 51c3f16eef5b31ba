"""``hydra setup [--json] [--force]``: check this machine, say what is missing and how to fix it, and
write a starting config file (``<home>/config.toml``; never over an existing one without --force).

Gathering the facts (:func:`gather_facts`) is the only part that looks at the machine; judging them
(:func:`judge`) is pure, so every verdict and fix text is tested with plain values.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hydra_node.cli.config_backup import replace_with_backup

__all__ = [
    "STARTER_CONFIG",
    "Check",
    "MachineFacts",
    "add_setup_parser",
    "cmd_setup",
    "gather_facts",
    "judge",
    "write_starter_config",
]

#: Oldest Python the package supports (pyproject.toml requires-python).
MIN_PYTHON = (3, 11)
#: Below this much available memory only the bundled 135M model is comfortable.
LOW_MEMORY_BYTES = 2 * 10**9
#: Below this much free disk under the home, downloads of common models (4–20 GB) will not fit.
LOW_DISK_BYTES = 10 * 10**9

STARTER_CONFIG = """\
# hydra-node configuration (written by `hydra setup`; every key: docs/config.md).
# Read from <home>/config.toml at every start; `--config FILE` and flags override it.

[defaults.model_fit]
ctx_size = 4096        # tokens of context per runner (shared by its parallel sequences)

[defaults.throughput]
parallel = {parallel}         # sequences decoded together per model
threads = {threads}          # 0 = every core

[defaults.hardware]
safety_margin_gb = 1.0 # memory placement leaves free
"""


@dataclass(frozen=True)
class MachineFacts:
    python: tuple[int, int, int]
    platform: str
    cores: int
    compiler: str | None
    cmake: str | None
    llama_cpp_version: str | None
    rpc: bool | None  # None: llama-cpp-python missing
    backends: tuple[str, ...] = ()  # ggml backend names with devices (CPU, CUDA, Vulkan, Metal ...)
    gpu_tools: dict = field(default_factory=dict)  # tool → path (nvidia-smi, nvcc, glslc, rocminfo)
    mem_total_bytes: int = 0
    mem_available_bytes: int = 0
    disk_free_bytes: int = 0
    home: str = ""


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "ok" | "warn" | "missing"
    detail: str
    fix: str = ""


def gather_facts(home: Path) -> MachineFacts:
    """Look at the machine (no network, no model load; opening ggml lists its devices)."""
    llama_version = rpc = None
    backends: tuple[str, ...] = ()
    try:
        import llama_cpp

        llama_version = llama_cpp.__version__
        rpc = bool(llama_cpp.llama_supports_rpc())
        if rpc:
            from hydra_node.runtime.rpc.ggml import RpcUnavailable, load

            try:
                backends = tuple(sorted({d.backend for d in load().devices() if d.backend}))
            except RpcUnavailable:
                rpc = False
    except ImportError:
        pass
    from hydra_node.runtime.hosting.meminfo import read_meminfo

    total, avail = read_meminfo()
    probe = home if home.exists() else next((p for p in home.parents if p.exists()), Path("/"))
    return MachineFacts(
        python=(sys.version_info.major, sys.version_info.minor, sys.version_info.micro),
        platform=f"{platform.system()} {platform.machine()}",
        cores=os.cpu_count() or 1,
        compiler=shutil.which("cc") or shutil.which("gcc") or shutil.which("clang"),
        cmake=shutil.which("cmake"),
        llama_cpp_version=llama_version,
        rpc=rpc,
        backends=backends,
        gpu_tools={t: p for t in ("nvidia-smi", "nvcc", "glslc", "rocminfo") if (p := shutil.which(t))},
        mem_total_bytes=total,
        mem_available_bytes=avail,
        disk_free_bytes=shutil.disk_usage(probe).free,
        home=str(home),
    )


def judge(f: MachineFacts) -> list[Check]:
    """The verdicts, each with the command that fixes what is missing."""
    out = []
    py = ".".join(map(str, f.python))
    out.append(
        Check("python", "ok", f"Python {py}")
        if tuple(f.python[:2]) >= MIN_PYTHON
        else Check(
            "python",
            "missing",
            f"Python {py} is older than {'.'.join(map(str, MIN_PYTHON))}",
            "install Python 3.11 or newer (e.g. `sudo apt install python3.11 python3.11-venv`)",
        )
    )
    out.append(
        Check("compiler", "ok", f.compiler)
        if f.compiler
        else Check(
            "compiler",
            "missing",
            "no C/C++ compiler (needed to build llama-cpp-python with RPC)",
            "`sudo apt install build-essential` (Debian/Ubuntu) or `xcode-select --install` (macOS)",
        )
    )
    out.append(
        Check("cmake", "ok", f.cmake)
        if f.cmake
        else Check(
            "cmake",
            "missing",
            "cmake not found (needed to build llama-cpp-python)",
            "`sudo apt install cmake` or `pip install cmake`",
        )
    )
    if f.llama_cpp_version is None:
        out.append(Check("llama-cpp-python", "missing", "not installed", "`make install` (builds it with RPC)"))
    elif not f.rpc:
        out.append(
            Check(
                "rpc",
                "missing",
                f"llama-cpp-python {f.llama_cpp_version} was built without RPC "
                "(splits and lending memory to peers need it; `serve` refuses to start)",
                "`make install` (rebuilds llama-cpp-python with CMAKE_ARGS=-DGGML_RPC=on)",
            )
        )
    else:
        out.append(Check("rpc", "ok", f"llama-cpp-python {f.llama_cpp_version} with RPC"))
    gpus = [b for b in f.backends if b not in ("CPU", "RPC", "BLAS")]
    if gpus:
        out.append(Check("gpu", "ok", f"ggml backends: {', '.join(f.backends)}"))
    elif "nvidia-smi" in f.gpu_tools or "rocminfo" in f.gpu_tools:
        kind = "CUDA" if "nvidia-smi" in f.gpu_tools else "Vulkan"
        make = "GPU=cuda" if kind == "CUDA" else "GPU=vulkan"
        out.append(
            Check(
                "gpu",
                "warn",
                f"a GPU is present but llama-cpp-python has no {kind} backend (it runs on the CPU)",
                f"`make install {make}` (needs {'nvcc' if kind == 'CUDA' else 'glslc'} on PATH)",
            )
        )
    else:
        out.append(Check("gpu", "ok", "no GPU found: models run on the CPU"))
    gb = 1e9
    out.append(
        Check(
            "memory",
            "ok" if f.mem_available_bytes >= LOW_MEMORY_BYTES else "warn",
            f"{f.mem_available_bytes / gb:.1f} GB available of {f.mem_total_bytes / gb:.1f} GB",
            ""
            if f.mem_available_bytes >= LOW_MEMORY_BYTES
            else "only small models fit; join a mesh to split bigger ones (`hydra serve --join TOKEN --split`)",
        )
    )
    out.append(
        Check(
            "disk",
            "ok" if f.disk_free_bytes >= LOW_DISK_BYTES else "warn",
            f"{f.disk_free_bytes / gb:.1f} GB free under {f.home}",
            ""
            if f.disk_free_bytes >= LOW_DISK_BYTES
            else "free space or choose another --home (models are cached under <home>/placement/cache); "
            "set [placement].cache_capacity_gb to bound the cache",
        )
    )
    return out


def write_starter_config(path: Path, facts: MachineFacts, force: bool) -> tuple[bool, Path | None]:
    """Write :data:`STARTER_CONFIG` (atomic; an existing file is kept first in a new backup, never
    over an older one: ``config_backup.py``); (written, backup path). Nothing is written when the
    file exists and not ``force``."""
    if path.exists() and not force:
        return False, None
    text = STARTER_CONFIG.format(parallel=4 if facts.mem_available_bytes >= 8 * 10**9 else 2, threads=0)
    return True, replace_with_backup(path, text)


def add_setup_parser(sub, add_home) -> None:
    s = sub.add_parser(
        "setup",
        help="check this machine and write a starting config file",
        description="Check Python, the compiler, cmake, RPC support in llama-cpp-python, free memory "
        "and disk, and GPU backends; explain what is missing with the command to fix it; "
        "write <home>/config.toml (never over an existing one without --force). "
        "Exit status 1 when something required is missing.",
    )
    s.add_argument("--json", action="store_true", help="print the checks as JSON")
    s.add_argument(
        "--force",
        action="store_true",
        help="overwrite an existing <home>/config.toml (the old one is kept as config.toml.bak, or .bak.N "
        "when that exists)",
    )
    s.add_argument("--no-config", action="store_true", help="only check; write no config file")
    add_home(s)


def cmd_setup(args) -> int:
    from hydra_node.config import default_home

    home = Path(args.home).expanduser() if args.home else default_home()
    facts = gather_facts(home)
    checks = judge(facts)
    config_path = home / "config.toml"
    written, backup = (False, None) if args.no_config else write_starter_config(config_path, facts, args.force)
    missing = [c for c in checks if c.status == "missing"]
    if args.json:
        print(
            json.dumps(
                {
                    "checks": [asdict(c) for c in checks],
                    "facts": asdict(facts),
                    "config": {
                        "path": str(config_path),
                        "written": written,
                        "backup": str(backup) if backup else None,
                        "existed": config_path.exists() and not written,
                    },
                },
                indent=2,
            )
        )
    else:
        for c in checks:
            mark = {"ok": "ok  ", "warn": "warn", "missing": "MISS"}[c.status]
            print(f"[{mark}] {c.name:<17} {c.detail}")
            if c.fix:
                print(f"       fix: {c.fix}")
        if args.no_config:
            pass
        elif written:
            kept = f"; the old one is kept as {backup}" if backup else ""
            print(f"wrote {config_path} (edit it, or tune it with `hydra benchmark tune --apply`){kept}")
        else:
            print(f"kept {config_path} (it exists; --force overwrites it)")
    return 1 if missing else 0
