"""protocol/vectors/caps.json (protocol/generate_vectors.py writes it): a host's ``model_caps``
announcement key (section 11.9), the ``tokenize`` stream's frames (section 11.3), and requests
carrying the capability and sampling fields (section 11.3: only non-default ones on the wire)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hydra_node.codec.framing import encode_message
from hydra_node.inference import GenerationRequest, ModelCaps, TokenizeRequest, TokenizeResult, error_message
from hydra_node.inference.errors import GenerationError
from hydra_node.mesh.wire import cbor
from hydra_node.routing.remote_tokenize import MAX_TOKENIZE_REPLY_BYTES, MAX_TOKENIZE_REQUEST_BYTES
from hydra_node.runtime.hosting.caps_wire import CAPS_KEY, caps_extra, parse_caps_extra

__all__ = ["caps_vectors"]


def caps_vectors(to_json: Callable[[Any], Any]) -> dict[str, Any]:
    extra = caps_extra(
        [
            ("qwen3", ModelCaps("think", thinks=True, switch=True)),
            ("deepseek-r1-distill", ModelCaps("think", thinks=True)),
            ("gpt-oss", ModelCaps("gpt-oss", thinks=True)),
            ("coder", ModelCaps(fim=True)),
            ("plain", ModelCaps()),
            ("smolvlm", ModelCaps(vision=True)),
            ("omni", ModelCaps("think", thinks=True, vision=True, audio=True)),
        ]
    )
    malformed = [
        ("not a map", {CAPS_KEY: ["qwen3"]}, 1),
        ("a bad entry beside a good one", {CAPS_KEY: {"ok": {"fim": True}, "bad": {"reasoning": "harmony"}}}, 1),
        ("a flag that is not a boolean", {CAPS_KEY: {"m": {"thinks": 1}}}, 1),
        ("vision that is not a boolean", {CAPS_KEY: {"m": {"vision": "yes"}, "ok": {"vision": True}}}, 1),
        ("an empty model id", {CAPS_KEY: {"": {}}}, 1),
    ]
    for name, wire, count in malformed:
        assert parse_caps_extra(wire).malformed == count, name
    tok = TokenizeRequest("m", "tokenize", content="Hello <|im_start|>", with_pieces=True, request_id="r1")
    det = TokenizeRequest("m", "detokenize", tokens=(19556, 216, 1))
    replies = [
        (
            "tokens with pieces (one not whole UTF-8: bytes)",
            TokenizeResult((19556, 216, 1), ("Hello", b"\xc4", "<|im_start|>"), served_by="n1"),
        ),
        ("a detokenized text", TokenizeResult(content="Hello <|im_start|>", served_by="n1")),
    ]
    err = GenerationError(
        "token 1000000 is outside this model's vocabulary (0 to 49151)", code="invalid_request_error", status=400
    )
    requests = [
        (
            "a completion with a suffix (fill in the middle) and llama-server's sampling fields",
            GenerationRequest(
                model="m",
                kind="completion",
                prompt="def f(",
                suffix="):\n",
                top_k=0,
                min_p=0.05,
                repeat_penalty=1.1,
                repeat_last_n=32,
            ),
        ),
        (
            "a chat request with reasoning fields",
            GenerationRequest(
                model="m",
                kind="chat",
                messages=(("user", "hi"),),
                thinking=True,
                thinking_budget=1024,
                reasoning_effort="low",
            ),
        ),
    ]
    return {
        "description": "Model capabilities and the tokenizer (protocol/README.md sections 11.3 and 11.9). "
        "'announce_extra': the model_caps key of a host's announcement extra (each ModelCaps with only its "
        "non-default keys; {} = known to have none); 'invalid_extras': values a receiver drops, with how many "
        "entries it counts as malformed. 'tokenize': the stream's request frame and reply frames (length-prefixed "
        f"canonical CBOR; at most {MAX_TOKENIZE_REQUEST_BYTES} and {MAX_TOKENIZE_REPLY_BYTES} bytes). 'requests': "
        "generate requests with the capability and sampling fields (each only when not its default).",
        "announce_extra": {
            "decoded": to_json(extra),
            "hex": cbor.encode(extra).hex(),
            "parsed": {m: to_json(c.to_wire()) for m, c in parse_caps_extra(extra).models.items()},
        },
        "invalid_extras": [{"name": n, "decoded": to_json(w), "malformed": c} for n, w, c in malformed],
        "tokenize": {
            "header": {"kind": "tokenize"},
            "requests": [
                {
                    "name": r.op,
                    "decoded": to_json(r.to_wire()),
                    "frame": encode_message(
                        {"op": "tokenize", "req": r.to_wire()}, limit=MAX_TOKENIZE_REQUEST_BYTES
                    ).hex(),
                }
                for r in (tok, det)
            ],
            "replies": [
                {
                    "name": n,
                    "decoded": to_json({"op": "tokenized", **r.to_wire()}),
                    "frame": encode_message({"op": "tokenized", **r.to_wire()}, limit=MAX_TOKENIZE_REPLY_BYTES).hex(),
                }
                for n, r in replies
            ]
            + [
                {
                    "name": "the host's error",
                    "decoded": to_json(error_message(err)),
                    "frame": encode_message(error_message(err), limit=MAX_TOKENIZE_REPLY_BYTES).hex(),
                }
            ],
        },
        "requests": [
            {"name": n, "decoded": to_json(r.to_wire()), "hex": cbor.encode(r.to_wire()).hex()} for n, r in requests
        ],
    }
