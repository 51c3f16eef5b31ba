"""A runner's own KV compatibility identity, read from its llama.cpp model and context (runner child).

Everything but the model file's digest (the node sends it: hashing a large GGUF is the node's job,
in a thread, remembered per file; :class:`~hydra_node.runtime.artifacts.kv_identity.FileDigests`)
and the prefix (set per state with :meth:`KvIdentity.with_prefix`).  Read once, on the first
export or import: the vocabulary walk costs tens of milliseconds.

* build: llama-cpp-python's version and the linked llama and ggml versions with ggml's commit
  (``llama_version``, ``ggml_version``, ``ggml_commit`` from the loaded library).  Not the CPU
  feature list (``llama_print_system_info``): it differs between hosts of one build without
  changing how the cells are laid out;
* tokenizer: sha256 over the vocabulary type, size and every token's text and attributes;
* RoPE: the context's base and scale when set, else the model's (``<arch>.rope.freq_base``,
  ``llama_model_rope_freq_scale_train``), and ``llama_model_rope_type``;
* flash attention as the context runs it (``flash_attn_type`` after loading; it decides whether V
  is stored transposed).
"""

from __future__ import annotations

import ctypes
import hashlib

from hydra_node.runtime.artifacts.kv_identity import KvIdentity

__all__ = ["build_identity", "runner_identity", "tokenizer_sha256"]

#: llama.cpp's RoPE base when a GGUF names none (``llama_hparams``' default).
DEFAULT_ROPE_FREQ_BASE = 10000.0


def build_identity(llama_cpp) -> str:
    lib = llama_cpp.llama_cpp._lib
    parts = []
    for name in ("llama_version", "ggml_version", "ggml_commit"):
        fn = getattr(lib, name, None)
        if fn is None:
            parts.append(f"{name}=?")
            continue
        fn.restype, fn.argtypes = ctypes.c_char_p, []
        parts.append(f"{name}={(fn() or b'?').decode('utf-8', 'replace')}")
    return f"llama-cpp-python={llama_cpp.__version__} " + " ".join(parts)


def tokenizer_sha256(llama_cpp, vocab) -> str:
    n = int(llama_cpp.llama_vocab_n_tokens(vocab))
    h = hashlib.sha256(f"type={int(llama_cpp.llama_vocab_type(vocab))} n={n}\0".encode())
    for i in range(n):
        h.update(llama_cpp.llama_vocab_get_text(vocab, i) or b"")
        h.update(b"\0%d\0" % int(llama_cpp.llama_vocab_get_attr(vocab, i)))
    return h.hexdigest()


def runner_identity(llm, *, n_ctx_seq: int, type_k: str, type_v: str, model_sha256: str) -> KvIdentity:
    """This runner's identity for an empty prefix (``with_prefix`` sets the real one)."""
    import llama_cpp

    model = llm._model.model
    arch = str(llm.metadata.get("general.architecture", "")) or "unknown"
    cp = llm.context_params
    base = float(cp.rope_freq_base) or float(llm.metadata.get(f"{arch}.rope.freq_base", DEFAULT_ROPE_FREQ_BASE))
    scale = float(cp.rope_freq_scale) or float(llama_cpp.llama_model_rope_freq_scale_train(model))
    vocab = llama_cpp.llama_model_get_vocab(model)
    return KvIdentity(
        model_sha256=model_sha256,
        build=build_identity(llama_cpp),
        architecture=arch,
        tokenizer_sha256=tokenizer_sha256(llama_cpp, vocab),
        n_ctx_seq=int(n_ctx_seq),
        rope_type=int(llama_cpp.llama_model_rope_type(model)),
        rope_freq_base=base,
        rope_freq_scale=scale,
        type_k=type_k,
        type_v=type_v,
        flash_attention=int(cp.flash_attn_type) == 1,
        n_embd=int(llama_cpp.llama_model_n_embd(model)),
        n_layer=int(llama_cpp.llama_model_n_layer(model)),
        n_head=int(llama_cpp.llama_model_n_head(model)),
        n_head_kv=int(llama_cpp.llama_model_n_head_kv(model)),
        n_tokens=0,
        prefix_sha256=hashlib.sha256(b"").hexdigest(),
    )
