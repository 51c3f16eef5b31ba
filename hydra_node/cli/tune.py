"""``hydra-node benchmark tune``: measure runtime profiles of a model on this machine, recommend one,
and with ``--apply`` write it into the default config file (docs/tuning.md).

The axes come from the flags (comma-separated values); an axis not given is the current
config's value (flash attention and ``ubatch`` are varied by default, see :func:`axes_from_args`).
The policy is pure (``hydra_node/runtime/tuning/plan.py``), the sweep runs each candidate in
the node's own runner child (``cli/tune_sweep.py``), and ``--apply`` edits the file with
``tomlkit`` (:func:`set_keys`), keeping comments, layout and every other key, after a backup.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, MutableMapping
from functools import partial
from pathlib import Path
from typing import Any

import tomlkit

from hydra_node.cli.config_backup import replace_with_backup
from hydra_node.cli.config_sources import default_config_path, load_layered
from hydra_node.cli.tune_sweep import Draft, SweepSettings, run_sweep
from hydra_node.config import ConfigError, FileConfig, default_home, parse_config_text
from hydra_node.runtime.tuning.plan import Candidate, Outcome, TuneAxes, candidate_grid, eta_s, progress_line, recommend
from hydra_node.runtime.tuning.trial import TrialSettings

__all__ = [
    "DEFAULT_BUDGET_S",
    "DEFAULT_TOLERANCE_PCT",
    "add_tune_parser",
    "apply_profile",
    "axes_from_args",
    "cmd_benchmark",
    "set_keys",
]

#: ``--budget`` default: a few minutes.
DEFAULT_BUDGET_S = 180.0
#: ``--throughput-tolerance-pct`` default: profiles this close to the fastest count as equally fast.
DEFAULT_TOLERANCE_PCT = 5.0
_SWITCH = {"auto": "auto", "on": "on", "true": "on", "off": "off", "false": "off"}
_BOOL = {"on": True, "true": True, "off": False, "false": False}


def add_tune_parser(sub, add_home) -> None:
    b = sub.add_parser("benchmark", help="measure this machine: `benchmark tune` finds the fastest runtime profile")
    bsub = b.add_subparsers(dest="benchmark_command", metavar="SUBCOMMAND", required=True)
    t = bsub.add_parser(
        "tune",
        help="sweep runtime profiles of a model and recommend (and --apply) the fastest",
        description="Each candidate profile runs in its own model runner child; a fixed prompt set measures "
        "generation tok/s, prompt-processing tok/s and time to first token. The recommendation is "
        "the fastest profile, preferring lower memory among those within the tolerance. Lists are "
        "comma-separated; an option not given keeps the config's value (docs/tuning.md).",
    )
    t.add_argument("--model", default=None, metavar="PATH_OR_ID", help="the model to tune (default: the bundled one)")
    t.add_argument("--config", metavar="FILE", help="config file layered over <home>/config.toml (the base profile)")
    t.add_argument("--ctx-sizes", metavar="N,N", help="[defaults.model_fit].ctx_size values")
    t.add_argument("--batch-sizes", metavar="N,N", help="[defaults.model_fit].batch values")
    t.add_argument(
        "--ubatch-sizes",
        metavar="N,N",
        help="[defaults.model_fit].ubatch values (default: the config's, /2 and /4; above batch skipped)",
    )
    t.add_argument("--mmap-values", metavar="V,V", help="[defaults.hardware].mmap values: auto,true,false")
    t.add_argument("--mlock-values", metavar="V,V", help="[defaults.hardware].mlock values: true,false")
    t.add_argument(
        "--flash-attention",
        metavar="V,V",
        help="[defaults.model_fit].flash_attention values: auto,on,off (default: the config's and off)",
    )
    t.add_argument("--threads", metavar="N,N", help="[defaults.throughput].threads values (0 = llama.cpp's default)")
    t.add_argument(
        "--parallel", metavar="N,N", help="[defaults.throughput].parallel values (default: the config's and 1)"
    )
    t.add_argument("--draft", metavar="MODEL", help="evaluate speculative decoding with this local draft model")
    t.add_argument(
        "--draft-max-tokens",
        metavar="N,N",
        help="[defaults.speculative].draft_max_tokens values (needs a draft: --draft or the config's)",
    )
    t.add_argument(
        "--throughput-tolerance-pct",
        type=float,
        default=DEFAULT_TOLERANCE_PCT,
        metavar="PCT",
        help=f"profiles within PCT %% of the fastest count as fast; the least memory wins among them "
        f"(default {DEFAULT_TOLERANCE_PCT:g})",
    )
    t.add_argument(
        "--budget",
        type=float,
        default=DEFAULT_BUDGET_S,
        metavar="SECONDS",
        help=f"time for the whole sweep (default {DEFAULT_BUDGET_S:g}); the baseline always finishes",
    )
    t.add_argument("--rounds", type=int, default=2, help="rounds of the prompt set per candidate (default 2)")
    t.add_argument("--max-tokens", type=int, default=48, help="tokens generated per prompt (default 48)")
    t.add_argument(
        "--prompt",
        action="append",
        default=None,
        metavar="TEXT",
        help="use this prompt instead of the fixed prompt set (repeatable; all are sent at once)",
    )
    t.add_argument("--json", action="store_true", help="print the results as JSON")
    t.add_argument(
        "--apply",
        action="store_true",
        help="write the recommended profile into <home>/config.toml (comments kept, backup written)",
    )
    add_home(t)


def _list(flag: str, text: str | None, conv, default: tuple) -> tuple:
    if text is None:
        return default
    out = []
    for part in (p.strip().lower() for p in text.split(",") if p.strip()):
        try:
            out.append(conv(part))
        except (KeyError, ValueError):
            raise ConfigError(f"{flag}: bad value {part!r}") from None
    if not out:
        raise ConfigError(f"{flag}: give at least one value")
    return tuple(dict.fromkeys(out))


def _positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise ValueError(text)
    return v


def _threads(text: str) -> int:
    v = int(text)
    if v < 0:
        raise ValueError(text)
    return v


def baseline_of(f: FileConfig, draft_configured: bool) -> Candidate:
    mf, hw, tp = f.defaults.model_fit, f.defaults.hardware, f.defaults.throughput
    return Candidate(
        ctx_size=mf.ctx_size,
        batch=mf.batch,
        ubatch=mf.ubatch,
        mmap=str(hw.mmap),
        mlock=hw.mlock,
        flash_attention=str(mf.flash_attention),
        threads=tp.threads,
        parallel=tp.parallel,
        draft_max_tokens=f.defaults.speculative.draft_max_tokens if draft_configured else None,
    )


def axes_from_args(args, base: Candidate, f: FileConfig, draft: bool) -> TuneAxes:
    ub_default = tuple(dict.fromkeys(u for u in (base.ubatch, base.ubatch // 2, base.ubatch // 4) if u >= 32))
    fa_default = (base.flash_attention, "off" if base.flash_attention != "off" else "on")
    par_default = tuple(dict.fromkeys((base.parallel, 1)))
    if args.draft_max_tokens is not None and not draft:
        raise ConfigError(
            "--draft-max-tokens: needs a draft model (--draft MODEL, or [defaults.speculative] "
            "strategy = \"local\" with a draft_model)"
        )
    spec = f.defaults.speculative
    drafts = (
        _list("--draft-max-tokens", args.draft_max_tokens, _positive_int, (spec.draft_max_tokens,))
        if draft
        else (None,)
    )
    for k in drafts:
        if k is not None and not spec.draft_min_tokens <= k <= 64:
            raise ConfigError(f"--draft-max-tokens: {k} is outside {spec.draft_min_tokens}..64 (draft_min_tokens..64)")
    for flag, value in (("--ctx-sizes", args.ctx_sizes),):
        for v in _list(flag, value, _positive_int, ()):
            if not 128 <= v <= 1 << 20:
                raise ConfigError(f"{flag}: {v} is outside 128..1048576")
    return TuneAxes(
        ctx_sizes=_list("--ctx-sizes", args.ctx_sizes, _positive_int, (base.ctx_size,)),
        batch_sizes=_list("--batch-sizes", args.batch_sizes, _positive_int, (base.batch,)),
        ubatch_sizes=_list("--ubatch-sizes", args.ubatch_sizes, _positive_int, ub_default),
        mmap_values=_list("--mmap-values", args.mmap_values, _SWITCH.__getitem__, (base.mmap,)),
        mlock_values=_list("--mlock-values", args.mlock_values, _BOOL.__getitem__, (base.mlock,)),
        flash_attention=_list("--flash-attention", args.flash_attention, _SWITCH.__getitem__, fa_default),
        threads=_list("--threads", args.threads, _threads, (base.threads,)),
        parallel=_list("--parallel", args.parallel, _positive_int, par_default),
        draft_max_tokens=drafts,
        type_v=f.defaults.model_fit.cache_type_v,
    )


def _draft(args, f: FileConfig) -> tuple[Draft | None, bool]:
    """The local draft to evaluate (None: none) and whether it came from --draft (not the config)."""
    from hydra_node.models import InvalidModelId, ModelNotFound, resolve_model
    from hydra_node.runtime.speculative.runner_args import argv_for

    spec = f.defaults.speculative
    name = args.draft or (spec.draft_model if spec.strategy in ("local", "auto") and spec.draft_model else None)
    if name is None:
        return None, False
    try:
        path = str(resolve_model(name).path)
    except (ModelNotFound, InvalidModelId) as exc:  # the operator's input
        if not args.draft and spec.strategy == "auto":
            return None, False  # auto with a mesh draft: nothing local to tune
        raise ConfigError(f"--draft {name}: {exc}") from None
    return Draft(
        name,
        lambda k: tuple(
            argv_for(
                model=path,
                min_tokens=spec.draft_min_tokens,
                max_tokens=k,
                min_acceptance=spec.min_acceptance,
                min_speedup=spec.min_predicted_speedup,
            )
        ),
    ), bool(args.draft)


def set_keys(text: str, keys: Mapping[str, Any]) -> str:
    """``text`` with each dotted key (``"defaults.model_fit.ctx_size"``) set to its value, a missing
    table appended; tomlkit keeps every comment, blank line and other key.  ``ValueError`` for text
    that is not TOML or a key under a value that is no table."""
    doc = tomlkit.parse(text)
    for dotted, value in keys.items():
        *tables, name = dotted.split(".")
        node: Any = doc
        for table in tables:
            node = node.setdefault(table, tomlkit.table(is_super_table=True))
            if not isinstance(node, MutableMapping):
                raise ValueError(f"{dotted}: {table} is not a table")
        node[name] = value
    return tomlkit.dumps(doc)


def apply_profile(path: Path, keys: dict) -> Path | None:
    """Write ``keys`` into the config file at ``path`` (created if absent); returns the backup path."""
    old = path.read_text(encoding="utf-8") if path.exists() else "# hydra-node configuration (docs/config.md)\n"
    try:
        new = set_keys(old, keys)
    except ValueError as exc:  # tomlkit's ParseError is one
        raise ConfigError(f"--apply: {path}: {exc}; edit {', '.join(keys)} by hand") from None
    parse_config_text(new, str(path))  # never write a file serve would refuse
    return replace_with_backup(path, new)  # the old file in a new backup, never over an older one


def _progress(done: int, total: int, elapsed: float, outcomes: list[Outcome], label: str, budget: float) -> None:
    line = progress_line(done, total, elapsed, eta_s(done, total, elapsed, max(0.0, budget - elapsed)), label)
    if sys.stderr.isatty():
        sys.stderr.write("\r" + line.ljust(100) + ("\n" if done == total else ""))
    else:
        sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _row(o: Outcome, mark: str) -> str:
    f = o.figures
    figs = (
        f"{f.gen_tok_s:9.1f} {f.pp_tok_s:9.1f} {f.ttft_ms:8.1f} {(f.peak_rss_bytes or 0) / 2**20:8.0f}"
        if f
        else f"{'-':>9} {'-':>9} {'-':>8} {'-':>8}"
    )
    return f"{mark:1} {o.status:<14} {figs}  {o.candidate.label()}" + (f"  ({o.error[:80]})" if o.error else "")


def report_json(outcomes: list[Outcome], base: Candidate, rec: Outcome | None, model: str, tol: float) -> dict:
    base_o = next((o for o in outcomes if o.candidate == base), None)
    rec_figures = None if rec is None else rec.figures
    assert rec is None or rec_figures is not None  # recommend() picks a measured outcome
    gain = None
    if rec_figures is not None and base_o is not None and base_o.figures is not None:
        b, r = base_o.figures, rec_figures
        gain = {
            "gen_tok_s_pct": round((r.gen_tok_s / b.gen_tok_s - 1) * 100, 1) if b.gen_tok_s else None,
            "ttft_ms_pct": round((r.ttft_ms / b.ttft_ms - 1) * 100, 1) if b.ttft_ms else None,
        }
    return {
        "model": model,
        "tolerance_pct": tol,
        "baseline": base.label(),
        "candidates": [
            {
                "profile": o.candidate.label(),
                "keys": o.candidate.config_keys(),
                "status": o.status,
                "figures": o.figures.to_json() if o.figures else None,
                "error": o.error or None,
                "seconds": round(o.seconds, 2),
            }
            for o in outcomes
        ],
        "recommended": None
        if rec is None or rec_figures is None
        else {"profile": rec.candidate.label(), "keys": rec.candidate.config_keys(), "figures": rec_figures.to_json()},
        "gain_vs_baseline": gain,
    }


def cmd_benchmark(args, environ) -> int:
    """``environ``: for a model given by catalogue name or URL, downloaded first as ``serve`` does."""
    import trio

    from hydra_node.cli.models import prepare_models
    from hydra_node.config import NodeConfig
    from hydra_node.models import ModelNotFound, resolve_model
    from hydra_node.config.runner_settings import runner_settings_from

    home = Path(args.home).expanduser() if args.home else default_home()
    if not 0 < args.budget <= 24 * 3600:
        raise ConfigError("--budget: seconds, > 0 and at most a day")
    if not 0 <= args.throughput_tolerance_pct < 100:
        raise ConfigError("--throughput-tolerance-pct: 0 <= PCT < 100")
    try:
        trial = TrialSettings(
            rounds=args.rounds, max_tokens=args.max_tokens, **({"prompts": tuple(args.prompt)} if args.prompt else {})
        )
    except ValueError as exc:
        raise ConfigError(f"--rounds/--max-tokens/--prompt: {exc}") from None
    layered = load_layered(home, args.config)
    f = layered.file
    if args.model is not None:  # a catalogue name or URL: downloaded first (docs/models.md)
        prepared = prepare_models(NodeConfig(home=home, models=(args.model,), file=f), environ)
        if prepared is None:
            return 1
        args.model = prepared.models[0]
    try:
        model = resolve_model(args.model)
    except (ModelNotFound, ValueError) as exc:
        print(f"hydra-node: {exc}", file=sys.stderr)
        return 1
    draft, draft_from_flag = _draft(args, f)
    base = baseline_of(f, draft is not None and not draft_from_flag)
    try:
        grid = candidate_grid(axes_from_args(args, base, f, draft is not None), base)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    settings = SweepSettings(budget_s=args.budget, tolerance_pct=args.throughput_tolerance_pct, trial=trial)
    print(f"tuning {model.id}: {len(grid)} candidates, budget {args.budget:g} s", file=sys.stderr)
    outcomes = trio.run(
        lambda: run_sweep(model, runner_settings_from(f), grid, settings, draft, partial(_progress, budget=args.budget))
    )
    rec = recommend(outcomes, args.throughput_tolerance_pct, base)
    report = report_json(outcomes, base, rec, model.id, args.throughput_tolerance_pct)
    if rec is not None and draft_from_flag and draft is not None and rec.candidate.draft_max_tokens is not None:
        report["recommended"]["keys"].update(
            {"defaults.speculative.strategy": "local", "defaults.speculative.draft_model": draft.model}
        )
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"  {'status':<14} {'gen tok/s':>9} {'pp tok/s':>9} {'TTFT ms':>8} {'RSS MiB':>8}  profile")
        for o in outcomes:
            print(_row(o, "*" if o is rec else ("=" if o.candidate == base else "")))
        print("(= the current profile, * the recommendation)")
    if rec is None:
        print("hydra-node: no candidate could be measured; nothing to recommend", file=sys.stderr)
        return 1
    gain = report["gain_vs_baseline"]
    if gain and None not in gain.values() and not args.json:
        print(
            f"recommended: {rec.candidate.label()}  (generation {gain['gen_tok_s_pct']:+.1f} %, "
            f"TTFT {gain['ttft_ms_pct']:+.1f} % vs the current profile)"
        )
    if args.apply:
        path = default_config_path(home)
        chosen = report["recommended"]["keys"]  # the keys the sweep varied (or a draft adds); others stay as they are
        keys = {
            k: v
            for k, v in chosen.items()
            if k not in rec.candidate.config_keys() or any(c.config_keys().get(k) != v for c in grid)
        }
        if not keys:
            print(f"applied: nothing to change in {path} (the sweep varied no key)", file=sys.stderr)
            return 0
        backup = apply_profile(path, keys)
        print(
            f"applied: {len(keys)} keys written to {path}" + (f" (backup {backup})" if backup else ""), file=sys.stderr
        )
        over = [k for k in keys for src, table in layered.layers if src != str(path) and _has(table, k)]
        if args.config and over:
            print(
                f"note: --config {args.config} sets {', '.join(over)}, which override the default file", file=sys.stderr
            )
    return 0


def _has(table: Mapping[str, Any], dotted: str) -> bool:
    node: object = table
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True
