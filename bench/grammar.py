"""Grammar-constrained generation vs plain: tok/s on the bundled model, side by side in one run.

One live node (`hydra-node serve`, the bundled SmolLM2-135M), driven over its HTTP API with
greedy streaming chat requests (`temperature: 0`, fixed seed), the same prompts in four modes:

  plain   the prompt as it is;
  schema  the same prompt with `response_format` `json_schema` (a grammar built from the schema);
  tool    the same prompt with one tool forced by a named `tool_choice` (a grammar built from
          the function's parameters, the `<tool_call>` wrapper included);
  pair    a plain request while another plain one runs beside it (two sequences in one batch);
  mixed   a plain request while a schema-constrained one runs beside it: against `pair`, does a
          grammar in the batch slow the unconstrained sequence next to it?

Rounds are interleaved: each round runs every mode over every prompt, and the order of the
modes rotates from round to round. Reported per mode (medians over samples):

* node decode tok/s: 1 / the request's mean inter-token latency as the node measured it
  (`hydra_request_itl_seconds` in the console's /metrics, read after each request; requests run
  one at a time, so each observation is that request's). This is the fair figure for a forced
  tool call, whose stream may hold a call back until it is complete;
* stream decode tok/s: (completion tokens - 1) / (last streamed delta - first), as a client sees
  it (`-` where the stream delivers the answer in one piece); for `pair` and `mixed` the only
  figure, as the neighbour's requests share the node's observations;
* TTFT (first streamed delta) and completion tokens per request.

Then the ratios issue 13 asks for, goal constrained >= 0.8 of plain (node decode tok/s), and
plain beside a constrained request >= 0.8 of plain beside a plain one (stream decode tok/s).
The schema asks for an array of at least 8 short strings, so a constrained answer is long
enough to time. A TTFT of a forced tool call is when its stream first shows the call.

Run: .venv/bin/python bench/grammar.py [--rounds 3] [--max-tokens 96] [--config FILE]
"""

from __future__ import annotations

import argparse
import http.client
import tempfile
import threading
import time
from pathlib import Path

from _common import NodeProcess, median, sse_events

PROMPTS = [
    "List some famous landmarks of Paris.",
    "Name a few fruits that grow in tropical countries.",
    "Which planets of the solar system can be seen without a telescope?",
    "Give me some ideas for a birthday party.",
]
SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"type": "string", "maxLength": 40},
        "items": {"type": "array", "items": {"type": "string", "maxLength": 40}, "minItems": 8, "maxItems": 12},
    },
    "required": ["topic", "items"],
    "additionalProperties": False,
}
TOOL = {
    "type": "function",
    "function": {"name": "record_list", "description": "Record a list of things about a topic.", "parameters": SCHEMA},
}
MODES = ("plain", "schema", "tool", "pair", "mixed")
#: The modes that measure a plain request with a neighbour in flight, and the neighbour's mode.
NEIGHBOURS = {"pair": "plain", "mixed": "schema"}
TIMEOUT_S = 300.0


def body_for(mode: str, prompt: str, max_tokens: int, model: str) -> dict:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if mode == "schema":
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "things", "schema": SCHEMA, "strict": True},
        }
    elif mode == "tool":
        body["tools"] = [TOOL]
        body["tool_choice"] = {"type": "function", "function": {"name": "record_list"}}
    return body


def stream(port: int, body: dict) -> tuple[float, float | None, int]:
    """One streaming chat request. Returns (ttft_s, decode_s, completion_tokens): TTFT at the first
    delta that carries content or a tool call fragment, decode from there to the last one; decode
    is None when the stream did not deliver the answer piece by piece (fewer deltas than half the
    tokens: a tool call held back until complete)."""
    t0 = time.perf_counter()
    t_first = t_last = None
    tokens, deltas = None, 0
    for t, event in sse_events(port, body, TIMEOUT_S):
        if event.get("usage"):
            tokens = event["usage"]["completion_tokens"]
        for choice in event.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content") or delta.get("tool_calls"):
                deltas += 1
                t_last = t
                t_first = t_first or t_last
    if t_first is None or tokens is None:
        raise RuntimeError(f"no output or no usage in the stream of {body['messages'][0]['content']!r}")
    return t_first - t0, (t_last - t_first if deltas >= max(2, tokens // 2) else None), tokens


def itl_totals(console_port: int) -> tuple[float, float]:
    """(sum, count) of the node's ``hydra_request_itl_seconds`` histogram, every label together."""
    conn = http.client.HTTPConnection("127.0.0.1", console_port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    totals = {"_sum": 0.0, "_count": 0.0}
    for line in text.splitlines():
        for suffix in totals:
            if line.startswith(f"hydra_request_itl_seconds{suffix}{{"):
                totals[suffix] += float(line.rsplit(" ", 1)[1])
    return totals["_sum"], totals["_count"]


def node_itl(console_port: int, before: tuple[float, float]) -> float:
    """The mean inter-token latency (s) of the one request observed since ``before``."""
    deadline = time.monotonic() + 10
    while True:
        total, count = itl_totals(console_port)
        if count == before[1] + 1:
            return total - before[0]
        if count > before[1] + 1 or time.monotonic() > deadline:
            raise RuntimeError(f"expected one ITL observation, saw {count - before[1]:.0f}")
        time.sleep(0.02)


def run_mode(port: int, mode: str, prompt: str, max_tokens: int, model: str) -> tuple[float, float | None, int]:
    if mode not in NEIGHBOURS:
        return stream(port, body_for(mode, prompt, max_tokens, model))
    # the measured plain request, with the neighbour's requests in flight beside it all along
    errors: list[BaseException] = []
    done = threading.Event()

    def neighbour() -> None:
        try:
            while not done.is_set():
                stream(port, body_for(NEIGHBOURS[mode], prompt, max_tokens, model))
        except BaseException as exc:  # reported below, after the measured request
            errors.append(exc)

    t = threading.Thread(target=neighbour, daemon=True)
    t.start()
    time.sleep(0.2)  # let the neighbour's prompt in first
    try:
        return stream(port, body_for("plain", prompt, max_tokens, model))
    finally:
        done.set()
        t.join(TIMEOUT_S)
        if errors:
            raise RuntimeError(f"the neighbour failed: {errors[0]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--config", help="a hydra.toml for the node (default: the node's defaults)")
    args = ap.parse_args()

    from hydra_node.models import BUNDLED_MODEL_ID

    samples = {m: {"node_tps": [], "stream_tps": [], "ttft": [], "tokens": []} for m in MODES}
    with tempfile.TemporaryDirectory(prefix="hydra-bench-grammar-") as tmp:
        node = NodeProcess(Path(tmp) / "node", *(["--config", args.config] if args.config else []))
        try:
            node.start()
            port, console = node.api_port, node.console_port
            for mode in MODES:  # warm-up: first use of each path (prompt templates, grammar compile)
                run_mode(port, mode, PROMPTS[0], 8, BUNDLED_MODEL_ID)
            for r in range(args.rounds):
                order = MODES[r % len(MODES) :] + MODES[: r % len(MODES)]
                for mode in order:
                    for prompt in PROMPTS:
                        before = itl_totals(console)
                        ttft, decode, tokens = run_mode(port, mode, prompt, args.max_tokens, BUNDLED_MODEL_ID)
                        s = samples[mode]
                        s["ttft"].append(ttft * 1000)
                        s["tokens"].append(tokens)
                        if tokens > 1 and decode:
                            s["stream_tps"].append((tokens - 1) / decode)
                        if mode not in NEIGHBOURS and tokens > 1:
                            s["node_tps"].append(1.0 / node_itl(console, before))
                print(f"round {r + 1}/{args.rounds} done", flush=True)
        finally:
            node.kill_all()

    print(
        f"\nbundled model {BUNDLED_MODEL_ID}, greedy, max_tokens {args.max_tokens}, "
        f"{args.rounds} rounds x {len(PROMPTS)} prompts per mode, modes interleaved"
    )
    fmt = lambda xs: f"{median(xs):.1f}" if xs else "-"  # noqa: E731
    print(f"{'mode':8} {'node decode tok/s':>18} {'stream decode tok/s':>20} {'TTFT ms':>9} {'tokens':>7}   (medians)")
    for mode in MODES:
        s = samples[mode]
        print(
            f"{mode:8} {fmt(s['node_tps']):>18} {fmt(s['stream_tps']):>20} {fmt(s['ttft']):>9} "
            f"{median(s['tokens']):7.0f}"
        )
    plain_node = median(samples["plain"]["node_tps"])
    for what, ratio in (
        ("json_schema / plain (node decode tok/s)", median(samples["schema"]["node_tps"]) / plain_node),
        ("forced tool / plain (node decode tok/s)", median(samples["tool"]["node_tps"]) / plain_node),
        (
            "plain beside schema / plain beside plain (stream)",
            median(samples["mixed"]["stream_tps"]) / median(samples["pair"]["stream_tps"]),
        ),
    ):
        print(f"{what:58} {ratio:6.3f}  (goal >= 0.8){'' if ratio >= 0.8 else '  BELOW GOAL'}")


if __name__ == "__main__":
    main()
