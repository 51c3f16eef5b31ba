"""`benchmark tune`'s recommended profile vs the default profile, on the bundled model, side by side.

1. Runs the real command, `hydra-node benchmark tune --json` (a throwaway home, so the default
   profile is the base; the tuner's default axes unless given), and takes its recommendation.
2. Measures both profiles again in one run, interleaved (the side that goes first alternates each
   round), each round a fresh runner child per side (the node's own runner, warmed up) and the
   tuner's fixed prompt set (`hydra_node/runtime/tuning/trial.py`): generation tok/s (completion
   tokens of a round / its wall time, all prompts at once), mean client TTFT, prefill tok/s,
   peak RSS.  Medians over rounds, then the ratios recommended / default.

Goal (issue 18): never worse than the default (tok/s ratio >= 1 within noise; TTFT ratio <= 1).

Run: .venv/bin/python bench/tune.py [--budget 180] [--ab-rounds 3] [--rounds 2] [--max-tokens 48]
       [-- extra `benchmark tune` flags, e.g. --flash-attention auto,off]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hydra_node.cli.config_sources import load_layered  # noqa: E402
from hydra_node.cli.tune import apply_profile  # noqa: E402
from hydra_node.models import resolve_model  # noqa: E402
from hydra_node.config.runner_settings import runner_settings_from  # noqa: E402
from hydra_node.runtime.tuning.trial import TrialSettings, run_trial  # noqa: E402


def tune(home: Path, args, extra: list[str]) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "hydra_node.cli",
        "benchmark",
        "tune",
        "--json",
        "--home",
        str(home),
        "--budget",
        str(args.budget),
        "--rounds",
        str(args.rounds),
        "--max-tokens",
        str(args.max_tokens),
        *extra,
    ]
    print("$ " + " ".join(cmd[1:]), file=sys.stderr)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=args.budget * 3 + 300)
    if r.returncode != 0:
        sys.exit(f"benchmark tune failed with {r.returncode}")
    return json.loads(r.stdout)


async def side_by_side(home: Path, keys: dict, args) -> dict[str, list]:
    model = resolve_model(None)
    default = runner_settings_from(load_layered(home / "default", None).file)
    (home / "tuned").mkdir()
    apply_profile(home / "tuned" / "config.toml", keys)
    tuned = runner_settings_from(load_layered(home / "tuned", None).file)
    trial = TrialSettings(rounds=args.rounds, max_tokens=args.max_tokens)
    out: dict[str, list] = {"default": [], "tuned": []}
    for r in range(args.ab_rounds):
        order = [("default", default), ("tuned", tuned)]
        for name, settings in order if r % 2 == 0 else order[::-1]:
            run_home = home / f"run-{name}-{r}"
            for sub in ("run", "logs"):
                (run_home / sub).mkdir(parents=True)
            res = await run_trial(model, settings, run_home, trial)
            out[name].append(res.figures)
            f = res.figures
            print(
                f"  round {r + 1} {name:<7} gen {f.gen_tok_s:7.1f} tok/s  pp {f.pp_tok_s:7.1f} tok/s  "
                f"TTFT {f.ttft_ms:8.1f} ms  RSS {(f.peak_rss_bytes or 0) / 2**20:6.0f} MiB",
                file=sys.stderr,
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=float, default=180.0, help="the tuner's --budget (s)")
    ap.add_argument("--ab-rounds", type=int, default=3, help="interleaved rounds of the side-by-side measure")
    ap.add_argument("--rounds", type=int, default=2, help="prompt-set rounds per trial")
    ap.add_argument("--max-tokens", type=int, default=48)
    args, extra = ap.parse_known_args()
    extra = [x for x in extra if x != "--"]
    with tempfile.TemporaryDirectory(prefix="hydra-bench-tune-") as tmp:
        home = Path(tmp)
        (home / "default").mkdir()
        report = tune(home / "default", args, extra)
        rec = report["recommended"]
        print(
            f"tuner: {len(report['candidates'])} candidates; baseline {report['baseline']}\n"
            f"       recommended {rec['profile']} (in-sweep gain {report['gain_vs_baseline']})"
        )
        if rec["profile"] == report["baseline"]:
            print(
                "       the recommendation is the default profile: the side-by-side below compares a profile "
                "with itself, i.e. it shows this machine's run-to-run noise"
            )
        figs = trio.run(side_by_side, home, rec["keys"], args)
    med = {
        side: {k: statistics.median(getattr(f, k) for f in fs) for k in ("gen_tok_s", "pp_tok_s", "ttft_ms")}
        for side, fs in figs.items()
    }
    print(f"\n{'profile':<9} {'gen tok/s':>10} {'pp tok/s':>10} {'TTFT ms':>10}   (medians of {args.ab_rounds} rounds)")
    for side in ("default", "tuned"):
        m = med[side]
        print(f"{side:<9} {m['gen_tok_s']:10.1f} {m['pp_tok_s']:10.1f} {m['ttft_ms']:10.1f}")
    d, t = med["default"], med["tuned"]
    print(
        f"ratio tuned/default: gen tok/s {t['gen_tok_s'] / d['gen_tok_s']:.3f} (goal >= 1)  "
        f"pp tok/s {t['pp_tok_s'] / d['pp_tok_s']:.3f}  TTFT {t['ttft_ms'] / d['ttft_ms']:.3f} (goal <= 1)"
    )


if __name__ == "__main__":
    main()
