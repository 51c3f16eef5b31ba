"""Anthropic Messages API vs OpenAI chat completions: decode tokens/s on the same node and model.

One node (bundled model, prompt cache off so both sides prefill alike), the same conversations,
greedy, streamed, interleaved in one run (alternating which API goes first). Prints the median
decode tokens/s and time to first token of each API and the ratio the issue asks for:

  Messages tok/s / OpenAI chat tok/s >= 0.97.

Run: .venv/bin/python bench/messages.py [--rounds 5] [--max-tokens 96]
"""

from __future__ import annotations

import argparse
import http.client
import json
import tempfile
import time
from pathlib import Path

from _common import NodeProcess, median

from hydra_node.models import BUNDLED_MODEL_ID

QUESTIONS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle works.",
    "List some facts about the Moon.",
    "Describe a walk through a forest in autumn.",
]


def _post(port: int, path: str, body: dict):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"{path}: HTTP {resp.status}: {resp.read(2000)!r}")
    return conn, resp


def openai_chat(port: int, question: str, max_tokens: int) -> tuple[float, float, int]:
    """(ttft_s, decode_s, completion tokens) of one streamed chat completion."""
    body = {
        "model": BUNDLED_MODEL_ID,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    conn, resp = _post(port, "/v1/chat/completions", body)
    first = last = None
    tokens = 0
    try:
        for line in resp:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("choices") and ev["choices"][0]["delta"].get("content"):
                first = first or time.perf_counter()
                last = time.perf_counter()
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
    finally:
        conn.close()
    return first - t0, last - first, tokens


def messages(port: int, question: str, max_tokens: int) -> tuple[float, float, int]:
    """(ttft_s, decode_s, output tokens) of one streamed Messages request."""
    body = {
        "model": BUNDLED_MODEL_ID,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    t0 = time.perf_counter()
    conn, resp = _post(port, "/v1/messages", body)
    first = last = None
    tokens = 0
    try:
        for line in resp:
            if not line.startswith(b"data: "):
                continue
            ev = json.loads(line[6:])
            if ev["type"] == "content_block_delta":
                first = first or time.perf_counter()
                last = time.perf_counter()
            elif ev["type"] == "message_delta":
                tokens = ev["usage"]["output_tokens"]
            elif ev["type"] == "error":
                raise RuntimeError(f"error event: {ev['error']}")
    finally:
        conn.close()
    return first - t0, last - first, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=96)
    args = ap.parse_args()

    home = Path(tempfile.mkdtemp(prefix="hydra-bench-messages-"))
    cfg = home / "hydra.toml"
    cfg.write_text("[defaults.model_fit]\nprompt_cache = false\n")
    node = NodeProcess(home / "node", "--config", str(cfg)).start()
    sides = {"openai": openai_chat, "messages": messages}
    res = {name: {"ttft": [], "tps": [], "tokens": []} for name in sides}
    try:
        for name, fn in sides.items():  # warm both paths once
            fn(node.api_port, QUESTIONS[0], 8)
        for r in range(args.rounds):
            for i, q in enumerate(QUESTIONS):
                order = list(sides) if (r + i) % 2 == 0 else list(reversed(sides))
                for name in order:
                    ttft, decode, n = sides[name](node.api_port, q, args.max_tokens)
                    res[name]["ttft"].append(ttft * 1000)
                    res[name]["tokens"].append(n)
                    if n > 1 and decode > 0:
                        res[name]["tps"].append((n - 1) / decode)
    finally:
        node.kill_all()
    for name in sides:
        print(
            f"{name:9s} decode {median(res[name]['tps']):7.1f} tok/s   ttft {median(res[name]['ttft']):7.1f} ms   "
            f"tokens {sum(res[name]['tokens'])} over {len(res[name]['tokens'])} requests"
        )
    ratio = median(res["messages"]["tps"]) / median(res["openai"]["tps"])
    print(
        f"ratio messages/openai tok/s = {ratio:.3f} (goal >= 0.97); "
        f"added ttft = {median(res['messages']['ttft']) - median(res['openai']['ttft']):+.1f} ms"
    )


if __name__ == "__main__":
    main()
