"""The prompt cache's tiers through real runner children on one node home (the bundled model, one slot,
docs/prompt-cache.md): a long prompt A sent again after six other prompts took the slot is restored from
the RAM tier (``cached_tokens`` is all but its last token) with the cold run's greedy text; a new runner
on the same home restores it from the disk tier; a corrupted file of A and a file of another model's
identity are removed, never loaded, and A is prefilled with the same text."""

from __future__ import annotations

import dataclasses

import trio

from hydra_node.inference import Finished, GenerationRequest
from hydra_node.models import resolve_model
from hydra_node.runtime.artifacts.kv_state import open_kv_state, write_kv_state
from hydra_node.runtime.runner.argv import prompt_cache_dir
from hydra_node.runtime.runner.records import RunnerSettings
from hydra_node.runtime.runner.supervisor import RunnerSupervisor
from tests.waiting import wait_until

TIMEOUT_S = 300
#: about 400 tokens: A's state (9 MB) is far longer than the others'
A_TEXT = (
    "The lighthouse keeper wrote in his log every evening. He noted the wind, the colour of the sea, "
    "the ships that passed and the birds that rested on the gallery rail. "
) * 9 + "What did the keeper write about?"
OTHERS = [
    f"Story {i}: " + f"a traveller number {i} walked to the market and bought bread and apples. " * 6 for i in range(6)
]


def chat(text: str) -> GenerationRequest:
    return GenerationRequest(model="m", kind="chat", messages=(("user", text),), max_tokens=6, temperature=0.0)


async def run(sup: RunnerSupervisor, req: GenerationRequest) -> tuple[str, Finished]:
    async with sup.generate(req) as events:
        evs = [ev async for ev in events]
    assert isinstance(evs[-1], Finished)
    return "".join(getattr(e, "text", "") for e in evs[:-1]), evs[-1]


async def life(home, body) -> None:
    """One runner on ``home`` for ``body(sup)``; stopped (SIGTERM) at the end, as a node stops it."""
    sup = RunnerSupervisor(resolve_model(None), home, RunnerSettings(n_ctx=2048, parallel=1, warmup=False))
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            await body(sup)
            nursery.cancel_scope.cancel()


async def stats_after(sup: RunnerSupervisor, key: str, at_least: int):
    return await wait_until(lambda: sup.engine_stats if getattr(sup.engine_stats, key, 0) >= at_least else None)


async def test_a_prompt_survives_other_prompts_and_restarts_and_bad_files_are_never_loaded(tmp_path):
    cold: dict = {}
    cache = prompt_cache_dir(tmp_path, resolve_model(None).id)

    async def first(sup: RunnerSupervisor) -> None:
        cold["text"], a = await run(sup, chat(A_TEXT))
        assert a.cached_tokens == 0 and a.prompt_tokens > 300
        cold["n"] = a.prompt_tokens
        for text in OTHERS:  # each takes the only slot: A's cells are saved when they are given up
            await run(sup, chat(text))
        text, again = await run(sup, chat(A_TEXT))
        assert again.cached_tokens == a.prompt_tokens - 1  # all but the last token restored
        assert text == cold["text"]
        st = await stats_after(sup, "prompt_cache_hits_ram", 1)
        assert st.prompt_cache_restored_tokens == a.prompt_tokens - 1 and st.prompt_cache_saves >= 6
        assert st.prompt_cache_disk_entries >= 1 and st.prompt_cache_disk_bytes > 0

    async def restarted(sup: RunnerSupervisor) -> None:
        text, a = await run(sup, chat(A_TEXT))
        assert a.cached_tokens == cold["n"] - 1 and text == cold["text"]  # from the disk tier
        st = await stats_after(sup, "prompt_cache_hits_disk", 1)
        assert st.prompt_cache_restored_tokens == cold["n"] - 1

    await life(tmp_path, first)
    await life(tmp_path, restarted)

    # A's file corrupted (one state byte), another prompt's file re-written as another model's
    files = sorted(cache.glob("*.hykv"), key=lambda p: p.stat().st_size)
    a_file, other = files[-1], files[0]
    data = bytearray(a_file.read_bytes())
    data[-100] ^= 0xFF
    a_file.write_bytes(bytes(data))
    with open_kv_state(other) as r:
        buf = bytearray(r.header.state_bytes)
        r.read_state_into(buf)
        h = r.header
    write_kv_state(other, dataclasses.replace(h.identity, model_sha256="0" * 64), h.tokens, buf)

    async def after_damage(sup: RunnerSupervisor) -> None:
        text, a = await run(sup, chat(A_TEXT))
        assert a.cached_tokens == 0 and text == cold["text"]  # prefilled: the corrupt state never loaded
        assert not other.exists()  # another model's identity: removed when the directory was read
        assert not a_file.exists() or a_file.read_bytes() != bytes(data)  # removed (maybe saved anew since)
        st = await stats_after(sup, "prompt_cache_failures", 2)
        assert st.prompt_cache_hits_disk == 0 and st.prompt_cache_hits_ram == 0
        log = sup.logfile.read_text()
        assert "another runner's state (differs in model_sha256)" in log and "cannot be loaded" in log

    await life(tmp_path, after_damage)
