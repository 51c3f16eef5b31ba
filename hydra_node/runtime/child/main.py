"""Model runner child process: one llama.cpp model, ``--parallel`` sequences batched together.

The main thread runs the engine loop (:mod:`hydra_node.runtime.child.engine_loop`,
:mod:`hydra_node.runtime.child.engine`): one ``llama_decode`` per step over every active sequence,
each with its own sampler chain (grammar, penalties, logit bias, logprobs).  With
``--no-continuous-batching`` the engine runs with one slot (one sequence at a time, every
sampling feature still there).  A draft model (speculative decoding) speculates inside the
engine (:mod:`hydra_node.runtime.child.engine.speculation`). With ``--mmproj`` a vision projector
(:mod:`hydra_node.runtime.child.vision`, libmtmd) turns a chat's images into placeholder positions
of its prompt (:mod:`hydra_node.runtime.child.engine.media`) whose embeddings the engine decodes.

Started by :mod:`hydra_node.runtime.runner.supervisor` with a connected socket on
``--fd``.  Speaks the runner channel (length-prefixed canonical CBOR maps,
:mod:`hydra_node.runtime.child.channel`, decoded strictly by :mod:`hydra_node.codec`):

  node -> runner: {"op": "generate", "id", "req"} | {"op": "cancel", "id"} | {"op": "ping", "n"} | {"op": "shutdown"}
  runner -> node: {"op": "ready", ..., "caps"} (caps: the model's ModelCaps, inference/capabilities.py) | {"op": "delta", "id", "text", "tokens"?, "logprobs"?} | {"op": "done", "id", ...}
                  | {"op": "error", "id", "message", "code", "status"} | {"op": "pong", "n"} | {"op": "fatal", "message"}
                  | {"op": "stats", ...} (the engine's figures: hydra_node/runtime/child/stats.py)
  embeddings (runner/embed.py): {"op": "embed", "id", "req"} -> {"op": "vectors", "id", "v"} ...
                  then {"op": "embedded", "id", "prompt_tokens"} or an error
  KV state (runner/kv_jobs.py): {"op": "kv_export", "id", "req", "path", "model_sha256"} -> {"op": "kv_exported",
                  "id", "tokens", "bytes", "identity"}; {"op": "kv_import", "id", "path", "model_sha256"}
                  -> {"op": "kv_imported", "id", "tokens", "bytes", "slot"}; or an error
  tokenizer (runner/tokenize_call.py, child/vocab_ops.py): {"op": "tokenize", "id", "req"}
                  -> {"op": "tokenized", "id", "tokens", "pieces", "content", "served_by"} or an error

A reader thread queues generate/embed/cancel frames for the engine loop and answers pings, so
a cancelled sequence leaves the batch at the next step.  The runner dies with its parent
(PR_SET_PDEATHSIG, set before exec by :mod:`hydra_node.runtime.supervise`; a thread
watching the parent pid backs it up) and exits when the socket closes.
"""

from __future__ import annotations

# llama.cpp's libraries first, before anything imports numpy: on a CUDA build, numpy's own
# libraries loaded first made the model load segfault (measured on an H200 with the CUDA image's
# numpy 2.5; the plain Llama() load works only in this order). Cause inside the libraries not established.
import llama_cpp  # noqa: F401,I001

import argparse
import os
import queue
import signal
import socket
import sys
import threading
import time

from hydra_node.runtime.child.channel import ChannelError, FrameDecoder, encode_frame
from hydra_node.runtime.child.embed import Embedder
from hydra_node.runtime.child.chat_prompt import ChatTemplate, InvalidPrompt, completion_token_ids
from hydra_node.inference.capabilities import ModelCaps
from hydra_node.inference.images import IMAGE_MARK
from hydra_node.runtime.child.process import die_with_parent
from hydra_node.runtime.runner.records import REASONING_FORMAT_SETTINGS
from hydra_node.runtime.child.vocab_ops import TokenizerThread, fim_tokens, infill_layout, tokenize_answer

#: The prompt decoded before reporting ready (compute buffers allocated, weights faulted in).
WARMUP_TEXT = b"Hydra warm-up: the quick brown fox jumps over the lazy dog."


class Channel:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.lock = threading.Lock()
        self.decoder = FrameDecoder()

    def send(self, msg: dict) -> None:
        data = encode_frame(msg)
        with self.lock:
            self.sock.sendall(data)

    def recv(self) -> dict | None:
        while True:
            msg = self.decoder.next_message()
            if msg is not None:
                return msg
            data = self.sock.recv(65536)
            if not data:
                return None
            self.decoder.receive_data(data)


def reasoning_override(setting: str) -> str:
    """``--reasoning-format`` (:data:`REASONING_FORMAT_SETTINGS`) as ``ChatTemplate``'s and
    ``detect``'s ``reasoning_format`` / ``override``: "none" is their "" (not a reasoning model)."""
    if setting not in REASONING_FORMAT_SETTINGS:
        raise ValueError(f"reasoning format {setting!r:.40}: not one of {', '.join(REASONING_FORMAT_SETTINGS)}")
    return "" if setting == "none" else setting


def _chat_formatter(llm, reasoning_format: str = "auto") -> ChatTemplate:
    """The model's GGUF chat template, compiled and probed once (ChatML when it has none);
    ``reasoning_format``: the ``--reasoning-format`` setting (:func:`reasoning_override`)."""
    eos_id, bos_id = llm.token_eos(), llm.token_bos()
    eos = llm._model.token_get_text(eos_id) if eos_id != -1 else ""
    bos = llm._model.token_get_text(bos_id) if bos_id != -1 else ""
    template = llm.metadata.get("tokenizer.chat_template") or None
    return ChatTemplate(template, bos_token=bos, eos_token=eos, reasoning_format=reasoning_override(reasoning_format))


class Runner:
    def __init__(self, args):
        self.args = args

    def load(self):
        self.start_disk_tier()
        if not llama_cpp.llama_supports_rpc():
            raise RuntimeError(
                "llama-cpp-python was built without RPC support; run `make install` "
                "(it builds llama-cpp-python with -DGGML_RPC=on)"
            )
        from hydra_node.runtime.rpc.ggml import load as load_ggml
        from hydra_node.runtime.child.rpc_coordinator import output_projection_on_host
        from hydra_node.runtime.runner import llama_params

        gpu_devices = llama_params.count_gpu_devices(load_ggml())  # before any RPC device joins the registry
        a = self.args  # the speed knobs ([defaults.model_fit], [defaults.hardware], [defaults.throughput])
        kwargs = llama_params.llama_kwargs(
            llama_cpp,
            n_ubatch=a.n_ubatch,
            flash_attention=a.flash_attn,
            type_k=a.type_k,
            type_v=a.type_v,
            mmap=a.mmap,
            mlock=a.mlock,
            threads=a.threads,
            threads_batch=a.threads_batch,
            n_gpu_layers=a.n_gpu_layers,
            gpu_devices=gpu_devices,
        )
        if self.args.rpc:
            from hydra_node.runtime.child.rpc_coordinator import register_rpc_servers

            register_rpc_servers(self.args.rpc)
            kwargs["n_gpu_layers"] = -1 if self.args.n_gpu_layers is None else self.args.n_gpu_layers
            if self.args.tensor_split:
                kwargs["tensor_split"] = [float(x) for x in self.args.tensor_split.split(",")]
                kwargs["split_mode"] = llama_cpp.LLAMA_SPLIT_MODE_LAYER
        t0 = time.monotonic()
        with output_projection_on_host(self.args.output_on_host):
            self.llm = llama_cpp.Llama(
                model_path=self.args.model,
                n_ctx=self.args.n_ctx,
                n_batch=self.args.n_batch,
                verbose=self.args.verbose,
                **kwargs,
            )
        ctx = self.llm._ctx.ctx
        fa = "on" if kwargs["flash_attn"] else "off"
        self.llama_report = {  # what llama.cpp runs with, read back where it can be (the ready message)
            "n_batch": int(llama_cpp.llama_n_batch(ctx)),
            "n_ubatch": int(llama_cpp.llama_n_ubatch(ctx)),
            "flash_attn": fa if a.flash_attn != "auto" else f"auto: {fa}",
            "type_k": a.type_k,
            "type_v": a.type_v,
            "use_mmap": bool(kwargs["use_mmap"] and llama_cpp.llama_supports_mmap()),
            "use_mlock": a.mlock,
            "threads": int(llama_cpp.llama_n_threads(ctx)),
            "threads_batch": int(llama_cpp.llama_n_threads_batch(ctx)),
            "gpu_layers": {
                **llama_params.gpu_report(a.n_gpu_layers, gpu_devices, len(a.rpc)),
                "n_gpu_layers": int(kwargs["n_gpu_layers"]),
            },
        }
        self.load_s = time.monotonic() - t0
        self.n_ctx = self.llm.n_ctx()
        self.formatter = _chat_formatter(self.llm, self.args.reasoning_format)
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm._model.model)
        self.n_layers = int(llama_cpp.llama_model_n_layer(self.llm._model.model))
        self.is_eog = lambda tok: bool(llama_cpp.llama_vocab_is_eog(self.vocab, tok))
        self.fim = fim_tokens(llama_cpp, self.vocab)  # None: no fill-in-the-middle tokens
        self.projector = self.load_projector(int(kwargs["n_gpu_layers"]), gpu_devices)
        self.caps = self.model_caps()
        from hydra_node.runtime.child.speculative.assemble import engine_speculation

        # --draft-endpoint / --draft-model: None without a draft (or, with the reason, a draft that cannot serve)
        self.speculation, self.speculation_disabled = engine_speculation(self.llm, self.args)
        from hydra_node.runtime.child.engine.batch import BatchEngine
        from hydra_node.runtime.child.engine.grammar_budget import GrammarLimits

        # always the batch engine (a draft speculates inside it: engine/speculation.py)
        self.engine = BatchEngine(
            self.llm,
            n_slots=self.args.parallel if self.args.continuous_batching else 1,
            prompt_cache=self.args.prompt_cache,
            send=lambda m: None,
            share_prefixes=self.args.prefix_sharing,
            min_shared_tokens=self.args.prefix_min_tokens,
            max_cached=self.args.prefix_max_entries,
            token_delay_s=self.args.inject_token_delay_ms / 1000.0,
            speculation=self.speculation,
            grammar_limits=GrammarLimits(
                self.args.grammar_token_budget_ms / 1000.0, self.args.grammar_request_budget_s
            ),
        )
        if self.projector is not None:
            self.engine.attach_media(self.projector)  # image positions: engine/media.py
        if self.args.warmup:
            self.engine.warmup(self.llm.tokenize(WARMUP_TEXT))
        self.attach_prompt_cache()
        self.n_ctx = self.engine.ctx_per_slot  # what one request may use
        self.load_s = time.monotonic() - t0  # the engine's context and warm-up are part of loading

    def load_projector(self, n_gpu_layers: int, gpu_devices: int):
        """``--mmproj``: the vision projector beside the model (child/vision.py), or None. It runs
        on a local GPU when the model's layers do (not with RPC workers: libmtmd would pick its
        own device)."""
        if not self.args.mmproj:
            return None
        from hydra_node.runtime.child.vision import Projector

        return Projector.load(
            self.args.mmproj,
            self.llm._model.model,
            model_path=self.args.model,
            n_threads=int(llama_cpp.llama_n_threads(self.llm._ctx.ctx)),
            use_gpu=n_gpu_layers != 0 and gpu_devices > 0 and not self.args.rpc,
            verbose=self.args.verbose,
        )

    def engine_report(self) -> dict:
        """How this runner generates (the ready message; shown in /api/status)."""
        report = {
            "mode": "continuous_batching",
            "parallel": self.engine.n_slots,
            "ctx_per_slot": self.engine.ctx_per_slot,
            "n_ctx_total": self.engine.n_ctx,
        }
        if not self.args.continuous_batching:
            report.update(mode="sequential", reason="continuous_batching = false (the batch engine, one slot)")
        if self.speculation is not None or self.speculation_disabled:
            report["speculation"] = (
                self.speculation.kind if self.speculation else f"disabled: {self.speculation_disabled}"
            )
        return report

    def start_disk_tier(self) -> None:
        """The prompt cache's disk tier, its model digest hashed meanwhile (docs/prompt-cache.md)."""
        from pathlib import Path

        from hydra_node.runtime.child.engine.prompt_tiers import DiskTier

        a = self.args
        self.disk_tier = None
        if a.prompt_cache and a.prompt_cache_dir and a.prompt_cache_disk_gb > 0:
            digests = Path(a.model_digests) if a.model_digests else None
            self.disk_tier = DiskTier(Path(a.prompt_cache_dir), Path(a.model), digests)

    def attach_prompt_cache(self) -> None:
        """The prompt cache's RAM and disk tiers (docs/prompt-cache.md), unless both are 0."""
        from hydra_node.runtime.child.engine.prompt_store import PromptStore
        from hydra_node.runtime.child.engine.prompt_tiers import PromptTiers

        a = self.args
        ram = a.prompt_cache_ram_mb << 20
        disk = int(a.prompt_cache_disk_gb * (1 << 30)) if self.disk_tier is not None else 0
        if not a.prompt_cache or not (ram or disk):
            return
        if self.disk_tier is not None:
            self.disk_tier.identity_of = self.kv_identity
        store: PromptStore = PromptStore(ram, disk, a.prefix_min_tokens)
        tiers = PromptTiers(self.engine, store, self.disk_tier)
        tiers.statistics()  # reads the disk tier's directory now if the digest is known (a remembered one is)
        self.engine.attach_tiers(tiers)

    def kv_identity(self, model_sha256: str):
        """This runner's KV compatibility identity, empty prefix (runner/kv_probe.py)."""
        from hydra_node.runtime.child.kv_probe import runner_identity

        return runner_identity(
            self.llm,
            n_ctx_seq=self.engine.ctx_per_slot,
            type_k=self.args.type_k,
            type_v=self.args.type_v,
            model_sha256=model_sha256,
        )

    def model_caps(self) -> ModelCaps:
        """What the model can do (the ready message's ``caps``): its reasoning format from the chat
        template (inference/reasoning.py: probed by rendering its generation prompt with the thinking
        switch unset, on and off; or ``--reasoning-format``), fill-in-the-middle from the vocabulary."""
        import dataclasses

        p = self.projector
        return dataclasses.replace(
            self.formatter.reasoning,
            fim=self.fim is not None,
            vision=p is not None and p.vision,
            audio=p is not None and p.audio,
        )

    def prompt_tokens(self, req: dict) -> list[int]:
        """The request's prompt as tokens (chat_prompt.py); :class:`InvalidPrompt` (400) when it cannot be one.
        A chat's images (``req["images"]``) go through the projector (child/vision.py): their
        positions are placeholder ids (engine/media.py), counted in the prompt's length."""
        if req["kind"] == "chat":
            images = req.get("images") or []
            if images:
                return self.image_chat_tokens(req, images)
            res = self.formatter.render(req)
            req["_reasoning"] = res.reasoning  # where a reasoning chat's output starts (engine/reasoning_track.py)
            return self.llm.tokenize(res.text.encode("utf-8"), add_bos=not res.added_special, special=True)
        if req.get("suffix"):
            return self.infill_tokens(req)
        if req.get("prompt_tokens"):  # token ids are used as they are: no BOS
            return completion_token_ids(req["prompt_tokens"], self.llm.n_vocab())
        toks = self.llm.tokenize(req.get("prompt", "").encode("utf-8"), add_bos=True, special=False)
        if not toks:  # an empty prompt (or `prompt: null`): a new document, as OpenAI's default <|endoftext|>
            toks = self.document_start()
        return toks

    def image_chat_tokens(self, req: dict, images: list) -> list[int]:
        """A chat with images: each :data:`IMAGE_MARK` of the messages' content becomes the
        projector's media marker before the template renders them (only in requests with images,
        so a user's U+FFFC elsewhere stays text), then libmtmd tokenizes text and images together."""
        if self.projector is None:
            raise InvalidPrompt(
                f"model {self.args.model_id!r} takes no images: its runner was started without a vision "
                "projector (--mmproj; the model's mmproj setting)",
                "messages",
            )
        if not isinstance(images, list) or not all(isinstance(im, dict) for im in images):
            raise InvalidPrompt("'images' must be a list of image maps", "messages")
        marker = self.projector.marker
        shaped = dict(req, messages=[_with_marker(m, marker) for m in req.get("messages") or ()])
        res = self.formatter.render(shaped)
        req["_reasoning"] = res.reasoning
        return self.projector.tokenize(res.text, images, add_special=not res.added_special, parse_special=True)

    def document_start(self) -> list[int]:
        """The tokens that start a new document: the vocabulary's own ``<|endoftext|>`` special token
        where it has one (OpenAI's default prompt), else BOS, else EOS (the document boundary)."""
        eot = self.llm.tokenize(b"<|endoftext|>", add_bos=False, special=True)
        if len(eot) == 1:
            return eot
        bos = self.llm.token_bos()
        return [bos if bos >= 0 else self.llm.token_eos()]

    def infill_tokens(self, req: dict) -> list[int]:
        """A completion with a ``suffix``: llama-server's infill layout (vocab_ops.py), BOS as the model adds it."""
        suffix = req["suffix"]
        if not isinstance(suffix, str):
            raise InvalidPrompt("'suffix' must be text")
        if self.fim is None:
            raise InvalidPrompt(
                f"model {self.args.model_id!r} has no fill-in-the-middle tokens (its vocabulary lacks a FIM "
                "prefix, suffix or middle token), so it cannot take a 'suffix': use a code model with FIM tokens"
            )
        if req.get("prompt_tokens"):
            prefix = completion_token_ids(req["prompt_tokens"], self.llm.n_vocab())
        else:
            prefix = self.llm.tokenize(req.get("prompt", "").encode("utf-8"), add_bos=False, special=False)
        bos = self.llm.tokenize(b"", add_bos=True, special=False)  # [BOS] when the model adds one, else []
        return infill_layout(
            prefix, self.llm.tokenize(suffix.encode("utf-8"), add_bos=False, special=False), self.fim, bos
        )

    def tokenize_answer(self, rid: int, wire) -> dict:
        """The answer to a ``tokenize`` op (vocab_ops.py; on the tokenizer thread)."""
        return tokenize_answer(
            llama_cpp,
            self.vocab,
            self.llm.n_vocab(),
            lambda text, add, special: self.llm.tokenize(text, add_bos=add, special=special),
            rid,
            wire,
        )


def _with_marker(message, marker: str):
    """A wire message (``[role, content]`` or a map) with :data:`IMAGE_MARK` in its content replaced by ``marker``."""
    if isinstance(message, (list, tuple)) and len(message) == 2 and isinstance(message[1], str):
        return [message[0], message[1].replace(IMAGE_MARK, marker)]
    if isinstance(message, dict) and isinstance(message.get("content"), str):
        return {**message, "content": message["content"].replace(IMAGE_MARK, marker)}
    return message


def _reader(ch: Channel, runner: Runner, work: "queue.Queue", tokenizer: TokenizerThread | None = None) -> None:
    try:
        while True:
            msg = ch.recv()
            if msg is None:
                break
            op = msg["op"]  # the strict decoder guarantees a text op and an int id when present
            if op in ("generate", "embed", "cancel", "kv_export", "kv_import", "tokenize") and "id" not in msg:
                raise ChannelError(f"{op} needs an 'id'", code="bad_message")
            if op in ("generate", "embed"):  # embed: runner/embed.py, worked between engine steps
                if not isinstance(msg.get("req"), dict):
                    raise ChannelError(f"{op} needs a 'req' map", code="bad_message")
                work.put(msg)
            elif op in ("cancel", "kv_export", "kv_import"):
                work.put(msg)  # in order with the generates; kv_*: runner/kv_jobs.py checks them
            elif op == "tokenize" and tokenizer is not None:  # its own thread: vocab_ops.py
                tokenizer.put(msg)
            elif op == "ping":
                ch.send({"op": "pong", "n": msg.get("n")})
            elif op == "shutdown":
                break
    except (OSError, ChannelError):
        pass
    work.put(None)


def build_parser() -> argparse.ArgumentParser:
    """The runner's command line, as :func:`hydra_node.runtime.runner.argv.runner_argv` writes it."""
    p = argparse.ArgumentParser(prog="hydra-node runner", description="Hydra model runner (internal)")
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--model-id", required=True)
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--n-batch", type=int, default=512)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--threads-batch", type=int, default=0)
    p.add_argument("--mlock", action="store_true")
    p.add_argument("--n-ubatch", type=int, default=512, help="llama.cpp n_ubatch ([defaults.model_fit].ubatch)")
    p.add_argument("--flash-attn", default="auto", choices=("auto", "on", "off"))
    p.add_argument("--type-k", default="f16", help="K cache ggml type ([defaults.model_fit].type_k)")
    p.add_argument("--type-v", default="f16", help="V cache ggml type ([defaults.model_fit].type_v)")
    p.add_argument("--mmap", default="auto", choices=("auto", "on", "off"))
    p.add_argument("--rpc", action="append", default=[])
    p.add_argument("--tensor-split", default="")
    p.add_argument(
        "--n-gpu-layers",
        type=int,
        default=None,
        help="layers offloaded to RPC/GPU devices (a split plan's n_gpu_layers)",
    )
    p.add_argument(
        "--output-on-host",
        action="store_true",
        help="keep the output projection in host memory (a split plan's output_on_host)",
    )
    p.add_argument(
        "--no-prefix-sharing",
        dest="prefix_sharing",
        action="store_false",
        help="never copy a prefix held by another slot ([defaults.model_fit.prefix_cache] enabled = false)",
    )
    p.add_argument(
        "--prefix-min-tokens",
        type=int,
        default=64,
        help="shortest prefix copied from another slot ([defaults.model_fit.prefix_cache] min_tokens)",
    )
    p.add_argument(
        "--prefix-max-entries",
        type=int,
        default=64,
        help="free slots that keep their cached prefix ([defaults.model_fit.prefix_cache] max_entries)",
    )
    p.add_argument(
        "--no-prompt-cache",
        dest="prompt_cache",
        action="store_false",
        help="re-evaluate every prompt from scratch instead of reusing the cached prefix",
    )
    p.add_argument("--no-warmup", dest="warmup", action="store_false", help="skip the warm-up decode")
    p.add_argument(
        "--reasoning-format",
        choices=REASONING_FORMAT_SETTINGS,
        default="auto",
        help="the model's reasoning format: auto (from its chat template), none (not a reasoning model), "
        "think or gpt-oss ([defaults.model_fit] reasoning_format; docs/reasoning.md)",
    )
    p.add_argument(
        "--prompt-cache-ram-mb",
        type=int,
        default=0,
        help="RAM tier of saved prompt prefixes, MB; 0: none ([defaults.model_fit.prefix_cache] ram_mb)",
    )
    p.add_argument(
        "--prompt-cache-disk-gb",
        type=float,
        default=0.0,
        help="disk tier of saved prompt prefixes, GB; 0: none ([defaults.model_fit.prefix_cache] disk_gb)",
    )
    p.add_argument("--prompt-cache-dir", default="", help="the disk tier's directory (HOME/prompt-cache/MODEL)")
    p.add_argument("--model-digests", default="", help="the node's table of model file digests (HOME/kv/digests.json)")
    p.add_argument(
        "--inject-token-delay-ms",
        type=float,
        default=0.0,
        help="sleep this long after every generated token (test/bench knob; [runner] config)",
    )
    p.add_argument(
        "--grammar-token-budget-ms",
        type=float,
        default=5000.0,
        help="grammar work one token may take before its request fails with grammar_too_slow ([runner] config)",
    )
    p.add_argument(
        "--grammar-request-budget-s",
        type=float,
        default=60.0,
        help="grammar work one request may take before it fails with grammar_too_slow ([runner] config)",
    )
    p.add_argument(
        "--mmproj",
        default="",
        help="a vision projector GGUF for the model (libmtmd; docs/vision.md): the runner then takes chats with images",
    )
    p.add_argument("--verbose", action="store_true")
    from hydra_node.runtime.child.speculative.assemble import add_runner_args

    p.add_argument(
        "--parallel", type=int, default=1, help="sequences decoded together ([defaults.throughput].parallel)"
    )
    p.add_argument(
        "--no-continuous-batching",
        dest="continuous_batching",
        action="store_false",
        help="the batch engine with one slot, whatever --parallel says ([defaults.throughput].continuous_batching)",
    )
    add_runner_args(p)  # --draft-endpoint / --draft-model (docs/speculative.md)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the node decides when we stop
    sock = socket.socket(fileno=args.fd)
    ch = Channel(sock)
    runner = Runner(args)
    try:
        runner.load()
    except Exception as exc:  # report why loading failed, then exit non-zero
        try:
            ch.send({"op": "fatal", "message": f"{type(exc).__name__}: {exc}"})
        except OSError:
            pass
        return 2
    ch.send(
        {
            "op": "ready",
            "pid": os.getpid(),
            "n_ctx": runner.n_ctx,
            "load_s": runner.load_s,
            "n_params": runner.llm._model.n_params(),
            "size_bytes": runner.llm._model.size(),
            "n_layers": runner.n_layers,
            "llama": runner.llama_report,
            "engine": runner.engine_report(),
            "caps": runner.caps.to_wire(),
        }
    )
    from hydra_node.runtime.child.stats import StatsCadence
    from hydra_node.runtime.child.engine_loop import run_engine_loop, work_queue_bound
    from hydra_node.runtime.child.kv_jobs import KvJobs

    kv = KvJobs(runner.engine, runner.prompt_tokens, ch.send, runner.kv_identity)
    runner.engine.send = kv.wrap(ch.send)  # an export's prefill frames stay in the child
    work: "queue.Queue" = queue.Queue(work_queue_bound(runner.engine.n_slots))
    tokenizer = TokenizerThread(runner.tokenize_answer, ch.send)
    threading.Thread(target=_reader, args=(ch, runner, work, tokenizer), daemon=True).start()
    signal.signal(signal.SIGTERM, _stop)  # the node stops us: the prompt cache keeps what slots hold
    try:  # a stop (the channel closed, SIGTERM) saves what the free slots cache: docs/prompt-cache.md
        return run_engine_loop(
            runner.engine,
            work,
            runner.prompt_tokens,
            ch.send,
            cadence=StatsCadence(),
            embed=Embedder.for_llama(runner.llm, ch.send),
            kv=kv,
        )
    except (OSError, _Stopped):
        return 0
    finally:
        runner.engine.persist()


class _Stopped(BaseException):
    """SIGTERM: leave the engine loop between two Python steps (the engine is never mid-decode)."""


def _stop(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the save that follows is not cut short by another
    raise _Stopped()


if __name__ == "__main__":
    sys.exit(main())
