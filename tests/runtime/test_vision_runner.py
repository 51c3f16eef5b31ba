"""The runner side of vision (hydra_node/runtime/child/vision.py, docs/vision.md) with the real
bundled model and the synthetic ``mlp`` projector fixture (tests/fixtures/vision_model.py: random
weights, not a real vision model): loading and its refusals, tokenizing a chat's images into
placeholder positions, the embeddings the engine asks for (encoded once, cached by hash, bounded),
and, through a real runner child, greedy generations that depend on the image."""

from __future__ import annotations

import numpy as np
import pytest
import trio

from hydra_node.inference import ChatMessage, Finished, GenerationError, GenerationRequest, TextDelta
from hydra_node.inference.images import IMAGE_MARK, ImageBlob, image_sha256
from hydra_node.models import ModelRef
from hydra_node.runtime.child.chat_prompt import InvalidPrompt
from hydra_node.runtime.child.engine.media import is_media, placeholder_ids
from hydra_node.runtime.runner.records import RunnerSettings
from hydra_node.runtime.runner.supervisor import RunnerSupervisor
from tests.fixtures.vision_model import (
    IMAGE_A,
    IMAGE_B,
    N_IMAGE_TOKENS,
    TEXT_N_EMBD,
    bad_images,
    huge_png_header,
    png_bytes,
    projector_path,
    write_projector,
)

pytestmark = pytest.mark.live

TIMEOUT_S = 300


def wire_image(data: bytes) -> dict:
    return {"sha256": image_sha256(data), "mime": "image/png", "width": 32, "height": 32, "data": data}


def chat_wire(text: str, *images: bytes) -> dict:
    return {"kind": "chat", "messages": [["user", text]], "images": [wire_image(d) for d in images]}


@pytest.fixture(scope="module")
def runner(model_path):
    """A Runner loaded in this process (no child, no channel) with the projector fixture."""
    from hydra_node.runtime.child.main import Runner, build_parser

    argv = ["--fd", "0", "--model", str(model_path), "--model-id", "smol", "--n-ctx", "1024", "--no-warmup"]
    r = Runner(build_parser().parse_args([*argv, "--mmproj", str(projector_path())]))
    r.load()
    yield r
    r.engine.close()
    r.projector.close()


def test_the_fixture_loads_and_the_runner_reports_vision(runner) -> None:
    assert projector_path().is_file() and projector_path() == projector_path()  # cached
    assert runner.caps.vision and not runner.caps.audio
    assert runner.caps.to_wire()["vision"] is True
    assert runner.projector.n_embd == TEXT_N_EMBD
    assert runner.projector.marker.startswith("<__media_") and runner.projector.marker != "<__media__>"


def test_a_chat_with_an_image_tokenizes_to_placeholders_in_place(runner) -> None:
    toks = runner.prompt_tokens(chat_wire(f"Look: {IMAGE_MARK}! Describe it.", IMAGE_A))
    # the template rendered the marker where the mark was; the text on either side is tokenized as
    # the text path tokenizes (special tokens parsed), the image is 4 placeholders between them
    marker = runner.projector.marker
    rendered = runner.formatter.render({"kind": "chat", "messages": [["user", f"Look: {marker}! Describe it."]]})
    before, after = rendered.text.split(marker)

    def tok(s: str) -> list[int]:
        return runner.llm.tokenize(s.encode(), add_bos=False, special=True)

    assert toks == tok(before) + placeholder_ids(image_sha256(IMAGE_A), N_IMAGE_TOKENS) + tok(after)
    assert not is_media(toks[-1])  # the prompt ends with text

    two = runner.prompt_tokens(chat_wire(f"{IMAGE_MARK} and {IMAGE_MARK}?", IMAGE_A, IMAGE_B))
    media = [t for t in two if is_media(t)]
    assert media == placeholder_ids(image_sha256(IMAGE_A), 4) + placeholder_ids(image_sha256(IMAGE_B), 4)


def test_a_typed_marker_stays_text_and_a_chat_without_images_is_untouched(runner) -> None:
    for typed in ("<__media__>", IMAGE_MARK):  # libmtmd's default marker; a U+FFFC in a chat without images
        toks = runner.prompt_tokens({"kind": "chat", "messages": [["user", f"a {typed} b"]]})
        assert not any(is_media(t) for t in toks)
    toks = runner.prompt_tokens(chat_wire(f"<__media__> {IMAGE_MARK}.", IMAGE_A))
    assert sum(map(is_media, toks)) == N_IMAGE_TOKENS


def test_bad_images_are_400s_naming_the_image(runner) -> None:
    good = IMAGE_A
    for name, data in bad_images().items():
        with pytest.raises(InvalidPrompt) as err:
            runner.prompt_tokens(chat_wire(f"{IMAGE_MARK}{IMAGE_MARK}{IMAGE_MARK}.", good, data, IMAGE_B))
        assert err.value.status == 400 and err.value.code == "invalid_prompt", name
        assert f"image 2 of 3 (sha256 {image_sha256(data)[:16]}" in str(err.value), name
        assert "could not be decoded" in str(err.value), name
    for w, h in ((20_000, 20_000), (8000, 6000)):  # beyond Pillow's own bomb guard; beyond ours only
        with pytest.raises(InvalidPrompt, match=r"image 1 of 1 .* has more than 40000000 pixels"):
            runner.prompt_tokens(chat_wire(f"{IMAGE_MARK}.", huge_png_header(w, h)))
    elided = dict(wire_image(IMAGE_A), data=b"")
    with pytest.raises(InvalidPrompt, match="image 1 of 1 .* without its bytes"):
        runner.prompt_tokens({"kind": "chat", "messages": [["user", f"{IMAGE_MARK}."]], "images": [elided]})
    wrong = dict(wire_image(IMAGE_A), sha256=image_sha256(IMAGE_B))
    with pytest.raises(InvalidPrompt, match="do not match its sha256"):
        runner.prompt_tokens({"kind": "chat", "messages": [["user", f"{IMAGE_MARK}."]], "images": [wrong]})


def test_images_the_prompt_does_not_place_or_a_prompt_ending_in_an_image_are_refused(runner) -> None:
    with pytest.raises(InvalidPrompt, match="placed 1 of the request's 2 images"):
        runner.prompt_tokens(chat_wire(f"only one {IMAGE_MARK}", IMAGE_A, IMAGE_B))
    proj = runner.projector
    with pytest.raises(InvalidPrompt, match="ends with an image"):
        proj.tokenize(f"hello {proj.marker}", [wire_image(IMAGE_A)], add_special=False)
    toks = proj.tokenize(f"hello {proj.marker} there", [wire_image(IMAGE_A)], add_special=False)
    assert sum(map(is_media, toks)) == N_IMAGE_TOKENS


def test_rows_are_the_images_embeddings_encoded_once_and_cached(runner) -> None:
    proj = runner.projector
    runner.prompt_tokens(chat_wire(f"{IMAGE_MARK}{IMAGE_MARK}.", IMAGE_A, IMAGE_B))
    pa, pb = placeholder_ids(image_sha256(IMAGE_A), 4), placeholder_ids(image_sha256(IMAGE_B), 4)
    before = proj.encoded
    a = np.frombuffer(proj.rows(pa), np.float32).reshape(4, TEXT_N_EMBD)
    assert np.isfinite(a).all() and 0.05 < float(a.std()) < 0.5  # the magnitude of token embeddings
    assert proj.rows(pa[1:3]) == a[1:3].tobytes() and proj.rows(pa) == a.tobytes()
    both = np.frombuffer(proj.rows(pa[2:] + pb[:2]), np.float32).reshape(4, TEXT_N_EMBD)
    assert (both[:2] == a[2:]).all() and not np.allclose(both[2:], a[:2])  # another image, other rows
    assert proj.encoded - before <= 2  # each image at most once (A may have been cached by an earlier test)
    runner.prompt_tokens(chat_wire(f"{IMAGE_MARK} again.", IMAGE_A))
    n = proj.encoded
    assert proj.rows(pa) == a.tobytes() and proj.encoded == n  # from the cache
    with pytest.raises(KeyError, match="no image"):
        proj.rows([-12345])


def test_the_projector_holds_bounded_memory_over_many_images(runner) -> None:
    proj = runner.projector
    proj.max_pending, proj.max_cache_bytes = 3, 2 * 4 * TEXT_N_EMBD * 4  # 3 chunks, 2 images' rows
    try:
        imgs = [png_bytes(8, 8, 100 + i) for i in range(8)]
        for data in imgs:
            runner.prompt_tokens(chat_wire(f"{IMAGE_MARK}.", data))
            assert proj.stats()["images_pending"] <= 3
        with pytest.raises(KeyError):  # dropped before it was encoded
            proj.rows(placeholder_ids(image_sha256(imgs[0]), 4))
        for data in imgs[-3:]:
            assert len(proj.rows(placeholder_ids(image_sha256(data), 4))) == 4 * TEXT_N_EMBD * 4
            st = proj.stats()
            assert st["images_cached"] <= 2 and st["cache_bytes"] <= proj.max_cache_bytes
        assert proj.stats()["images_pending"] == 0
        assert len(proj._where) == 4 * len(proj._images) <= 4 * 5  # placeholders forgotten with their images
    finally:
        proj.max_pending, proj.max_cache_bytes = 256, 256 << 20


def test_a_projector_of_another_width_is_refused_naming_both_files(model_path, tmp_path) -> None:
    import llama_cpp

    from hydra_node.runtime.child.vision import Projector

    bad = write_projector(tmp_path / "wide.gguf", n_embd=512)
    llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=64, verbose=False)
    with pytest.raises(RuntimeError) as err:
        Projector.load(str(bad), llm._model.model, model_path=str(model_path), n_threads=1, use_gpu=False)
    msg = str(err.value)
    assert str(bad) in msg and str(model_path) in msg and "576" in msg and "512" in msg, msg


# ---- through a real runner child ----------------------------------------------------------------


def image_chat(text: str, *images: bytes, max_tokens: int = 12) -> GenerationRequest:
    blobs = tuple(ImageBlob(image_sha256(d), d, "image/png", 32, 32) for d in images)
    return GenerationRequest(
        model="smol",
        kind="chat",
        messages=(ChatMessage("user", text),),
        images=blobs,
        max_tokens=max_tokens,
        temperature=0.0,
    )


async def run(sup: RunnerSupervisor, req: GenerationRequest) -> tuple[str, Finished]:
    async with sup.generate(req) as events:
        evs = [ev async for ev in events]
    assert isinstance(evs[-1], Finished)
    return "".join(e.text for e in evs[:-1] if isinstance(e, TextDelta)), evs[-1]


async def serve(tmp_path, model: ModelRef, check) -> None:
    settings = RunnerSettings(n_ctx=1024, warmup=False)
    sup = RunnerSupervisor(model, tmp_path, settings, node_id="n")
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            await check(sup)
            nursery.cancel_scope.cancel()


async def test_a_runner_with_a_projector_answers_about_the_image(tmp_path, model_path) -> None:
    ask = f"Describe this image: {IMAGE_MARK}"

    async def check(sup: RunnerSupervisor) -> None:
        assert sup.caps is not None and sup.caps.vision
        a1, fin = await run(sup, image_chat(ask, IMAGE_A))
        plain, fin_plain = await run(sup, image_chat("Describe this image: "))
        assert fin.prompt_tokens == fin_plain.prompt_tokens + N_IMAGE_TOKENS  # usage counts image positions
        a2, _ = await run(sup, image_chat(ask, IMAGE_A))
        b, _ = await run(sup, image_chat(ask, IMAGE_B))
        assert a1 and a1 == a2  # greedy: the same image gives the same answer
        assert a1 != b and a1 != plain, (a1, b, plain)  # the image changes the answer
        with pytest.raises(GenerationError) as err:
            await run(sup, image_chat(ask, bad_images()["truncated_png"]))
        assert (err.value.status, err.value.code) == (400, "invalid_prompt")
        assert "image 1 of 1" in str(err.value) and "could not be decoded" in str(err.value)
        again, _ = await run(sup, image_chat(ask, IMAGE_A))  # still serving, same answer
        assert again == a1 and sup.restarts == 0

    await serve(tmp_path, ModelRef("smol", model_path, mmproj=projector_path()), check)


async def test_a_runner_without_a_projector_refuses_images_with_a_400(tmp_path, model_path) -> None:
    async def check(sup: RunnerSupervisor) -> None:
        assert sup.caps is not None and not sup.caps.vision
        with pytest.raises(GenerationError) as err:
            await run(sup, image_chat(f"What is this? {IMAGE_MARK}", IMAGE_A))
        assert (err.value.status, err.value.code) == (400, "invalid_prompt")
        assert "'smol'" in str(err.value) and "--mmproj" in str(err.value)
        text, _ = await run(sup, image_chat("Hello"))  # still serving
        assert text

    await serve(tmp_path, ModelRef("smol", model_path), check)
