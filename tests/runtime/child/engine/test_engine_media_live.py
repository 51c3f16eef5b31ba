"""Image positions in the batch engine with the real bundled model, no projector needed (docs/vision.md).

A text prompt has a run of its tokens replaced by placeholder ids, and the engine's ``MediaRows`` gives
those positions the tokens' own input embeddings (``token_embd.weight`` of the bundled GGUF,
dequantized with the ``gguf`` package): the embeddings batch then computes exactly what the token
batch would, so greedy output must be the plain prompt's.  Then: image and text rows share steps in a
full batch, the prompt cache and the RAM tier reuse a prefix through the image run, and the refusals
(no projector, a prompt ending with an image, a KV export) are clear.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from hydra_node.runtime.child.engine.media import placeholder_ids
from hydra_node.runtime.child.process import TokenClock

pytestmark = pytest.mark.live

PROMPT = b"The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is"
OTHERS = [b"Once upon a time", b"1, 2, 3, 4,", b"def fib(n):"]
GREEDY = {"temperature": 0.0, "max_tokens": 12}
RUN = slice(4, 12)  # the tokens an "image" stands for: inside the prompt, text on both sides


class TokenRows:
    """A ``MediaRows`` whose rows are the input embeddings of the tokens the placeholders replaced."""

    def __init__(self, model_path, stands_for: dict[int, int]):
        import gguf

        reader = gguf.GGUFReader(str(model_path))
        t = next(x for x in reader.tensors if x.name == "token_embd.weight")
        ids = sorted(set(stands_for.values()))
        rows = gguf.quants.dequantize(np.asarray(t.data[ids]), t.tensor_type).astype(np.float32)
        self._row = {tok: rows[i] for i, tok in enumerate(ids)}
        self._of = stands_for
        self.n_embd = rows.shape[1]
        self.asked: list[int] = []  # every placeholder whose row the engine asked for

    def rows(self, placeholders: Sequence[int]) -> bytes:
        self.asked += placeholders
        return np.stack([self._row[self._of[p]] for p in placeholders]).tobytes()


def _engine(model_path, n_slots: int = 1, **options):
    import llama_cpp

    from hydra_node.runtime.child.engine.batch import BatchEngine

    llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=1024, n_batch=128, verbose=False)
    frames: list[dict] = []
    eng = BatchEngine(llm, n_slots=n_slots, send=frames.append, **{"prompt_cache": False, **options})
    eng.frames = frames  # type: ignore[attr-defined]
    return eng


@pytest.fixture(scope="module")
def texts(model_path):
    """(plain prompt tokens, the same with an image run, its MediaRows)."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=256, vocab_only=True, verbose=False)
    plain = llm.tokenize(PROMPT)
    marks = placeholder_ids("c" * 64, RUN.stop - RUN.start)
    with_image = plain[: RUN.start] + marks + plain[RUN.stop :]
    return plain, with_image, dict(zip(marks, plain[RUN]))


def _run(eng, reqs: dict[int, tuple[list[int], dict]]) -> dict[int, tuple[str, dict]]:
    eng.frames.clear()
    for rid, (tokens, req) in reqs.items():
        eng.submit(rid, req, list(tokens), TokenClock())
    while not eng.idle:
        eng.step()
    return {
        rid: (
            "".join(f["text"] for f in eng.frames if f["id"] == rid and f["op"] == "delta"),
            next(f for f in eng.frames if f["id"] == rid and f["op"] in ("done", "error")),
        )
        for rid in reqs
    }


def _record_steps(eng) -> list[tuple[int, int]]:
    """(image rows, token rows) of every step from now on."""
    seen: list[tuple[int, int]] = []
    fill = eng._fill_media

    def spy(plan):
        n = fill(plan)
        seen.append((n, eng._batch.n_tokens))
        return n

    eng._fill_media = spy
    return seen


def test_token_embeddings_as_image_rows_give_the_plain_prompts_greedy_output(model_path, texts):
    plain, with_image, stands_for = texts
    eng = _engine(model_path)
    try:
        ref_text, ref = _run(eng, {1: (plain, GREEDY)})[1]
        eng.clear_cache()
        media = TokenRows(model_path, stands_for)
        eng.attach_media(media)
        steps = _record_steps(eng)
        text, done = _run(eng, {2: (with_image, GREEDY)})[2]
        eng.clear_cache()
        marks = list(stands_for)  # the control: the same rows in the reverse order change the answer
        eng.attach_media(TokenRows(model_path, dict(zip(marks, reversed([stands_for[m] for m in marks])))))
        other, _ = _run(eng, {3: (with_image, GREEDY)})[3]
    finally:
        eng.close()
    assert other != ref_text  # the rows really are what the model reads at those positions
    assert ref["op"] == done["op"] == "done"
    assert ref_text and text == ref_text and done["completion_tokens"] == ref["completion_tokens"]
    assert done["prompt_tokens"] == len(with_image) == len(plain)  # an image's positions count
    assert sorted(media.asked) == sorted(stands_for)  # each image row asked for once
    assert (RUN.stop - RUN.start, 0) in steps  # the image run was a step of embeddings only


def test_image_rows_share_steps_with_text_sequences_in_a_full_batch(model_path, texts):
    plain, with_image, stands_for = texts
    eng = _engine(model_path, n_slots=4)
    try:
        eng.attach_media(TokenRows(model_path, stands_for))
        steps = _record_steps(eng)
        others = {10 + i: (eng.llm.tokenize(p), GREEDY) for i, p in enumerate(OTHERS)}
        out = _run(eng, {1: (with_image, GREEDY), **others})
        for rid, (tokens, _) in others.items():
            text, end = out[rid]
            assert end["op"] == "done" and end["prompt_tokens"] == len(tokens) and text
        assert out[1][1]["op"] == "done" and out[1][1]["completion_tokens"] >= 1 and out[1][0]
        assert any(n_img and n_tok for n_img, n_tok in steps)  # one step: image rows and token rows
    finally:
        eng.close()


def test_the_prompt_cache_reuses_a_prefix_through_the_image(model_path, texts):
    plain, with_image, stands_for = texts
    eng = _engine(model_path, prompt_cache=True)
    try:
        media = TokenRows(model_path, stands_for)
        eng.attach_media(media)
        _run(eng, {1: (with_image, {**GREEDY, "max_tokens": 2})})
        media.asked.clear()
        more = with_image + eng.llm.tokenize(b" Rome. The capital of Spain is", add_bos=False)
        text, done = _run(eng, {2: (more, GREEDY)})[2]
        assert done["op"] == "done" and text
        # through the image run and the text after it (and the first answer token, when " Rome" it was)
        assert done["cached_tokens"] >= len(with_image) > RUN.stop
        assert media.asked == []  # the image was not evaluated again
        assert eng.statistics().prefix_hits == 1
    finally:
        eng.close()


class Disk:
    """The disk tier's seam as PromptTiers uses it, recording the files it would write."""

    write_failures = removed = 0

    def __init__(self) -> None:
        self.written: list[tuple[int, ...]] = []

    def poll_ready(self, store) -> bool:
        return True

    def completed(self) -> list:
        return []

    def write(self, key, tokens, state) -> bool:
        self.written.append(tokens)
        return True

    def remove(self, key, why) -> None:
        pass

    def flush(self) -> bool:
        return True


def test_the_ram_tier_saves_and_restores_a_prefix_holding_an_image_and_the_disk_never_gets_it(model_path, texts):
    from hydra_node.runtime.child.engine.prompt_store import PromptStore
    from hydra_node.runtime.child.engine.prompt_tiers import PromptTiers

    plain, with_image, stands_for = texts
    eng = _engine(model_path, prompt_cache=True)
    disk = Disk()
    try:
        media = TokenRows(model_path, stands_for)
        eng.attach_media(media)
        eng.attach_tiers(PromptTiers(eng, PromptStore(64 << 20, 64 << 20, 4), disk))
        ref_text, _ = _run(eng, {1: (with_image, GREEDY)})[1]
        other = eng.llm.tokenize(b"Something else entirely, at some length.")
        _run(eng, {2: (other, GREEDY)})  # takes the slot: its image prefix is saved
        media.asked.clear()
        text, done = _run(eng, {3: (with_image, GREEDY)})[3]  # takes it back: the text prompt is saved
        st = eng.statistics()
        assert st.prompt_cache_saves == 2 and st.prompt_cache_hits_ram == 1, st
        assert done["cached_tokens"] == len(with_image) - 1 and media.asked == []  # restored, not re-encoded
        assert text == ref_text
        assert [t[: len(other)] for t in disk.written] == [tuple(other)]  # only the text prefix went to disk
        eng.persist()  # the slot holds the image prompt: nothing more to save (RAM ends with the runner)
        assert len(disk.written) == 1 and eng.statistics().prompt_cache_saves == 2
    finally:
        eng.close()


def test_refusals_name_the_problem(model_path, texts):
    from hydra_node.runtime.child.kv_jobs import KvJobs

    plain, with_image, stands_for = texts
    eng = _engine(model_path, n_slots=2)
    try:
        no_projector = _run(eng, {1: (with_image, GREEDY)})[1][1]
        assert no_projector["op"] == "error" and no_projector["status"] == 400
        assert no_projector["code"] == "unsupported_parameter" and "vision projector" in no_projector["message"]
        with pytest.raises(ValueError, match="576"):
            eng.attach_media(type("Wide", (), {"n_embd": 577, "rows": None})())
        eng.attach_media(TokenRows(model_path, stands_for))
        ends_in_image = _run(eng, {2: (with_image[: RUN.stop], GREEDY)})[2][1]
        assert ends_in_image["status"] == 400 and "must end with a text token" in ends_in_image["message"]
        sent: list[dict] = []
        jobs = KvJobs(eng, lambda req: with_image, sent.append, lambda sha: None)
        assert jobs.take({"op": "kv_export", "id": 3, "req": {}, "path": "/nonexistent", "model_sha256": "0" * 64})
        assert sent[0]["status"] == 400 and sent[0]["code"] == "unsupported_parameter", sent
    finally:
        eng.close()


def test_a_request_whose_image_rows_fail_fails_alone(model_path, texts):
    plain, with_image, stands_for = texts
    eng = _engine(model_path, n_slots=2)
    try:
        eng.attach_media(TokenRows(model_path, {}))  # knows no placeholder: KeyError
        out = _run(eng, {1: (with_image, GREEDY), 2: (plain, GREEDY)})
        assert out[1][1]["op"] == "error" and out[1][1]["status"] == 500 and "KeyError" in out[1][1]["message"]
        assert out[2][1]["op"] == "done" and out[2][0]
        assert eng.idle and eng.statistics().active == 0
    finally:
        eng.close()
