"""A model runner stand-in for tests and benches: plan, register, load, generate.

``python tests/runtime/rpc/coordinator_child.py SPEC_JSON`` where SPEC is
``{"model": path, "workers": [readiness dicts], "host_free": int, "prompts": [...],
"max_tokens": int, "mode": "compare" | "stream"}``.  Prints JSON lines on stdout:
``{"plan": ...}``, ``{"evidence": ...}``, then per prompt ``{"prompt", "split", "local"}``
with greedy token ids and text for each
(compare) or ``{"token": i}`` per streamed token (stream), then ``{"done": true}``.
Runs as a separate process because llama.cpp aborts the process when a worker dies.
"""

from __future__ import annotations

import json
import sys

import llama_cpp

from hydra_node.runtime.rpc import Capacity, ProtoVersion, WorkerInfo, plan_split
from hydra_node.runtime.child.rpc_coordinator import (
    LlamaLogCapture,
    layer_devices,
    llama_kwargs_for_plan,
    output_projection_on_host,
    placement_evidence,
    register_rpc_servers,
    rpc_devices,
    verify_placement,
)

N_LAYERS = 30  # SmolLM2-135M


def emit(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


def greedy(llm: llama_cpp.Llama, prompt: str, n: int) -> dict:
    """``n`` greedy token ids (fresh KV cache each time) and their text."""
    llm.reset()
    ids = []
    for tok in llm.generate(llm.tokenize(prompt.encode()), temp=0.0, top_k=1, reset=True):
        if tok == llm.token_eos() or len(ids) == n:
            break
        ids.append(tok)
    return {"ids": ids, "text": llm.detokenize(ids).decode(errors="replace")}


def main() -> None:
    spec = json.loads(sys.argv[1])
    workers = [
        WorkerInfo(f"w{i}", w["endpoint"], ProtoVersion.parse(w["proto"]), w["free_bytes"], float(i))
        for i, w in enumerate(spec["workers"])
    ]
    model = spec["model"]
    from pathlib import Path

    plan = plan_split(
        Path(model).stat().st_size,
        N_LAYERS,
        Capacity(spec["host_free"]),
        workers,
        force_split=spec.get("force_split", False),
    )
    emit({"plan": plan.to_status()})
    names = register_rpc_servers(list(plan.rpc_endpoints))
    with LlamaLogCapture() as log, output_projection_on_host(plan.output_on_host):
        split = llama_cpp.Llama(model, n_ctx=512, n_threads=1, seed=0, verbose=False, **llama_kwargs_for_plan(plan))
    verify_placement(plan, log.lines)
    emit(
        {
            "evidence": {
                "devices": names,
                "registry": [d.name for d in rpc_devices()],
                "buffers": placement_evidence(log.lines),
                "layers": layer_devices(log.lines),
            }
        }
    )
    if spec["mode"] == "compare":
        with LlamaLogCapture() as log:
            local = llama_cpp.Llama(model, n_ctx=512, n_threads=1, seed=0, verbose=False, n_gpu_layers=0)
        emit({"local_buffers": placement_evidence(log.lines)})
        for prompt in spec["prompts"]:
            emit(
                {
                    "prompt": prompt,
                    "split": greedy(split, prompt, spec["max_tokens"]),
                    "local": greedy(local, prompt, spec["max_tokens"]),
                }
            )
    else:
        stream = split.create_completion(
            spec["prompts"][0], max_tokens=spec["max_tokens"], temperature=0.0, stream=True
        )
        for i, _ in enumerate(stream):
            emit({"token": i})
    emit({"done": True})


if __name__ == "__main__":
    main()
