"""Reasoning parsing overhead: tok/s of a reasoning chat vs the same tokens without reasoning.

One node serves the thinking fixture (tests/fixtures/models.py: the bundled SmolLM2 with a
Qwen3-style template whose generation prompt opens ``<think>``; a fixture, not a real model).
Two sides, interleaved in one run, greedy, the same prompt tokens:

* ``reasoning``: a streamed chat completion; the host splits every token into thoughts and
  answer (``engine/reasoning_track.py``) and the API node sends ``delta.reasoning_content``;
* ``plain``: a streamed completion whose prompt is the same token ids (the chat prompt as the
  template renders it, tokenized by the node's ``/tokenize`` with special tokens parsed), so
  the model generates the same tokens with no reasoning machinery at all.

Decode tok/s = (completion tokens − 1) ÷ (last delta − first delta), medians per side; the ratio
reasoning ÷ plain is the overhead goal (issue 31: ≥ 0.98).

Run: .venv/bin/python bench/reasoning.py [--rounds 5] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import tempfile
from pathlib import Path

from _common import NodeProcess, median, sse_events

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fixtures.models import THINKING_TEMPLATE, thinking_model  # noqa: E402

MODEL = "thinking"
PROMPTS = [
    "Why is the sky blue?",
    "Write a short poem about the sea.",
    "What is 17 times 23?",
    "List three uses of copper.",
]


def post(port: int, path: str, body: dict) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = json.loads(r.read())
    conn.close()
    if r.status != 200:
        raise RuntimeError(f"{path}: HTTP {r.status}: {data}")
    return data


def rendered_prompt(question: str) -> str:
    """The chat prompt as the fixture's template renders it (the host renders the same text)."""
    from hydra_node.runtime.child.chat_prompt import ChatTemplate

    req = {"kind": "chat", "messages": [["user", question]]}
    return ChatTemplate(THINKING_TEMPLATE, bos_token="", eos_token="").render(req).text


def timed(port: int, path: str, body: dict) -> tuple[float, int, int]:
    """(decode seconds, completion tokens, reasoning tokens) of one streamed request."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    first = last = None
    usage: dict = {}
    for t, ev in sse_events(port, body, 600.0, path):
        if ev.get("usage"):
            usage = ev["usage"]
        for c in ev.get("choices") or ():
            d = c.get("delta") or {}
            if d.get("content") or d.get("reasoning_content") or c.get("text"):
                first = t if first is None else first
                last = t
    if first is None or last is None:
        raise RuntimeError(f"{path}: no text in the stream")
    details = usage.get("completion_tokens_details") or {}
    return last - first, usage["completion_tokens"], details.get("reasoning_tokens", 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    args = ap.parse_args()

    home = Path(tempfile.mkdtemp(prefix="hydra-bench-reasoning-"))
    cfg = home / "hydra.toml"
    cfg.write_text(
        f"[defaults.throughput]\nthreads = {args.threads}\nthreads_batch = {args.threads}\n"
        "[defaults.model_fit]\nctx_size = 2048\n"
    )
    node = NodeProcess(home / "node", "--config", str(cfg), "--model", f"{MODEL}={thinking_model()}").start()
    res: dict[str, list[float]] = {"reasoning": [], "plain": []}
    same = True
    reasoning_share: list[float] = []
    try:
        port = node.api_port
        token_prompts = {
            q: post(port, "/tokenize", {"model": MODEL, "content": rendered_prompt(q), "parse_special": True})["tokens"]
            for q in PROMPTS
        }
        chat = lambda q: timed(  # noqa: E731
            port,
            "/v1/chat/completions",
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": q}],
                "max_tokens": args.max_tokens,
                "temperature": 0,
            },
        )
        plain = lambda q: timed(  # noqa: E731
            port,
            "/v1/completions",
            {"model": MODEL, "prompt": token_prompts[q], "max_tokens": args.max_tokens, "temperature": 0},
        )
        for q in PROMPTS:  # warm both sides once
            chat(q), plain(q)
        for r in range(args.rounds):
            for i, q in enumerate(PROMPTS):
                order = [("reasoning", chat), ("plain", plain)]
                if (r + i) % 2:
                    order.reverse()
                counts = {}
                for name, fn in order:
                    dec, n, thought = fn(q)
                    counts[name] = n
                    if name == "reasoning":
                        reasoning_share.append(thought / max(1, n))
                    if n > 1 and dec > 0:
                        res[name].append((n - 1) / dec)
                same = same and counts["reasoning"] == counts["plain"]
    finally:
        node.kill_all()
    print(
        f"samples per side: {len(res['plain'])} ({args.rounds} rounds x {len(PROMPTS)} prompts, "
        f"max_tokens={args.max_tokens}, threads={args.threads}); share of reasoning tokens "
        f"{median(reasoning_share):.2f}; equal token counts on both sides: {same}"
    )
    for name, v in res.items():
        print(f"{name:10} decode tok/s (median) {median(v):8.1f}")
    print(f"reasoning / plain: {median(res['reasoning']) / median(res['plain']):.3f}  (goal >= 0.98)")


if __name__ == "__main__":
    main()
