"""Speculative decoding vs the target alone, in one process, greedy, interleaved.

    .venv/bin/python bench/speculative.py [--target f32] [--tokens 96] [--repeats 3] [--threads 1]

The draft is the bundled SmolLM2-135M Q4_1; the target is its F32 (default) or F16
conversion.  Each repeat runs, per prompt kind (code, prose, list), in rotated order:
the target alone, the draft alone (to measure c), speculation with each fixed k, and
the adaptive controller.  We print medians per (kind, mode):

* speedup    = target-alone seconds per token / speculative seconds per token;
* alpha      = per-token acceptance, successes / (successes + rejections);
* c          = draft step time / target step time;
* bound(k)   = Leviathan et al. Thm 3.8, (1 - a^(k+1)) / ((1 - a)(k c + 1)), which assumes a
               verify pass costs one target step; best = max over k in 1..16;
* model(k)   = the same with the measured cost of verifying k tokens (a batch of k + 1);
* frac       = speedup / bound(k).

``--clock cpu`` (the default) times with ``time.process_time``: with one thread this is the
compute the run used, which other processes on a shared machine barely disturb; ``--clock
wall`` uses ``time.perf_counter``.  The adaptive controller gets the same clock.

``--mode nodes`` is the cross-node variant: three real nodes on loopback — D serves the
draft (``--draft-server``), T serves the target with ``--speculative mesh`` (its runner drafts
through a mesh tunnel to D's draft server), R serves the target alone — and requests alternate
between T and R (greedy, wall clock, one thread each).  T runs once per configuration
(``--node-ks``: "adaptive" and fixed k).  alpha and k come from T's ``/api/status``
(``models[].speculative.last_request``), c from the draft and the target alone in this process,
the per-round RTT from T's draft connection.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


from hydra_node.models import bundled_model_path
from hydra_node.runtime.child.speculative.controller import (
    ControllerConfig,
    SpeculationController,
    expected_tokens,
    leviathan_speedup,
)
from hydra_node.runtime.child.speculative.draft import DraftSession
from hydra_node.runtime.child.speculative.llama_engine import LlamaEngine

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from spec_pair import ensure_converted_target  # noqa: E402  (tests/: the benchmark's model pair)
from spec_standalone.decoder import Completion, SpeculativeDecoder  # noqa: E402
from spec_standalone.target import TargetSession  # noqa: E402

PROMPTS = {
    "code": "def quicksort(items):\n    \"\"\"Sort a list of numbers.\"\"\"\n",
    "prose": "The history of the Roman Empire begins",
    "list": "Ten tips for staying healthy:\n1.",
}
K_MAX_BOUND = 16
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
clock = time.process_time


def plain_seconds_per_token(engine: LlamaEngine, prompt: list[int], n: int) -> float:
    s = TargetSession(engine)
    s.start(prompt)
    t0 = clock()
    for _ in range(n):
        s.step()
    return (clock() - t0) / n


def verify_seconds(engine: LlamaEngine, prompt: list[int], k: int, reps: int = 3) -> float:
    engine.truncate(0)
    engine.decode(prompt[:-1], all_logits=False)
    base = engine.n_past
    times = []
    for _ in range(reps):
        engine.truncate(base)
        t0 = clock()
        engine.decode(prompt[-1:] + [prompt[-1]] * k, all_logits=True)
        times.append(clock() - t0)
    return min(times)


def speculative_run(
    target: LlamaEngine, draft: LlamaEngine, prompt: list[int], n: int, controller: SpeculationController
) -> tuple[float, Completion]:
    dec = SpeculativeDecoder(target, DraftSession(draft, clock=clock), controller, clock=clock)
    t0 = clock()
    events = list(dec.generate(prompt, max_tokens=n))
    dt = clock() - t0
    done = events[-1]
    assert isinstance(done, Completion)
    return dt / max(done.completion_tokens, 1), done


NODE_CONFIG = """
[defaults.model_fit]
prompt_cache = false
ctx_size = 1024
[defaults.throughput]
threads = {threads}
[defaults.speculative]
draft_min_tokens = {kmin}
draft_max_tokens = {kmax}
min_predicted_speedup = {min_speedup}
"""


def _node_request(node, model: str, prompt: str, n: int) -> tuple[float, dict]:
    from harness import request

    t0 = time.perf_counter()
    code, body = request(
        "POST",
        node.api_port,
        "/v1/completions",
        {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0},
        timeout=300,
    )
    dt = time.perf_counter() - t0
    if code != 200:
        raise RuntimeError(f"HTTP {code}: {body[:300]}")
    return dt, json.loads(body)


def cross_node(args) -> None:
    """Draft on node D, target on node T (speculating through the mesh), target alone on node R."""
    import shutil
    import sys
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from harness import NodeProcess

    draft_path = bundled_model_path()
    target_path = ensure_converted_target(draft_path, kind=args.target)
    # c = draft step / target step, measured alone in this process (wall clock, same threads)
    global clock
    clock = time.perf_counter
    tgt = LlamaEngine(target_path, n_ctx=1024, n_threads=args.threads)
    drf = LlamaEngine(draft_path, n_ctx=1024, n_threads=args.threads)
    toks = {kind: tgt.tokenize(text) for kind, text in PROMPTS.items()}
    c_of = {kind: plain_seconds_per_token(drf, p, 32) / plain_seconds_per_token(tgt, p, 32) for kind, p in toks.items()}
    tgt.close()
    drf.close()
    base = Path(tempfile.mkdtemp(prefix="hydra-bench-spec-"))
    nodes: list = []

    def config(name: str, kmin: int, kmax: int, min_speedup: float) -> Path:
        path = base / f"{name}.toml"
        path.write_text(NODE_CONFIG.format(threads=args.threads, kmin=kmin, kmax=kmax, min_speedup=min_speedup))
        return path

    common = ("--no-rpc-worker",)

    def launch(name: str, *a: str) -> NodeProcess:
        node = NodeProcess(base / name, *a, *common)
        nodes.append(node)  # killed at the end even if it never became ready
        return node.start()

    try:
        d = launch("d", "--config", str(config("d", 1, 8, 1.0)), "--no-model", "--draft-server", "bundled")
        r = launch("r", "--config", str(config("r", 1, 8, 1.0)), "--model", str(target_path))
        model = r.status()["models"][0]["id"]
        print(
            f"cross-node: target={args.target} ({target_path.name}) draft=Q4_1 on another node, threads="
            f"{args.threads} tokens={args.tokens} repeats={args.repeats} clock=wall"
        )
        print(
            f"{'kind':6} {'config':9} {'tok/s':>7} {'alone':>7} {'speedup':>7} {'alpha':>6} {'c':>5} {'k':>4} "
            f"{'rtt_ms':>6} {'bound(k)':>8} {'frac':>5} {'best':>11}"
        )
        rows = []
        for cfg in args.node_ks.split(","):
            kmin, kmax, min_speedup = (1, 8, 1.0) if cfg == "adaptive" else (int(cfg), int(cfg), 0.01)
            t = launch(
                f"t-{cfg}",
                "--config",
                str(config(f"t-{cfg}", kmin, kmax, min_speedup)),
                "--model",
                str(target_path),
                "--speculative",
                "mesh",
                "--join",
                d.invite(),
            )
            t.wait_status(lambda st: st["speculation"]["draft_peers"], timeout=60, what="T sees the draft")
            _node_request(t, model, PROMPTS["code"], 8)  # warm-up: connections, first measurements
            _node_request(r, model, PROMPTS["code"], 8)
            samples: dict[tuple[str, str], list] = {}
            for rep in range(args.repeats):
                for kind, prompt in PROMPTS.items():
                    order = [("spec", t), ("alone", r)] if rep % 2 == 0 else [("alone", r), ("spec", t)]
                    for mode, node in order:
                        dt, body = _node_request(node, model, prompt, args.tokens)
                        n = body["usage"]["completion_tokens"]
                        spec = node.status()["models"][0].get("speculative") if mode == "spec" else None
                        samples.setdefault((kind, mode), []).append((dt / max(n, 1), spec))
            for kind in PROMPTS:
                t_alone = statistics.median(x[0] for x in samples[(kind, "alone")])
                runs = samples[(kind, "spec")]
                t_spec = statistics.median(x[0] for x in runs)
                last = [x[1]["last_request"] for x in runs]
                acc = sum(x["accepted"] for x in last)
                rej = sum(x["rejections"] for x in last)
                rounds = sum(x["rounds"] for x in last)
                drafted = sum(x["drafted"] for x in last)
                failures = [x["draft_failure"] for x in last if x["draft_failure"]]
                alpha = acc / (acc + rej) if acc + rej else 0.0
                k = drafted / rounds if rounds else 0.0
                c = c_of[kind]
                rtt = runs[-1][1]["remote"]["rtt_ms"]
                bound = leviathan_speedup(alpha, round(k), c) if rounds else 1.0
                best_k, best = max(
                    ((j, leviathan_speedup(alpha, j, c)) for j in range(1, K_MAX_BOUND + 1)), key=lambda x: x[1]
                )
                speedup = t_alone / t_spec
                row = dict(
                    kind=kind,
                    config=cfg,
                    tok_s=1 / t_spec,
                    alone_tok_s=1 / t_alone,
                    speedup=speedup,
                    alpha=alpha,
                    c=c,
                    k=k,
                    rtt_ms=rtt,
                    bound=bound,
                    frac=speedup / bound,
                    best_k=best_k,
                    best_bound=best,
                    draft_failures=failures,
                    status=runs[-1][1],
                )
                rows.append(row)
                print(
                    f"{kind:6} {cfg:9} {1 / t_spec:7.1f} {1 / t_alone:7.1f} {speedup:7.2f} {alpha:6.2f} {c:5.2f} "
                    f"{k:4.1f} {rtt if rtt is not None else float('nan'):6.2f} {bound:8.2f} {speedup / bound:5.2f} "
                    f"{best:6.2f}@k={best_k}" + (f"  draft failures: {failures[:1]}" if failures else "")
                )
            st = t.status()["models"][0]["speculative"]
            print(
                f"  T status: acceptance_rate={st['acceptance_rate']} tokens_per_round={st['tokens_per_round']} "
                f"k={st['k']} predicted={st['predicted_speedup']} measured={st['measured_speedup']} "
                f"speculating={st['speculating']}"
            )
            t.kill_all()
        if args.json:
            args.json.write_text(json.dumps(dict(rows=rows), indent=1))
    finally:
        for n in nodes:
            n.kill_all()
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--mode",
        choices=["process", "nodes"],
        default="process",
        help="process: draft and target in this process; nodes: draft and target on two nodes",
    )
    ap.add_argument("--node-ks", default="adaptive,8", help="--mode nodes: T configurations (adaptive or a fixed k)")
    ap.add_argument("--target", choices=["f16", "f32"], default="f32")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ks", default="1,2,4,8,12")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    if args.mode == "nodes":
        cross_node(args)
        return
    ks = [int(k) for k in args.ks.split(",")]
    global clock
    clock = CLOCKS[args.clock]

    draft_path = bundled_model_path()
    target_path = ensure_converted_target(draft_path, kind=args.target)
    target = LlamaEngine(target_path, n_ctx=1024, n_threads=args.threads)
    draft = LlamaEngine(draft_path, n_ctx=1024, n_threads=args.threads)
    prompts = {kind: target.tokenize(text) for kind, text in PROMPTS.items()}
    # The adaptive controller keeps its measurements across requests, as in a server.
    adaptive = SpeculationController(ControllerConfig(draft_max_tokens=12))
    modes = ["alone", "draft"] + [f"k={k}" for k in ks] + ["adaptive"]
    samples: dict[tuple[str, str], list] = {}
    plain_seconds_per_token(target, prompts["code"], 8)  # warm-up
    plain_seconds_per_token(draft, prompts["code"], 8)
    for rep in range(args.repeats):
        for kind, prompt in prompts.items():
            order = modes[rep % len(modes) :] + modes[: rep % len(modes)]
            for mode in order:
                if mode == "alone":
                    val = plain_seconds_per_token(target, prompt, args.tokens)
                elif mode == "draft":
                    val = plain_seconds_per_token(draft, prompt, args.tokens)
                else:
                    if mode == "adaptive":
                        ctl = adaptive
                    else:
                        k = int(mode[2:])
                        ctl = SpeculationController(
                            ControllerConfig(draft_min_tokens=k, draft_max_tokens=k, min_speedup=0.0)
                        )
                    val = speculative_run(target, draft, prompt, args.tokens, ctl)
                samples.setdefault((kind, mode), []).append(val)
    t_verify = {k: verify_seconds(target, prompts["prose"], k) for k in range(0, max(ks) + 1)}

    rows = []
    print(
        f"target={args.target} ({target_path.name}) draft=Q4_1 threads={args.threads} "
        f"tokens={args.tokens} repeats={args.repeats} clock={args.clock}"
    )
    print(
        "verify cost t_verify(k)/t_verify(0): "
        + " ".join(f"k={k}:{t_verify[k] / t_verify[0]:.2f}" for k in sorted(t_verify))
    )
    hdr = (
        f"{'kind':6} {'mode':9} {'tok/s':>7} {'speedup':>7} {'alpha':>6} {'c':>5} {'k':>3} "
        f"{'bound(k)':>8} {'frac':>5} {'model(k)':>8} {'frac':>5} {'best':>11}"
    )
    print(hdr)
    for kind in prompts:
        t_alone = statistics.median(samples[(kind, "alone")])
        c = statistics.median(samples[(kind, "draft")]) / t_alone
        for mode in modes[2:]:
            runs = samples[(kind, mode)]
            t_spec = statistics.median(r[0] for r in runs)
            acc = sum(r[1].accepted for r in runs)
            rej = sum(r[1].rejections for r in runs)
            rounds = sum(r[1].rounds for r in runs)
            drafted = sum(r[1].drafted for r in runs)
            alpha = acc / (acc + rej) if acc + rej else 0.0
            k = round(drafted / rounds) if rounds else 0
            speedup = t_alone / t_spec
            bound = leviathan_speedup(alpha, k, c) if k else 1.0
            vk = t_verify.get(k, t_verify[max(t_verify)]) / t_verify[0]
            model = expected_tokens(alpha, k) / (k * c + vk) if k else 1.0
            best_k, best = max(
                ((j, leviathan_speedup(alpha, j, c)) for j in range(1, K_MAX_BOUND + 1)), key=lambda x: x[1]
            )
            row = dict(
                kind=kind,
                mode=mode,
                tok_s=1 / t_spec,
                alone_tok_s=1 / t_alone,
                speedup=speedup,
                alpha=alpha,
                c=c,
                k=k,
                bound=bound,
                frac=speedup / bound,
                model=model,
                frac_model=speedup / model,
                best_k=best_k,
                best_bound=best,
            )
            rows.append(row)
            print(
                f"{kind:6} {mode:9} {1 / t_spec:7.1f} {speedup:7.2f} {alpha:6.2f} {c:5.2f} {k:3d} "
                f"{bound:8.2f} {speedup / bound:5.2f} {model:8.2f} {speedup / model:5.2f} "
                f"{best:6.2f}@k={best_k}"
            )
        print(f"{kind:6} {'alone':9} {1 / t_alone:7.1f}")
    if args.json:
        args.json.write_text(json.dumps(dict(rows=rows, t_verify=t_verify), indent=1))
    target.close()
    draft.close()


if __name__ == "__main__":
    main()
