"""Images in chats: time to first token of a one-image chat on hydra-node ÷ llama-server, and a second turn
about the same image ÷ the first turn (issue 29; goals <= 1.2x and <= 0.3x).

Both sides serve the bundled SmolLM2-135M with the same projector, the same threads, one slot and the
same context; hydra-node as one node (``serve --model … --mmproj …``), llama-server (``--mmproj``, built
once from the llama-cpp-python sdist and cached, as bench/concurrency.py does).

The projector (``--projector``), synthetic in both cases (random weights: what the model "sees" means
nothing; the cost is real):

* ``bench`` (the default): tests/fixtures/vision_model.py's ``bench_projector_path()``, LLaVA-1.5's
  geometry (336 px, 14 px patches: 576 positions per image, as real LLaVA-1.5), a width-512, 8-block
  encoder. With the default short prompt (``--words 0``: a sentence before the image, a question
  after) the first turn is the image: its encoding and the prefill of its 576 positions.
* ``fixture``: the tests' projector (an image is 4 positions, a tiny encoder); with ``--words 800``
  this is the older "document" measurement, where the first turn is mostly a document's prefill.

Each round uses an image that no earlier round used (and, with ``--words N``, a new document of N
words), so nothing of it is cached anywhere, and sends, side after side (the side that goes first
alternates between rounds):

1. the first turn: the text, the image (an ``image_url`` data URL) and a question; TTFT cold;
2. then the second turn: that conversation, the side's answer, and a follow-up question; TTFT with the
   first turn's prompt (image included) in the slot's cache.

TTFT is measured by the client (a streamed greedy chat request of 8 tokens, after one warm-up
conversation per side): to the first content delta, or to the finish chunk when the answer is empty
(random image rows often make the model end its answer at once). ``--quick``: 2 rounds (documents of
at most 300 words with ``--words``).
Printed: how long libmtmd takes to encode one image here (the runner's ``Projector``, in this
process, the same threads); each round's figures; per side the medians and the median of the rounds'
second ÷ first ratios (goal <= 0.3 for hydra-node); the median of the rounds' hydra ÷ llama-server
first-turn ratios (each round's two first turns are measured one right after the other; goal <= 1.2);
whether the two sides' greedy answers agree (first and second turns); where the first turn goes
(llama-server's own ``timings.prompt_ms`` against both sides' TTFT); the load average (on a busy
machine the figures are noisy: the script says so).

    .venv/bin/python bench/vision.py [--quick] [--rounds 5] [--projector bench|fixture] [--words 0]
        [--image-size 336] [--threads N] [--ctx 4096] [--only hydra|llama-server] [--llama-server PATH]
"""

from __future__ import annotations

import argparse
import base64
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _common import NodeProcess, sse_events  # noqa: E402
from concurrency import LlamaServer, ensure_llama_server, llama_cpp_version  # noqa: E402

from hydra_node.models import resolve_model  # noqa: E402
from tests.fixtures.vision_model import (  # noqa: E402
    N_IMAGE_TOKENS,
    bench_n_image_tokens,
    bench_projector_path,
    png_bytes,
    projector_path,
)

WORDS = (
    "river mountain lantern harbor garden window letter market station engine forest bridge candle "
    "silver winter summer morning evening island valley village castle teacher doctor painter farmer "
    "sailor kitchen library museum theater circle square yellow purple orange quiet gentle careful "
    "brave clever simple ancient modern distant nearby travel wander gather listen follow remember "
    "imagine describe explain measure compare balance shadow thunder meadow pebble feather whisper"
).split()
MAX_TOKENS = 8
REQUEST_TIMEOUT_S = 600.0
MODEL_ID = "bench-vision"
GOAL_VS_LLAMA_SERVER = 1.2
GOAL_SECOND_TURN = 0.3


def document(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return f"Document {seed}:\n" + " ".join(rng.choice(WORDS) for _ in range(words))


def first_turn(seed: int, words: int, image: bytes) -> list[dict]:
    """The first turn: with ``words`` > 0 a document before the image; otherwise one short sentence."""
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    if words > 0:
        before = document(seed, words) + "\n\nHere is a picture that goes with it:"
        after = "Describe the picture and the document in one sentence."
    else:
        before = f"I took this photo on day {seed} of my trip."
        after = "What is in the picture? Answer in one sentence."
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": before},
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": after},
            ],
        }
    ]


def ttft(port: int, model: str, messages: list[dict]) -> tuple[float, str, float | None]:
    """(seconds to the first token, the answer's text, the server's own prompt time in seconds when it
    reports one: llama-server's ``timings.prompt_ms``) of one streamed greedy chat request. The first
    token is the first content delta or, when the answer is empty (the first token sampled ends it, as
    the synthetic projector's images often make the model do), the chunk that carries the finish reason."""
    body = {"model": model, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    first, text, prompt_s = None, "", None
    for t, event in sse_events(port, body, REQUEST_TIMEOUT_S):
        timings = event.get("timings")
        if isinstance(timings, dict) and "prompt_ms" in timings:
            prompt_s = float(timings["prompt_ms"]) / 1000
        for choice in event.get("choices") or ():
            piece = (choice.get("delta") or {}).get("content")
            if piece or choice.get("finish_reason"):
                first = t if first is None else first
                text += piece or ""
    if first is None:
        raise RuntimeError("neither content nor a finish reason in the stream")
    return first - t0, text, prompt_s


def second_turn(turn1: list[dict], answer: str, words: int) -> list[dict]:
    """The first turn, the side's answer and a follow-up question (the prompt extends the first's)."""
    follow_up = "Now say the same in other words." if words > 0 else "What colours stand out in it?"
    return [*turn1, {"role": "assistant", "content": answer}, {"role": "user", "content": follow_up}]


def conversation(port: int, model: str, seed: int, words: int, image: bytes) -> dict:
    """The first turn and the second turn about the same image: their TTFTs and the first answer."""
    turn1 = first_turn(seed, words, image)
    t1, answer, _ = ttft(port, model, turn1)
    t2, _, _ = ttft(port, model, second_turn(turn1, answer, words))
    return {"first_s": t1, "second_s": t2, "answer": answer}


class Hydra:
    def __init__(self, args, projector: Path):
        self.home = Path(tempfile.mkdtemp(prefix="vision-bench-"))
        cfg = self.home.parent / f"{self.home.name}.toml"
        cfg.write_text(
            f"[defaults.throughput]\nthreads = {args.threads}\nthreads_batch = {args.threads}\nparallel = 1\n"
            f"[defaults.model_fit]\nctx_size = {args.ctx}\n"
        )
        model = f"{MODEL_ID}={resolve_model(None).path}"
        self.node = NodeProcess(self.home, "--config", str(cfg), "--no-rpc-worker", "--model", model)
        self.node.args += ["--mmproj", str(projector)]
        self.model = MODEL_ID

    def start(self) -> "Hydra":
        self.node.start()
        self.node.wait_status(
            lambda st: bool(st["models"]) and all(m.get("state") == "ready" for m in st["models"]),
            timeout=300,
            what="the model runner ready",
        )
        return self

    @property
    def port(self) -> int:
        assert self.node.api_port is not None, "the node is not started"
        return self.node.api_port

    def stop(self) -> None:
        self.node.stop()


class LlamaServerSide:
    def __init__(self, args, projector: Path):
        binary = Path(args.llama_server) if args.llama_server else ensure_llama_server(llama_cpp_version())
        log_dir = Path(tempfile.mkdtemp(prefix="vision-bench-ls-"))
        self.server = LlamaServer(binary, Path(resolve_model(None).path), 1, args.ctx, args.threads, log_dir)
        self.server.cmd += ["--mmproj", str(projector)]
        self.model = "m"

    def start(self) -> "LlamaServerSide":
        self.server.start()
        return self

    @property
    def port(self) -> int:
        return self.server.port

    def stop(self) -> None:
        self.server.stop()


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def encode_ms(projector: Path, threads: int, images: list[bytes]) -> float:
    """The median time (ms) libmtmd takes to encode one of ``images`` with ``projector``, in this
    process, with ``threads`` threads: the runner's code (``Projector``), the library llama-server uses."""
    import hashlib

    import llama_cpp

    from hydra_node.runtime.child.vision import Projector

    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    path = str(resolve_model(None).path)
    with tempfile.TemporaryFile() as log:  # llama.cpp's load log goes to fd 2: shown only on a failure
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            model = llama_cpp.llama_model_load_from_file(path.encode(), params)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        if not model:
            log.seek(0)
            raise RuntimeError(f"cannot load {path}: {log.read()[-2000:].decode(errors='replace')}")
    proj = Projector.load(str(projector), model, model_path=path, n_threads=threads, use_gpu=False)
    times = []
    try:
        for image in images:
            blob = {"sha256": hashlib.sha256(image).hexdigest(), "data": image}
            tokens = proj.tokenize(f"x {proj.marker} y", [blob], add_special=True)
            placeholders = [t for t in tokens if t < 0]
            t0 = time.perf_counter()
            proj.rows(placeholders)
            times.append(time.perf_counter() - t0)
    finally:
        proj.close()
        llama_cpp.llama_model_free(model)
    return median(times) * 1000


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a short run: 2 rounds (300-word documents with --words)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument(
        "--projector",
        choices=("bench", "fixture"),
        default="bench",
        help="bench: 576 positions per image (LLaVA-1.5 geometry); fixture: the tests' 4-position projector",
    )
    p.add_argument("--words", type=int, default=0, help="words in each round's document (0: a short sentence)")
    p.add_argument("--image-size", type=int, default=0, help="the images' side in pixels (default 336, fixture 64)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--only", choices=("hydra", "llama-server"))
    p.add_argument("--llama-server", default="", help="a llama-server binary (default: build/cache it)")
    args = p.parse_args()
    if args.quick:
        args.rounds = 2
        args.words = min(args.words, 300)
    if args.rounds < 1 or args.words < 0:
        p.error("--rounds must be at least 1 and --words at least 0")
    if args.projector == "bench":
        projector, positions, what = bench_projector_path(), bench_n_image_tokens(), "bench: LLaVA-1.5 geometry"
    else:
        projector, positions, what = projector_path(), N_IMAGE_TOKENS, "the tests' fixture"
    size = args.image_size or (336 if args.projector == "bench" else 64)
    text = f"documents of {args.words} words" if args.words else "a short sentence"
    load_before = os.getloadavg()[0]
    print(
        f"{args.rounds} rounds; {text} and one new {size}x{size} image ({positions} positions) each; 1 slot, "
        f"ctx {args.ctx}, {args.threads} threads; projector {projector.name} ({what}; synthetic, random weights)",
        flush=True,
    )
    enc = encode_ms(projector, args.threads, [png_bytes(size, size, 20_000 + i) for i in range(3)])
    print(f"encoding one image (libmtmd, in this process, {args.threads} threads): {enc:.1f} ms (median of 3)")
    sides: dict[str, Hydra | LlamaServerSide] = {}
    rows: dict[str, list[dict]] = {}
    try:
        if args.only != "llama-server":
            sides["hydra"] = Hydra(args, projector).start()
        if args.only != "hydra":
            sides["llama-server"] = LlamaServerSide(args, projector).start()
        # one warm-up conversation per side (first-request costs: allocations, the projector's first graph)
        for side in sides.values():
            conversation(side.port, side.model, 10_000, args.words, png_bytes(size, size, 10_000))
        rows = {name: [] for name in sides}
        names = list(sides)
        for rnd in range(args.rounds):
            image = png_bytes(size, size, rnd)
            turn1 = first_turn(rnd, args.words, image)
            order = names if rnd % 2 == 0 else names[::-1]
            got: dict[str, dict] = {}
            for name in order:  # the first turns side by side, then the second turns
                side = sides[name]
                t1, answer, prompt_s = ttft(side.port, side.model, turn1)
                got[name] = {"first_s": t1, "answer": answer, "prompt_s": prompt_s}
            for name in order:
                side = sides[name]
                t2, answer2, _ = ttft(side.port, side.model, second_turn(turn1, got[name]["answer"], args.words))
                got[name]["second_s"], got[name]["answer2"] = t2, answer2
                rows[name].append(got[name])
            print(
                f"  round {rnd}: "
                + "; ".join(
                    f"{name} first turn {got[name]['first_s'] * 1000:7.1f} ms, second {got[name]['second_s'] * 1000:6.1f} ms"
                    + ("" if got[name]["answer"] else " (first answer empty)")
                    for name in names
                ),
                flush=True,
            )
    finally:
        for side in sides.values():
            side.stop()
    load_after = os.getloadavg()[0]
    print()
    for name, rs in rows.items():
        first, second = median([r["first_s"] for r in rs]), median([r["second_s"] for r in rs])
        turn_ratio = median([r["second_s"] / r["first_s"] for r in rs])
        goal = f" (goal <= {GOAL_SECOND_TURN})" if name == "hydra" else ""
        print(
            f"{name:>12}: first turn TTFT {first * 1000:7.1f} ms, second turn {second * 1000:7.1f} ms (medians); "
            f"second ÷ first {turn_ratio:.2f}x{goal}"
        )
    if len(rows) == 2:
        pairs = list(zip(rows["hydra"], rows["llama-server"]))
        ratio = median([h["first_s"] / ls["first_s"] for h, ls in pairs])
        of_medians = median([h["first_s"] for h, _ in pairs]) / median([ls["first_s"] for _, ls in pairs])
        print(
            f"hydra ÷ llama-server, first turn TTFT: {ratio:.2f}x (median of the rounds' ratios; ratio of the "
            f"medians {of_medians:.2f}x) (goal <= {GOAL_VS_LLAMA_SERVER})"
        )
        same = sum(h["answer"] == ls["answer"] for h, ls in pairs)
        same2 = sum(h["answer2"] == ls["answer2"] for h, ls in pairs)
        empty = sum(not h["answer"] for h, _ in pairs)
        empty2 = sum(not h["answer2"] for h, _ in pairs)
        print(
            f"greedy answers equal on both sides: first turns {same} of {len(pairs)} rounds, second turns {same2} "
            f"of {len(pairs)} (hydra's answers empty, the first token sampled ending them: {empty} first, "
            f"{empty2} second)"
        )
    server = [r["prompt_s"] for r in rows.get("llama-server", ()) if r["prompt_s"] is not None]
    if server:
        ls_first = median([r["first_s"] for r in rows["llama-server"]]) * 1000
        ls_prompt = median(server) * 1000
        print(
            f"where the first turn goes: encoding {enc:.0f} ms (measured above); llama-server's own prompt time "
            f"(timings.prompt_ms: encode, {positions} image positions, the text) {ls_prompt:.0f} ms of its "
            f"{ls_first:.0f} ms TTFT (medians)"
        )
        if "hydra" in rows:
            h_first = median([r["first_s"] for r in rows["hydra"]]) * 1000
            print(
                f"  first turn TTFT above llama-server's own prompt time: hydra {h_first - ls_prompt:+.0f} ms, "
                f"llama-server {ls_first - ls_prompt:+.0f} ms (HTTP, checks, tokenizing, one sample; hydra's "
                "prefill is not timed separately)"
            )
    print(f"load average (1 min): {load_before:.1f} before, {load_after:.1f} after, on {os.cpu_count()} CPUs")
    if max(load_before, load_after) > (os.cpu_count() or 1):
        print("NOTE: the machine was busy with other work; the figures are noisy (run again when it is idle)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
