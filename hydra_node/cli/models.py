"""Command-line pieces for models: ``serve --split/--no-rpc-worker/--tunnel-port/--stall-timeout``, ``swap``, and
``models [list|pull|rm]`` with ``serve --model NAME|URL`` (the catalogue, downloads, the mesh: docs/models.md)."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING

from hydra_node.cli.client import NodeClient, NodeClientError
from hydra_node.cli.rehost_cmd import add_min_hosts_parser, cmd_min_hosts
from hydra_node.runtime.hosting.service import (
    DEFAULT_SPLIT_STALL_TIMEOUT_S,
    SWAP_WAIT_DEFAULT_S,
)

if TYPE_CHECKING:  # imported where used: the CLI starts without the fetch machinery
    from hydra_node.runtime.fetch import BadModelSource, DownloadError
    from hydra_node.runtime.fetch.transfer import ProgressMeter

#: Bounds accepted for --stall-timeout.
MIN_STALL_TIMEOUT_S = 1.0
MAX_STALL_TIMEOUT_S = 3600.0


def add_split_serve_args(s) -> None:
    s.add_argument(
        "--split",
        action="store_true",
        help="split hosted models over RPC workers of other mesh nodes even when they fit here "
        "(without it, a model is split only when it does not fit --max-memory / free memory)",
    )
    s.add_argument(
        "--no-rpc-worker",
        action="store_true",
        help="run no llama.cpp RPC worker: lend no memory to other nodes' split models",
    )
    s.add_argument(
        "--tunnel-port",
        type=int,
        default=0,
        metavar="PORT",
        help="data port of this node's RPC tunnels (default 0: any free port; binds --mesh-host). "
        "Open it next to the mesh port for fast splits; when coordinators cannot reach it, "
        "tunnel bytes ride the mesh link instead (slower)",
    )
    s.add_argument(
        "--stall-timeout",
        type=float,
        default=DEFAULT_SPLIT_STALL_TIMEOUT_S,
        metavar="S",
        help="a split model's runner that produces nothing for S seconds during a request is killed "
        f"and replanned; the request gets an error (default {DEFAULT_SPLIT_STALL_TIMEOUT_S:g})",
    )


def split_config_from_args(args, error) -> dict:
    """NodeConfig fields from the flags above (``error(msg)`` raises the CLI's config error)."""
    if args.command != "serve":
        return {"rpc_worker": False}
    if not MIN_STALL_TIMEOUT_S <= args.stall_timeout <= MAX_STALL_TIMEOUT_S:
        raise error(f"--stall-timeout: must be between {MIN_STALL_TIMEOUT_S:g} and {MAX_STALL_TIMEOUT_S:g} s")
    if not 0 <= args.tunnel_port <= 65535:
        raise error(f"--tunnel-port: must be a TCP port between 0 and 65535, not {args.tunnel_port}")
    return {
        "force_split": args.split,
        "rpc_worker": not args.no_rpc_worker,
        "split_stall_timeout_s": float(args.stall_timeout),
        "tunnel_port": args.tunnel_port,
    }


def add_swap_parser(sub, add_home) -> None:
    sw = sub.add_parser(
        "swap",
        help="load a model on the running node (and unload the others)",
        description="Hot swap: the running node (found through --home or --console) loads MODEL "
        "(a GGUF path, ID=PATH, the bundled id, or a catalogue name, hf:// or https:// "
        "reference: fetched first from mesh peers, else downloaded), waits until it is ready, then "
        "unloads its other models unless --keep. RPC workers stay up.",
    )
    sw.add_argument("model", metavar="MODEL")
    sw.add_argument(
        "--mmproj",
        metavar="PROJECTOR",
        default=None,
        help="load MODEL with this multimodal projector (a projector GGUF file, hf://, https:// or a catalogue "
        "name: fetched first; docs/vision.md); a catalogue MODEL that lists one gets it without this flag",
    )
    sw.add_argument("--keep", action="store_true", help="keep the models already loaded")
    sw.add_argument("--split", action="store_true", help="split MODEL over mesh RPC workers even if it fits")
    sw.add_argument("--timeout", type=float, default=SWAP_WAIT_DEFAULT_S, help="seconds to wait for the load")
    sw.add_argument("--console", type=int, default=None, metavar="PORT", help="management port of the node")
    add_home(sw)


#: Bounds on the swap's other requests (listing the models, one unload).
LIST_TIMEOUT_S = 10.0
UNLOAD_TIMEOUT_S = 30.0


def fetch_failed(exc: BadModelSource | DownloadError) -> int:
    """One line on stderr for a model that could not be fetched; the exit code (2: a bad name or URL, 1: the download)."""
    from hydra_node.runtime.fetch import BadModelSource

    if isinstance(exc, BadModelSource):
        print(f"hydra-node: {exc}", file=sys.stderr)
        return 2
    print(f"hydra-node: {exc.code}: {exc}", file=sys.stderr)
    return 1


def cmd_swap(args, client: NodeClient, settings=None) -> int:
    """``settings`` (:func:`fetch_settings`): a catalogue name or URL is pulled first (mesh peers through
    the node, else the internet) and loaded as ``ID=PATH``."""
    from hydra_node.runtime.fetch import BadModelSource, DownloadError, needs_fetch

    from hydra_node.models import ModelNotFound
    from hydra_node.runtime.fetch.fetcher import catalogue_projector

    model = args.model
    projector = getattr(args, "mmproj", None) or catalogue_projector(model)
    try:
        if settings is not None and needs_fetch(model):
            rec = pull_model(model, settings, client)
            model = f"{rec.model_id}={rec.path(settings.cache_dir)}"
        mmproj = None if projector is None else _local_projector(projector, settings)
    except (BadModelSource, DownloadError) as exc:
        return fetch_failed(exc)
    except ModelNotFound as exc:  # (BadProjector)
        print(f"hydra-node: {exc}", file=sys.stderr)
        return 2
    try:
        before = client.get("/api/runtime/models", timeout=LIST_TIMEOUT_S)["models"]
        body = {"model": model, "wait": True, "timeout_s": args.timeout}
        if mmproj is not None:
            body["mmproj"] = mmproj
        if args.split:
            body["split"] = True
        loaded = client.post("/api/runtime/models", body, timeout=args.timeout + 10)
        print(f"loaded {loaded['model']} ({'split' if loaded['split'] else 'local'}, state {loaded['state']})")
        if not args.keep:
            for model_id in before:
                if model_id != loaded["model"]:
                    client.delete(f"/api/runtime/models/{client.quote(model_id)}", timeout=UNLOAD_TIMEOUT_S)
                    print(f"unloaded {model_id}")
    except NodeClientError as exc:
        print(f"hydra-node: {exc}", file=sys.stderr)
        return 1
    return 0


def _local_projector(ref: str, settings) -> str:
    """The projector ``ref`` as a checked local path: a file as given, else fetched (``settings``; the
    cache, else downloaded). BadProjector, BadModelSource or DownloadError otherwise."""
    from pathlib import Path

    from hydra_node.models import resolve_mmproj
    from hydra_node.runtime.fetch.fetcher import ensure_projector

    if Path(ref).expanduser().is_file() or settings is None or not _remote_projector(ref):
        return str(resolve_mmproj(ref))
    progress = StderrProgress(f"downloading the projector {ref}")
    local = ensure_projector(ref, settings, progress=progress)
    if local.source != "cache":
        progress.finish()
    return str(resolve_mmproj(local.path, flag=f"--mmproj {ref}: the fetched file"))


# ---- `hydra models`: the catalogue, the local cache, the mesh; pull and rm (docs/models.md) --------------

#: Seconds between progress lines when stderr is not a terminal (a log file gets a line, not a flood).
PROGRESS_LOG_EVERY_S = 10.0
#: Seconds between redraws of the progress bar on a terminal.
PROGRESS_REDRAW_S = 0.2
#: How long `models pull` waits for the running node to fetch from peers (a big model on a LAN).
PEER_FETCH_WAIT_S = 6 * 3600.0
#: How long `models` waits for the running node's status.
STATUS_TIMEOUT_S = 3.0


class StderrProgress:
    """Draws the download progress bar (rate, ETA) on stderr: redrawn in place on a terminal, a line
    every PROGRESS_LOG_EVERY_S otherwise."""

    def __init__(self, label: str, stream=None, clock=None) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.clock = clock or time.monotonic
        self.tty = self.stream.isatty()
        self._last = float("-inf")
        self._meter: ProgressMeter | None = None

    def __call__(self, meter) -> None:
        self._meter = meter
        now = self.clock()
        if now - self._last >= (PROGRESS_REDRAW_S if self.tty else PROGRESS_LOG_EVERY_S):
            self._last = now
            self._draw()

    def _draw(self) -> None:
        assert self._meter is not None  # drawn once a meter came
        line = self._meter.line(self.label)
        self.stream.write(f"\r{line}\x1b[K" if self.tty else f"{line}\n")
        self.stream.flush()

    def finish(self) -> None:
        if self._meter is not None:
            self._draw()
            if self.tty:
                self.stream.write("\n")


def add_models_parser(sub, add_home) -> None:
    import argparse

    m = sub.add_parser(
        "models",
        help="list, download (pull) and remove models: the catalogue, the local cache, the mesh",
        description="Without a subcommand: list the built-in catalogue, the models downloaded under "
        "the node's one cache, <home>/placement/cache (sizes, sha256) and, when a node runs with this home, what the "
        "mesh hosts. `pull NAME|hf://OWNER/REPO[@REV]/FILE|URL` downloads one (resumable, "
        "sha256-verified; from mesh peers first when a node runs); `rm NAME` deletes one. "
        "`serve --model NAME` pulls on first use. See docs/models.md.",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    common.add_argument(
        "--console",
        type=int,
        default=argparse.SUPPRESS,
        metavar="PORT",
        help="management port of the running node (default: from --home)",
    )
    common.add_argument(
        "--home",
        metavar="DIR",
        default=argparse.SUPPRESS,
        help="state directory holding models/ (default: $HYDRA_HOME or ~/.hydra)",
    )
    m.add_argument("--json", action="store_true", help="print JSON")
    m.add_argument("--console", type=int, default=None, metavar="PORT", help="management port of the running node")
    add_home(m)
    msub = m.add_subparsers(dest="models_command", metavar="SUBCOMMAND")
    msub.add_parser("list", parents=[common], help="the catalogue, the local cache and the mesh (the default)")
    p = msub.add_parser("pull", parents=[common], help="download a model into the cache (verified, resumable)")
    p.add_argument("model", metavar="NAME_OR_URL")
    p.add_argument("--force", action="store_true", help="download again even when cached")
    p.add_argument("--keep", action="store_true", help="never evict it to respect [placement] cache_capacity_gb")
    p.add_argument("--no-peers", action="store_true", help="do not ask mesh peers first; go to the internet")
    p.add_argument(
        "--sha256",
        metavar="HEX",
        default=None,
        help="the sha256 the file must have (64 hex digits, e.g. from the publisher): checked before the "
        "file is stored, so the pinned digest is known rather than whatever the first download held",
    )
    add_min_hosts_parser(msub, common)  # models min-hosts [MODEL N] (cli/rehost_cmd.py)
    r = msub.add_parser("rm", parents=[common], help="delete a downloaded model (and any partial download)")
    r.add_argument("model", metavar="NAME")
    r.add_argument(
        "--force", action="store_true", help="delete it even while the running node with this home serves it"
    )


def fetch_settings(home, file_cfg, environ):
    """Where models are cached and fetched from: the node's one cache (``<home>/placement/cache``,
    ``[placement] cache_capacity_gb``; ``<home>/models`` of the previous generation moved in),
    ``[models]``, and the Hub endpoint and token from ``environ`` (``HF_ENDPOINT``, ``HF_TOKEN``:
    the Hugging Face tools' own variables)."""
    from hydra_node.runtime.artifacts.local_cache import cache_root
    from hydra_node.runtime.fetch import FetchSettings
    from hydra_node.runtime.fetch.catalogue import DEFAULT_HUB
    from hydra_node.runtime.fetch.settings import models_settings

    capacity_gb = getattr(getattr(file_cfg, "placement", None), "cache_capacity_gb", 0.0)
    return FetchSettings(
        cache_dir=cache_root(home),
        hub=environ.get("HF_ENDPOINT") or DEFAULT_HUB,
        token=environ.get("HF_TOKEN") or None,
        models=models_settings(file_cfg),
        capacity_bytes=int(capacity_gb * 1e9),
        old_models_dir=home / "models",
    )


# ---- `serve --mmproj`: a model served with its multimodal projector (docs/vision.md) -----------------


def serve_model_id(ref: str) -> str:
    """The id a ``--model`` value is served under, without touching a file or the network: NAME of
    ``placement:NAME``, the bundled id, a catalogue name, the ID of ``ID=PATH|URL``, else the file's stem
    (as :func:`hydra_node.models.resolve_model` and the catalogue name them). BadModelSource for a
    remote reference that names no file."""
    from pathlib import Path

    from hydra_node.models import BUNDLED_MODEL_ID
    from hydra_node.runtime.fetch import load_catalogue, needs_fetch
    from hydra_node.runtime.fetch.catalogue import resolve_remote

    if ref.startswith("placement:"):
        return ref[len("placement:") :]
    if ref in (BUNDLED_MODEL_ID, "default", "bundled"):
        return BUNDLED_MODEL_ID
    catalogue = load_catalogue()
    if needs_fetch(ref, catalogue) or ref in catalogue:
        return resolve_remote(ref, catalogue).model_id
    if "=" in ref and not Path(ref).exists():
        return ref.split("=", 1)[0]
    name = Path(ref).expanduser().name
    return name[: -len(".gguf")] if name.endswith(".gguf") else name


def _split_projector(value: str) -> tuple[str | None, str]:
    """``ID=PROJECTOR`` → (ID, PROJECTOR); a bare PROJECTOR (a path that exists with ``=`` in it
    included) → (None, PROJECTOR)."""
    from pathlib import Path

    if "=" in value.split("://", 1)[0] and not Path(value).expanduser().exists():
        model_id, ref = value.split("=", 1)
        return model_id, ref
    return None, value


def pair_projectors(models, values, error) -> tuple[tuple[str, str], ...]:
    """``--mmproj`` values paired with the ``--model`` values ``models``: (model id, projector) each.
    A bare PROJECTOR pairs with the one model (refused with several: name the model), ``ID=PROJECTOR``
    with the model served as ID (refused when no --model is served as ID); a model gets at most one.
    ``error(msg)`` is raised (the CLI's ConfigError) with the fix in the message."""
    from hydra_node.runtime.fetch import BadModelSource

    if not values:
        return ()
    if not models:
        raise error(
            f"--mmproj {values[0]}: a projector is served beside a model, and no --model is given: add one, "
            f"e.g. --model /models/x.gguf --mmproj {values[0]} (the bundled model: --model SmolLM2-135M-Instruct-Q4_1)"
        )
    try:
        ids = [serve_model_id(m) for m in models]
    except BadModelSource as exc:
        raise error(str(exc)) from None
    out: dict[str, str] = {}
    for value in values:
        model_id, ref = _split_projector(value)
        if not ref:
            raise error(f"--mmproj {value}: no projector after the '='")
        if model_id is None:
            if len(ids) != 1:
                raise error(
                    f"--mmproj {value}: {len(ids)} models are served; name the one it belongs to: "
                    f"--mmproj ID={value} (ids: {', '.join(ids)})"
                )
            model_id = ids[0]
        elif model_id not in ids:
            raise error(
                f"--mmproj {value}: no --model is served as {model_id!r} (ids: {', '.join(ids)}); "
                f"--mmproj ID=PROJECTOR names a model by its id"
            )
        if model_id in out:
            raise error(f"--mmproj: model {model_id!r} is given two projectors ({out[model_id]}, {ref}); keep one")
        out[model_id] = ref
    return tuple(out.items())


def _prepare_projectors(cfg, settings) -> tuple[tuple[str, str], ...] | None:
    """Each projector of ``cfg.mmproj`` and of the catalogue models (``cfg.models``) that list one, as a
    checked local file: a path as given, else fetched (cache, else downloaded; verified). Always before
    the node starts, also with --join (a projector is small next to its model). None (after one error
    line) on failure."""
    from hydra_node.models import ModelNotFound
    from hydra_node.runtime.fetch import BadModelSource, DownloadError
    from hydra_node.runtime.fetch.fetcher import catalogue_projector

    wanted = dict(cfg.mmproj)
    for ref in cfg.models:
        name = catalogue_projector(ref)  # (a catalogue name is served under itself)
        if name is not None and name not in wanted:  # an explicit --mmproj for it wins
            wanted[name] = name
    out = []
    for model_id, ref in wanted.items():
        try:
            path = _local_projector(ref, settings)
        except DownloadError as exc:
            print(f"hydra-node: {exc.code}: --mmproj {ref}: {exc}", file=sys.stderr)
            return None
        except (BadModelSource, ModelNotFound) as exc:
            print(f"hydra-node: {exc}", file=sys.stderr)
            return None
        out.append((model_id, path))
    return tuple(out)


def _remote_projector(ref: str) -> bool:
    from hydra_node.runtime.fetch import load_catalogue
    from hydra_node.runtime.fetch.catalogue import is_remote_ref

    return is_remote_ref(ref) or ref in load_catalogue()


def prepare_models(cfg, environ):
    """``serve --model NAME|URL``: make sure each such model is downloaded (progress on stderr) and
    hand the node ``ID=PATH``; other values pass unchanged. Projectors (``--mmproj``, and a catalogue
    model's own) are fetched too and handed over as checked local paths. None (after one error line)
    on failure."""
    from pathlib import Path

    from hydra_node.models import BUNDLED_MODEL_ID, ModelNotFound
    from hydra_node.runtime.fetch import (
        BadModelSource,
        DownloadError,
        ensure_local,
        load_catalogue,
        needs_fetch,
    )

    settings = fetch_settings(cfg.home, cfg.file, environ)
    joining = cfg.mesh is not None and bool(cfg.mesh.join)
    out, deferred = [], []
    projectors = _prepare_projectors(cfg, settings)
    if projectors is None:
        return None
    for ref in cfg.models:
        if ref.startswith("placement:"):  # materialised by the node at start (docs/placement.md)
            out.append(ref)
            continue
        if not needs_fetch(ref):
            if (
                "/" not in ref
                and "=" not in ref
                and not ref.endswith(".gguf")
                and not Path(ref).exists()
                and ref not in (BUNDLED_MODEL_ID, "default", "bundled")
            ):  # a name, but no known one
                names = ", ".join(sorted(load_catalogue()))
                print(
                    f"hydra-node: model {ref!r:.80} is not in the catalogue ({names}), not a file, and not "
                    f"hf://OWNER/REPO[@REV]/FILE or an https:// URL (see `hydra models`)",
                    file=sys.stderr,
                )
                return None
            out.append(ref)
            continue
        if joining and not _held_locally(ref, settings):  # a peer may hold it: the node asks them first
            deferred.append(ref)
            continue
        progress = StderrProgress(f"downloading {ref}")
        try:
            local = ensure_local(ref, settings, progress=progress)
        except DownloadError as exc:
            print(f"hydra-node: {exc.code}: {exc}", file=sys.stderr)
            return None
        except (BadModelSource, ModelNotFound) as exc:
            print(f"hydra-node: {exc}", file=sys.stderr)
            return None
        if local.source not in ("cache", "bundled"):
            progress.finish()
        out.append(f"{local.model_id}={local.path}")
    return cfg.replace(models=tuple(out), fetch_models=tuple(deferred), fetch_settings=settings, mmproj=projectors)


def _held_locally(ref, settings) -> bool:
    """True when ``ref`` needs no transfer: the bundled model, or already in the cache (a bad
    reference counts as held: the download path reports it)."""
    from hydra_node.runtime.fetch import BadModelSource, load_catalogue
    from hydra_node.runtime.fetch.fetcher import open_cache, remote_for

    entry = load_catalogue().get(ref)
    if entry is not None and entry.bundled:
        return True
    try:
        remote = remote_for(ref, settings)
    except BadModelSource:
        return True
    return open_cache(settings).lookup(remote.model_id) is not None


def cmd_models(args, home, file_cfg, client: NodeClient, environ) -> int:
    from hydra_node.runtime.fetch import BadModelSource, DownloadError

    settings = fetch_settings(home, file_cfg, environ)
    action = getattr(args, "models_command", None) or "list"
    try:
        if action == "list":
            return _list(args, settings, client)
        if action == "rm":
            return _rm(args, settings, client)
        if action == "min-hosts":
            return cmd_min_hosts(args, client)
        return _pull(args, settings, client)
    except (BadModelSource, DownloadError) as exc:
        return fetch_failed(exc)


def _mesh_models(client: NodeClient) -> dict | None:
    """model id → node ids hosting it, from the running node's /api/status (None: no node running)."""
    try:
        st = client.get("/api/status", timeout=STATUS_TIMEOUT_S)
    except NodeClientError:
        return None
    hosts: dict[str, list[str]] = {m: [st["node_id"]] for m in st.get("serving_models", [])}
    for peer in st.get("peers", []):
        for model in peer.get("models", []):
            hosts.setdefault(model, []).append(peer.get("id"))
    return hosts


def _list(args, settings, client: NodeClient) -> int:
    from hydra_node.runtime.fetch import load_catalogue
    from hydra_node.runtime.fetch.fetcher import open_cache

    cat = load_catalogue()
    cache = open_cache(settings)
    local = cache.records()
    mesh = _mesh_models(client)
    if args.json:
        print(
            json.dumps(
                {
                    "catalogue": [
                        {
                            "name": e.name,
                            "sources": list(e.sources),
                            "file": e.file,
                            "size_bytes": e.size_bytes,
                            "approx_gb": e.approx_gb,
                            "sha256": e.sha256,
                            "licence": e.licence,
                            "quant": e.quant,
                            "context": e.context,
                            "bundled": e.bundled,
                            "mmproj": None
                            if not e.has_projector
                            else {
                                "id": e.projector_id,
                                "sources": list(e.mmproj_sources),
                                "file": e.mmproj_file,
                                "size_bytes": e.mmproj_size_bytes,
                                "approx_gb": e.mmproj_approx_gb,
                                "sha256": e.mmproj_sha256,
                            },
                        }
                        for e in cat.values()
                    ],
                    "local": [
                        {
                            "model": r.model_id,
                            "path": str(r.path(cache.root)),
                            "size_bytes": r.size_bytes,
                            "sha256": r.sha256,
                            "sha256_origin": r.sha256_origin,
                            "source": r.source,
                            "keep": r.keep,
                            "last_used": r.last_used,
                        }
                        for r in local.values()
                    ],
                    "cache": {
                        "dir": str(cache.root),
                        "used_bytes": cache.used_bytes(),
                        "limit_bytes": cache.capacity_bytes or None,
                    },
                    "mesh": mesh,
                },
                indent=2,
            )
        )
        return 0
    print("CATALOGUE (hydra serve --model NAME; hydra models pull NAME)")
    for e in cat.values():
        state = "bundled" if e.bundled else ("downloaded" if e.name in local else "")
        vision = "+ projector (images)" if e.has_projector else ""
        print(f"  {e.name:<28} {e.quant:<7} {e.display_size:>10}  {e.licence:<11} {state} {vision}".rstrip())
    limit = cache.capacity_bytes
    print(
        f"LOCAL ({cache.root}: {cache.used_bytes() / 1e9:.2f} GB"
        + (f" of {limit / 1e9:.2f} GB)" if limit else ", no limit)")
    )
    for r in sorted(local.values(), key=lambda r: r.model_id):
        print(
            f"  {r.model_id:<28} {r.size_bytes / 1e9:7.2f} GB  sha256 {r.sha256[:12]}… ({provenance(r.sha256_origin)})"
            + ("  kept" if r.keep else "")
        )
    if not local:
        print("  (none downloaded)")
    if mesh is None:
        print("MESH: no node running with this home (start one with `hydra serve`)")
    else:
        print("MESH (hosted now)")
        for model, hosts in sorted(mesh.items()):
            print(f"  {model:<28} {len(hosts)} node(s)")
    return 0


def provenance(origin: str) -> str:
    """Who vouches for a cached model's sha256, in words (``hydra models``)."""
    if origin.startswith("peer:"):
        return f"vouched for by peer {origin[5:17]} only"
    return {
        "catalogue": "catalogue",
        "given": "--sha256 given",
        "hub-lfs": "Hub LFS sha256",
        "pinned": "pinned on first download",
    }.get(origin, origin)


def _served_here(client: NodeClient) -> list[str]:
    """The models the running node with this home serves (none when no node runs)."""
    try:
        return list(client.get("/api/status", timeout=STATUS_TIMEOUT_S).get("serving_models", []))
    except NodeClientError:
        return []


def _rm(args, settings, client: NodeClient) -> int:
    from hydra_node.runtime.fetch.fetcher import open_cache

    if not args.force and args.model in _served_here(client):
        print(
            f"hydra-node: {args.model!r} is served by the running node with this home; unload it first "
            f"(`hydra swap` another model) or delete it anyway with `hydra models rm {args.model} --force`",
            file=sys.stderr,
        )
        return 1
    if not open_cache(settings).remove(args.model):
        print(f"hydra-node: {args.model!r} is not downloaded (see `hydra models`)", file=sys.stderr)
        return 1
    print(json.dumps({"removed": args.model}) if args.json else f"removed {args.model}")
    return 0


def _pull(args, settings, client: NodeClient) -> int:
    from hydra_node.runtime.fetch import needs_fetch
    from hydra_node.runtime.fetch.catalogue import with_sha256
    from hydra_node.runtime.fetch.fetcher import remote_for

    remote = remote_for(args.model, settings)  # BadModelSource for a name that is in no catalogue
    if args.sha256 is not None:
        with_sha256(remote, args.sha256)  # a malformed digest, or one contradicting the catalogue's: refused
    if not needs_fetch(args.model) and not args.force:
        print(
            f"{args.model} is bundled with hydra-node: nothing to download (--force downloads it anyway)",
            file=sys.stderr if args.json else sys.stdout,
        )
        return 0
    rec = pull_model(
        args.model, settings, client, force=args.force, keep=args.keep, peers=not args.no_peers, sha256=args.sha256
    )
    from hydra_node.runtime.fetch.fetcher import catalogue_projector

    if catalogue_projector(args.model) is not None:  # a vision entry: its projector comes with it
        from hydra_node.models import ModelNotFound

        try:
            projector = _local_projector(args.model, settings)
        except ModelNotFound as exc:  # (BadProjector: the fetched file is none)
            print(f"hydra-node: {exc}", file=sys.stderr)
            return 1
        print(f"projector of {rec.model_id}: {projector}", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(
            json.dumps(
                {
                    "model": rec.model_id,
                    "path": str(rec.path(settings.cache_dir)),
                    "size_bytes": rec.size_bytes,
                    "sha256": rec.sha256,
                    "sha256_origin": rec.sha256_origin,
                    "source": rec.source,
                    "keep": rec.keep,
                },
                indent=2,
            )
        )
    else:
        print(f"{rec.model_id}\t{rec.size_bytes / 1e9:.2f} GB\tsha256 {rec.sha256}\t{rec.path(settings.cache_dir)}")
    return 0


def pull_model(
    ref: str,
    settings,
    client: NodeClient,
    *,
    force: bool = False,
    keep: bool = False,
    peers: bool = True,
    sha256: str | None = None,
):
    """The cache record of ``ref``: cached already, else from mesh peers through the running node
    (when one runs and ``[models].peer_fetch``), else downloaded here with a progress bar. ``sha256``:
    the digest the file must have (``pull --sha256``), checked before the file is stored."""
    from hydra_node.runtime.fetch import ensure_local
    from hydra_node.runtime.fetch.catalogue import with_sha256
    from hydra_node.runtime.fetch.errors import ChecksumMismatch
    from hydra_node.runtime.fetch.fetcher import open_cache, remote_for

    remote = remote_for(ref, settings)
    if sha256 is not None:
        remote = with_sha256(remote, sha256)  # BadModelSource for a malformed or contradicting digest
    cache = open_cache(settings)
    held = cache.lookup(remote.model_id)
    if held is not None and remote.sha256 is not None and held.sha256 != remote.sha256:
        raise ChecksumMismatch(
            f"{remote.model_id}: the cached copy has sha256 {held.sha256}, not {remote.sha256}; remove it "
            f"with `hydra models rm {remote.model_id}` and pull again"
        )
    mesh = _mesh_models(client)
    if held is None or force:
        if not (settings.models.peer_fetch and peers and mesh is not None and _pull_from_peers(ref, client, sha256)):
            progress = StderrProgress(f"downloading {remote.model_id}")
            ensure_local(ref, settings, in_use=frozenset(mesh or ()), progress=progress, force=force, sha256=sha256)
            progress.finish()
    if keep:
        cache.set_keep(remote.model_id, True)
    return cache.lookup(remote.model_id)


def _pull_from_peers(ref: str, client: NodeClient, sha256: str | None = None) -> bool:
    """Ask the running node to fetch the model from a mesh peer (one holding ``sha256`` when given);
    False when no peer could (the reason is printed), so the caller goes to the internet."""
    print(f"asking mesh peers for {ref} ...", file=sys.stderr)
    body = {"model": ref} if sha256 is None else {"model": ref, "sha256": sha256}
    try:
        got = client.post("/api/models/fetch", body, timeout=PEER_FETCH_WAIT_S)
    except NodeClientError as exc:
        print(f"hydra-node: from the mesh: {exc}; downloading instead", file=sys.stderr)
        return False
    print(
        f"fetched {got['model']} from {got['source']} ({got['size_bytes'] / 1e9:.2f} GB, sha256 verified)",
        file=sys.stderr,
    )
    return True
