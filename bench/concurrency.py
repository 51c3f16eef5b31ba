"""Concurrency: hydra-node vs llama-server, side by side, at 1..16 concurrent streaming clients.

Builds `llama-server` once from the llama.cpp source vendored in the sdist of the installed
llama-cpp-python version (cached in ~/.cache/hydra-node/llama-server-<version>/, like the
wheel; not part of `make install`; 5 to 25 minutes on 2 cores, by load; nothing is downloaded
but the sdist itself), then measures, interleaved (the side that goes first alternates each round),
the same bundled model with the same threads and total context at each level:
`hydra-node serve` (parallel slots through a generated `[defaults.throughput] parallel`)
and `llama-server -np P -cb -c CTX`. Each round, N clients each stream one distinct chat
request (`/v1/chat/completions`, `stream: true`, greedy, fixed seed) at once. Reported per
side: aggregate tok/s (completion tokens of a round / its wall time, median over rounds),
TTFT p50/p95, request latency p95, and RSS after the level (the node's process tree: node +
runner children; llama-server's one process). Then the ratios issue 12 asks for, with goals:
aggregate tok/s hydra/llama-server >= 1.0 at every level, TTFT p95 <= 1.2x at 8 and 16
clients, single stream >= 0.95x llama-server -np 1, RSS <= 1.2x; with --mesh also 8 clients
on a node joined to the host (hosting nothing) vs the same clients at the host, >= 0.95.

P (slots) is N at each level unless --parallel fixes it; each slot gets CTX / P of the KV cache
on both sides. If this hydra-node refuses `parallel` > 1, the node runs with its default and
the table says so. Everything else is each side's default.
The binary is linked statically (the wheel links the same code as shared libraries). Everything listens on
127.0.0.1; every request has a timeout; servers are killed on exit.

Run: .venv/bin/python bench/concurrency.py [--levels 1,2,4,8,16] [--rounds 3] [--max-tokens 64]
       [--threads T] [--ctx 4096] [--parallel P] [--only hydra|llama-server] [--mesh]
       [--llama-server PATH] [--build-only] [--gpu-layers N] [--flash-attn on|off|auto]
"""

from __future__ import annotations

import argparse
import http.client
import math
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

from _common import NodeProcess, median, percentile, process_tree_rss, stream_chat

#: A build of llama-server takes 5 to 25 min on 2 cores (23 min measured under load); fail rather than hang.
BUILD_TIMEOUT_S = 3600
DOWNLOAD_TIMEOUT_S = 600
#: The flags of the wheel (Makefile: -DGGML_RPC=on -DGGML_NATIVE=off, Release), plus what a
#: standalone llama-server needs and must not do (no curl, no OpenSSL, no UI download or npm).
CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DGGML_RPC=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",
]


def llama_cpp_version() -> str:
    return metadata.version("llama_cpp_python")


def server_cache_dir(version: str) -> Path:
    return Path.home() / ".cache" / "hydra-node" / f"llama-server-{version}"


def _run_logged(cmd: list[str], log, cwd: Path, timeout_s: float, what: str) -> None:
    """Run ``cmd`` with its output in ``log``, printing cmake's "[ NN%]" progress as it changes."""
    print(f"==> {what}: {' '.join(cmd)}", flush=True)
    log.write(f"\n$ {' '.join(cmd)}\n".encode())
    deadline = time.monotonic() + timeout_s
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    last = None
    try:
        for raw in proc.stdout:
            log.write(raw)
            line = raw.decode(errors="replace")
            if line.startswith("[") and "%]" in line[:8] and line[:7] != last:
                last = line[:7]
                print(f"    {line.strip()[:100]}", flush=True)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} ran past {timeout_s:.0f} s")
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if rc != 0:
        raise RuntimeError(f"{what} failed with exit code {rc}; see {log.name}")


def ensure_llama_server(version: str) -> Path:
    """The cached llama-server for ``version``, built from its sdist the first time."""
    cache = server_cache_dir(version)
    binary = cache / "llama-server"
    if os.access(binary, os.X_OK):
        print(f"llama-server {version}: cached at {binary}")
        return binary
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=cache))
    t0 = time.monotonic()
    try:
        with open(cache / "build.log", "wb") as log:
            _run_logged(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "-q",
                    "--disable-pip-version-check",
                    "--no-binary",
                    ":all:",
                    "--no-deps",
                    "-d",
                    str(work),
                    f"llama-cpp-python=={version}",
                ],
                log,
                work,
                DOWNLOAD_TIMEOUT_S,
                f"downloading the llama-cpp-python {version} sdist",
            )
            sdist = next(work.glob("llama_cpp_python-*.tar.gz"))
            print(f"==> unpacking {sdist.name}", flush=True)
            with tarfile.open(sdist) as tar:
                tar.extractall(work, filter="data")
            src = work / sdist.name.removesuffix(".tar.gz") / "vendor" / "llama.cpp"
            _run_logged(
                ["cmake", "-S", str(src), "-B", str(work / "build"), *CMAKE_FLAGS],
                log,
                work,
                BUILD_TIMEOUT_S,
                "configuring llama.cpp",
            )
            jobs = str(max(1, os.cpu_count() or 1))
            _run_logged(
                ["cmake", "--build", str(work / "build"), "--target", "llama-server", "-j", jobs],
                log,
                work,
                BUILD_TIMEOUT_S,
                "building llama-server (5 to 25 minutes on 2 cores, once)",
            )
        built = work / "build" / "bin" / "llama-server"
        shutil.copy2(built, cache / "llama-server.partial")
        os.replace(cache / "llama-server.partial", binary)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"llama-server {version}: built in {time.monotonic() - t0:.0f} s, cached at {binary}")
    return binary


# --- measuring -----------------------------------------------------------------------------

#: One request of a wave: the slowest waits for every other client's 64 tokens when the
#: server has one slot (16 x 64 tokens at ~60 tok/s on 2 busy cores), with a wide margin.
REQUEST_TIMEOUT_S = 300.0
SERVER_START_TIMEOUT_S = 120.0
SIDES = ("hydra", "llama-server")
TOPICS = [
    "why the sky is blue",
    "how a bicycle stays upright",
    "the history of the printing press",
    "how bread rises",
    "what a compiler does",
    "why leaves change colour",
    "how tides work",
    "what a black hole is",
    "how vaccines train the immune system",
    "why cats purr",
    "how a refrigerator keeps food cold",
    "what makes a good password",
    "how bees make honey",
    "why the ocean is salty",
    "how a rainbow forms",
    "what photosynthesis is",
    "how trains switch tracks",
    "why we dream",
    "how a violin makes sound",
    "what inflation is",
]


def chat_body(model: str, prompt: str, max_tokens: int) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 42,
    }


def prompts_for(level: int, round_no: int, side_no: int) -> list[str]:
    """Distinct prompts for every client and round (and side, where sides share one model)."""
    return [
        f"Question {round_no}.{side_no}.{i}: explain in a few sentences {TOPICS[(round_no * level + i) % len(TOPICS)]}."
        for i in range(level)
    ]


def run_wave(port: int, bodies: list[dict]) -> tuple[float, list[tuple[float, float, int]], list[str]]:
    """All clients at once (a barrier). Returns (wall_s, [(ttft_s, latency_s, tokens)], errors)."""
    barrier = threading.Barrier(len(bodies))

    def client(body):
        barrier.wait(timeout=30)
        t0 = time.perf_counter()
        try:
            return t0, stream_chat(port, body, REQUEST_TIMEOUT_S), None
        except (OSError, RuntimeError, ValueError, http.client.HTTPException) as exc:  # a finding: counted, shown
            return t0, None, f"{type(exc).__name__}: {exc}"[:200]

    with ThreadPoolExecutor(len(bodies)) as ex:
        out = list(ex.map(client, bodies))
    ok = [(t0, r) for t0, r, _ in out if r is not None]
    errors = [e for _, r, e in out if r is None]
    if not ok:
        return float("nan"), [], errors
    wall = max(t0 + r[1] for t0, r in ok) - min(t0 for t0, _ in ok)
    return wall, [r for _, r in ok], errors


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """`llama-server` on 127.0.0.1, ready once /health answers 200; killed by stop()."""

    def __init__(
        self,
        binary: Path,
        model: Path,
        parallel: int,
        ctx: int,
        threads: int,
        log_dir: Path,
        device: tuple[str, ...] = (),
    ):
        self.parallel = self.requested_slots = parallel
        self.port = free_port()
        self.cmd = [
            str(binary),
            "-m",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "-np",
            str(parallel),
            "-cb",
            "-c",
            str(ctx),
            "-t",
            str(threads),
            "-tb",
            str(threads),
            *device,
        ]
        self.log_path = log_dir / f"llama-server-np{parallel}.log"

    def start(self) -> LlamaServer:
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"llama-server exited with {self.proc.returncode}: "
                    f"{self.log_path.read_text(errors='replace')[-2000:]}"
                )
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            try:
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return self
            except OSError:
                pass
            finally:
                conn.close()
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"llama-server not healthy within {SERVER_START_TIMEOUT_S} s")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._log.close()


class HydraServer:
    """`hydra-node serve` (bench/_common.py NodeProcess) with a generated config file."""

    def __init__(
        self, home: Path, parallel: int, ctx: int, threads: int, extra: tuple[str, ...] = (), device_toml: str = ""
    ):
        self.home, self.requested, self.ctx, self.threads, self.extra = home, parallel, ctx, threads, extra
        self.device_toml = device_toml
        self.parallel, self.requested_slots, self.note = parallel, parallel, ""

    def _config(self, parallel: int | None) -> Path:
        cfg = self.home.parent / f"{self.home.name}.toml"
        slots = f"parallel = {parallel}\n" if parallel is not None else ""
        cfg.write_text(
            f"[defaults.throughput]\nthreads = {self.threads}\nthreads_batch = {self.threads}\n{slots}"
            f"[defaults.model_fit]\nctx_size = {self.ctx}\n{self.device_toml}"
        )
        return cfg

    def start(self) -> HydraServer:
        try:
            self.node = NodeProcess(self.home, "--config", str(self._config(self.requested)), *self.extra).start()
        except RuntimeError as exc:
            if self.requested == 1 or "parallel" not in str(exc):
                raise
            refusal = next((line.strip() for line in str(exc).splitlines() if "parallel" in line), str(exc))[:200]
            self.node = NodeProcess(
                self.home.with_name(self.home.name + "-default"), "--config", str(self._config(None)), *self.extra
            ).start()
            from hydra_node.config import ThroughputSection

            self.parallel = ThroughputSection().parallel
            self.note = f"hydra-node refused parallel = {self.requested} ({refusal}); ran with its default"
            print(f"NOTE: {self.note}", flush=True)
        return self

    @property
    def port(self) -> int:
        return self.node.api_port

    @property
    def pid(self) -> int:
        return self.node.proc.pid

    def stop(self) -> None:
        self.node.kill_all()


class Samples:
    """What one side measured at one level: per-round aggregate tok/s, per-request times."""

    def __init__(self):
        self.agg, self.ttft, self.latency, self.errors, self.rss = [], [], [], [], 0

    def add(self, wall: float, results: list[tuple[float, float, int]], errors: list[str]) -> None:
        self.errors += errors
        if results:
            self.agg.append(sum(r[2] for r in results) / wall)
            self.ttft += [r[0] * 1000 for r in results]
            self.latency += [r[1] * 1000 for r in results]

    def row(self) -> dict:
        return {
            "agg": median(self.agg),
            "ttft50": percentile(self.ttft, 50),
            "ttft95": percentile(self.ttft, 95),
            "lat95": percentile(self.latency, 95),
            "rss": self.rss / 2**20,
            "errors": len(self.errors),
        }


def measure(
    servers: dict, level: int, rounds: int, max_tokens: int, model_id: str, level_no: int, shared_model: bool = False
) -> dict:
    """Interleaved rounds at ``level`` clients over ``servers`` {name: server}; RSS after load.
    Each side gets the same prompts, unless the sides share one model (``shared_model``: a
    prefix cache would then favour the side that goes second)."""
    names = list(servers)
    res = {name: Samples() for name in names}
    for name, srv in servers.items():  # warm each side once (model pages, first-request paths)
        run_wave(srv.port, [chat_body(model_id, "Say hello.", 8)])
    for r in range(rounds):
        order = names if (r + level_no) % 2 == 0 else names[::-1]
        for name in order:
            prompts = prompts_for(level, r, names.index(name) if shared_model else 0)
            bodies = [chat_body(model_id, p, max_tokens) for p in prompts]
            res[name].add(*run_wave(servers[name].port, bodies))
    for name, srv in servers.items():
        res[name].rss = process_tree_rss(srv.pid)
        for e in sorted(set(res[name].errors))[:3]:
            print(f"  {name} at {level} clients: error: {e}")
    return {name: s.row() for name, s in res.items()}


def fmt_row(level: int, name: str, slots: int, row: dict) -> str:
    return (
        f"{level:>6} {name:>13} {slots:>5} {row['agg']:>10.1f} {row['ttft50']:>10.0f} {row['ttft95']:>10.0f} "
        f"{row['lat95']:>10.0f} {row['rss']:>8.0f} {row['errors']:>6}"
    )


HEADER = (
    f"{'level':>6} {'side':>13} {'slots':>5} {'agg tok/s':>10} {'TTFT p50':>10} {'TTFT p95':>10} "
    f"{'lat p95':>10} {'RSS MiB':>8} {'errors':>6}   (times in ms)"
)


def ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else float("nan")


def report(table: dict, slots: dict, notes: list[str]) -> None:
    print("\n" + HEADER)
    for level, rows in table.items():
        for name, row in rows.items():
            print(fmt_row(level, name, slots[level][name], row))
    for note in dict.fromkeys(notes):
        print(f"note: {note}")
    both = {lv: rows for lv, rows in table.items() if len(rows) == 2}
    if not both:
        return
    print("\nratios hydra / llama-server:")
    agg = {lv: ratio(r["hydra"]["agg"], r["llama-server"]["agg"]) for lv, r in both.items()}
    print(
        "  aggregate tok/s: "
        + ", ".join(f"{lv} clients {x:.2f}x" for lv, x in agg.items())
        + "   (goal >= 1.0 at every level)"
    )
    ttft = {lv: ratio(r["hydra"]["ttft95"], r["llama-server"]["ttft95"]) for lv, r in both.items() if lv in (8, 16)}
    if ttft:
        print("  TTFT p95: " + ", ".join(f"{lv} clients {x:.2f}x" for lv, x in ttft.items()) + "   (goal <= 1.2)")
    if 1 in both:
        print(f"  single stream (llama-server -np {slots[1]['llama-server']}): {agg[1]:.2f}x   (goal >= 0.95)")
    rss = {lv: ratio(r["hydra"]["rss"], r["llama-server"]["rss"]) for lv, r in both.items()}
    print("  RSS after load: " + ", ".join(f"{lv} clients {x:.2f}x" for lv, x in rss.items()) + "   (goal <= 1.2)")


def llama_server_device_args(args) -> tuple[str, ...]:
    """--gpu-layers / --flash-attn as llama-server flags (nothing when left to each side's default)."""
    out: tuple[str, ...] = ()
    if args.gpu_layers is not None:
        out += ("-ngl", str(args.gpu_layers))
    if args.flash_attn is not None:
        out += ("-fa", args.flash_attn)
    return out


def hydra_device_toml(args) -> str:
    """The same settings as hydra-node config keys (lines appended to [defaults.model_fit])."""
    out = f'flash_attention = "{args.flash_attn}"\n' if args.flash_attn is not None else ""
    if args.gpu_layers is not None:
        out += f"[defaults.hardware]\ngpu_layers = {args.gpu_layers}\n"
    return out


def run_levels(args, binary: Path | None, root: Path) -> None:
    from hydra_node.models import BUNDLED_MODEL_ID, bundled_model_path

    sides = [args.only] if args.only else list(SIDES)
    running: dict[str, object] = {}
    table, slots, notes = {}, {}, []
    try:
        for level_no, level in enumerate(args.levels):
            want = args.parallel or level
            for name in sides:
                srv = running.get(name)
                if srv is not None and (srv.requested_slots == want or getattr(srv, "note", "")):
                    continue  # same slots, or a hydra-node that refuses parallel > 1 (would again)
                if srv is not None:
                    srv.stop()
                print(f"starting {name} with {want} slot(s)", flush=True)
                if name == "hydra":
                    srv = HydraServer(
                        root / f"hydra-p{want}", want, args.ctx, args.threads, device_toml=hydra_device_toml(args)
                    ).start()
                else:
                    srv = LlamaServer(
                        binary,
                        bundled_model_path(),
                        want,
                        args.ctx,
                        args.threads,
                        root,
                        device=llama_server_device_args(args),
                    ).start()
                running[name] = srv
            servers = {name: running[name] for name in sides}
            notes += [s.note for s in servers.values() if getattr(s, "note", "")]
            print(f"measuring {level} concurrent client(s), {args.rounds} round(s)", flush=True)
            table[level] = measure(servers, level, args.rounds, args.max_tokens, BUNDLED_MODEL_ID, level_no)
            slots[level] = {name: s.parallel for name, s in servers.items()}
            for name, row in table[level].items():
                print(fmt_row(level, name, slots[level][name], row), flush=True)
    finally:
        for srv in running.values():
            srv.stop()
    report(table, slots, notes)


def run_mesh(args, root: Path, clients: int = 8) -> None:
    """``clients`` at a node that hosts nothing, joined to the host, vs the same at the host."""
    from hydra_node.models import BUNDLED_MODEL_ID

    want = args.parallel or clients
    host = HydraServer(root / "mesh-host", want, args.ctx, args.threads, device_toml=hydra_device_toml(args)).start()
    peer = None
    try:
        peer = HydraServer(
            root / "mesh-peer", 1, args.ctx, args.threads, ("--no-model", "--join", host.node.invite())
        ).start()
        peer.node.wait_status(
            lambda st: any(p["state"] == "alive" for p in st["peers"]), timeout=60, what="the peer sees the host alive"
        )
        print(f"measuring {clients} clients at the host vs through the mesh, {args.rounds} round(s)", flush=True)
        rows = measure({"at host": host, "via peer": peer}, clients, args.rounds, args.max_tokens, BUNDLED_MODEL_ID, 0)
    finally:
        host.stop()
        if peer is not None:
            peer.stop()
    print("\n" + HEADER.replace("RSS MiB", "RSS* MiB"))
    for name, row in rows.items():
        print(fmt_row(clients, name, host.parallel, row))
    print("(* RSS of the node the clients talk to)" + (f"\nnote: {host.note}" if host.note else ""))
    x = ratio(rows["via peer"]["agg"], rows["at host"]["agg"])
    print(f"mesh: aggregate tok/s via peer / at host at {clients} clients: {x:.2f}x   (goal >= 0.95)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="1,2,4,8,16", help="concurrent clients per level (default 1,2,4,8,16)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per level (default 3)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument(
        "--threads",
        type=int,
        default=max(1, (os.cpu_count() or 2) // 2),
        help="llama.cpp threads on both sides (default: half the cores)",
    )
    ap.add_argument("--ctx", type=int, default=4096, help="total context on both sides (llama-server -c)")
    ap.add_argument(
        "--parallel",
        type=int,
        default=0,
        help="slots on both sides (llama-server -np, hydra [defaults.throughput] parallel); "
        "default: the number of clients at each level",
    )
    ap.add_argument(
        "--gpu-layers",
        type=int,
        metavar="N",
        help="layers offloaded to a GPU on both sides (llama-server -ngl, hydra gpu_layers); default: each side's own",
    )
    ap.add_argument(
        "--flash-attn",
        choices=("on", "off", "auto"),
        help="flash attention on both sides (llama-server -fa, hydra flash_attention); default: each side's own",
    )
    ap.add_argument("--only", choices=SIDES, help="measure one side only (no ratios)")
    ap.add_argument("--mesh", action="store_true", help="also: 8 clients through a joined node vs at the host")
    ap.add_argument("--llama-server", type=Path, metavar="PATH", help="use this binary instead of building one")
    ap.add_argument("--build-only", action="store_true", help="build (or find) the cached llama-server and exit")
    args = ap.parse_args()
    try:
        args.levels = [int(x) for x in args.levels.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--levels must be comma-separated integers, not {args.levels!r}")
    if (
        not args.levels
        or min(args.levels) < 1
        or args.rounds < 1
        or args.max_tokens < 1
        or args.threads < 1
        or args.parallel < 0
        or args.ctx < 128
    ):
        ap.error("levels, rounds, max tokens and threads must be >= 1, --parallel >= 0, --ctx >= 128")
    if args.mesh and args.only == "llama-server":
        ap.error("--mesh measures hydra-node; it cannot go with --only llama-server")
    binary = None
    if args.only != "hydra" or args.build_only:
        binary = args.llama_server or ensure_llama_server(llama_cpp_version())
        if not os.access(binary, os.X_OK):
            ap.error(f"--llama-server {binary}: not an executable file")
    if args.build_only:
        return
    root = Path(tempfile.mkdtemp(prefix="hydra-bench-concurrency-"))
    print(
        f"levels={args.levels} rounds={args.rounds} max_tokens={args.max_tokens} threads={args.threads} "
        f"ctx={args.ctx} slots={args.parallel or 'clients per level'} logs in {root}",
        flush=True,
    )
    run_levels(args, binary, root)
    if args.mesh:
        run_mesh(args, root)


if __name__ == "__main__":
    main()
