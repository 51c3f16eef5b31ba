"""The artifact_fetch stream's pure parts: the header, the reply checker's order rules, and the
announcement entry; a holder's frames in any order give data, a typed refusal or WireError."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.signing import SigningKey

from hydra_node.mesh.membership.announcement import MAX_EXTRA_ITEMS, _check_extra
from hydra_node.runtime.artifacts.errors import ManifestInvalid
from hydra_node.runtime.artifacts.manifest import ArtifactFile, Manifest
from hydra_node.runtime.artifacts.peer_wire import (
    HELD_ARTIFACTS_KEY,
    LATER_EXTRA_ITEMS,
    MAX_ANNOUNCED_ARTIFACTS,
    MAX_ANNOUNCED_MODEL_ARTIFACTS,
    ArtifactReplyChecker,
    ArtifactRequest,
    OffsetInvalid,
    WireError,
    extra_items,
    held_artifacts_extra,
    held_artifacts_from_extra,
    merge_held_extras,
    model_artifact_name,
    model_digest_of,
)

KEY = SigningKey(bytes([0xA1]) * 32)
MANIFEST = Manifest(
    "layer_package",
    "stage-0",
    (ArtifactFile("a", 3, "aa" * 32), ArtifactFile("b", 0, "bb" * 32), ArtifactFile("c", 2, "cc" * 32)),
    {},
    "posix:/r",
    1,
).sign(KEY)
HEAD = {"op": "manifest", "m": MANIFEST.to_cbor()}


def run(*msgs) -> tuple[ArtifactReplyChecker, list]:
    checker = ArtifactReplyChecker()
    got = [checker.feed(m) for m in msgs]
    return checker, [(f.path, b) for f, b in got if f is not None]


def test_a_complete_reply_assigns_bytes_to_files_in_order() -> None:
    checker, data = run(
        HEAD, {"op": "data", "b": b"xy"}, {"op": "data", "b": b"z"}, {"op": "data", "b": b"12"}, {"op": "end"}
    )
    assert checker.ended and checker.manifest == MANIFEST
    assert data == [("a", b"xy"), ("a", b"z"), ("c", b"12")]  # the empty file "b" has no frames


@pytest.mark.parametrize(
    "msgs",
    [
        [{"op": "data", "b": b"x"}],  # data before the manifest
        [{"op": "manifest", "m": b"junk"}],
        [{"op": "manifest"}],
        [HEAD, {"op": "data", "b": b"xyz1"}],  # across the end of file "a"
        [HEAD, {"op": "data", "b": b""}],
        [HEAD, {"op": "data", "b": "text"}],
        [HEAD, {"op": "data", "b": b"x" * 65537}],
        [HEAD, {"op": "data", "b": b"xyz"}, {"op": "end"}],  # end before file "c"
        [HEAD, {"op": "data", "b": b"xyz"}, {"op": "data", "b": b"12"}, {"op": "data", "b": b"3"}],
        [HEAD, {"op": "data", "b": b"xyz"}, {"op": "data", "b": b"12"}, {"op": "end"}, {"op": "end"}],
        [HEAD, {"op": "what"}],
        [HEAD, {"op": "end", "extra": 1}],
        [{"op": "error", "code": "nope", "message": "x"}],
        [{"op": "error", "code": "busy"}],
        [{"op": "error", "code": "busy", "message": "x"}, {"op": "end"}],
    ],
)
def test_out_of_place_frames_are_wire_errors(msgs) -> None:
    with pytest.raises((WireError, ManifestInvalid)):
        run(*msgs)


def test_a_refusal_is_reported_before_or_after_the_manifest() -> None:
    for prefix in ([], [HEAD, {"op": "data", "b": b"x"}]):
        checker, _ = run(*prefix, {"op": "error", "code": "read_failed", "message": "m" * 900})
        assert checker.error == ("read_failed", "m" * 500)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                HEAD,
                {"op": "data", "b": b"x"},
                {"op": "data", "b": b"xyz"},
                {"op": "data", "b": b"12"},
                {"op": "end"},
                {"op": "data"},
                {"op": "error", "code": "busy", "message": "m"},
                {"op": 5},
            ]
        ),
        max_size=8,
    )
)
def test_any_frame_sequence_gives_data_or_a_typed_error(msgs) -> None:
    checker = ArtifactReplyChecker()
    total = 0
    try:
        for m in msgs:
            _, block = checker.feed(m)
            total += len(block)
    except (WireError, ManifestInvalid):
        return
    assert total <= MANIFEST.size
    if checker.ended:
        assert total == MANIFEST.size


def test_headers() -> None:
    assert ArtifactRequest.from_header(ArtifactRequest("kv_state", "p").header()) == ArtifactRequest("kv_state", "p")
    for header in (
        {"kind": "artifact_fetch", "artifact": "kv", "name": "p"},
        {"kind": "artifact_fetch", "artifact": "kv_state", "name": "../p"},
        {"kind": "artifact_fetch", "artifact": "kv_state", "name": "p", "path": "/etc/passwd"},
        {"kind": "model_fetch", "artifact": "kv_state", "name": "p"},
    ):
        with pytest.raises(WireError):
            ArtifactRequest.from_header(header)


def test_the_announcement_entry_round_trips_and_skips_malformed_items() -> None:
    extra = held_artifacts_extra([MANIFEST] * (MAX_ANNOUNCED_ARTIFACTS + 3))
    assert len(extra[HELD_ARTIFACTS_KEY]) == MAX_ANNOUNCED_ARTIFACTS
    assert held_artifacts_from_extra(extra) == {("layer_package", "stage-0"): MANIFEST.manifest_id}
    assert held_artifacts_extra([]) == {}
    bad = {
        HELD_ARTIFACTS_KEY: [
            ["kv", "p", "a" * 64],
            ["kv_state", "p", "A" * 64],
            ["kv_state", "p"],
            "x",
            ["kv_state", "ok", "b" * 64],
        ]
    }
    assert held_artifacts_from_extra(bad) == {("kv_state", "ok"): "b" * 64}
    assert held_artifacts_from_extra({HELD_ARTIFACTS_KEY: "nope"}) == {}


ONE_FILE = Manifest("model_weights", "sha256:" + "dd" * 32, (ArtifactFile("m.gguf", 5, "dd" * 32),), {}, "posix:/r", 1)


def test_an_offset_header_round_trips_and_is_sent_only_when_resuming() -> None:
    assert ArtifactRequest("model_weights", "w").header() == {
        "kind": "artifact_fetch",
        "artifact": "model_weights",
        "name": "w",
    }  # offset 0: the header a holder of the previous generation accepts
    req = ArtifactRequest("model_weights", "w", 7)
    assert req.header() == {"kind": "artifact_fetch", "artifact": "model_weights", "name": "w", "offset": 7}
    assert ArtifactRequest.from_header(req.header()) == req
    assert ArtifactRequest.from_header({**req.header(), "offset": 1 << 40}).offset == 1 << 40


@pytest.mark.parametrize("offset", [-1, 0, True, 1.5, "3", None, (1 << 40) + 1])
def test_a_bad_offset_is_a_typed_refusal(offset) -> None:
    header = {"kind": "artifact_fetch", "artifact": "model_weights", "name": "w", "offset": offset}
    with pytest.raises(OffsetInvalid, match="offset"):
        ArtifactRequest.from_header(header)
    with pytest.raises(WireError, match="exactly"):
        ArtifactRequest.from_header({**header, "extra": 1})


def test_the_checker_takes_a_single_files_bytes_from_the_offset() -> None:
    checker = ArtifactReplyChecker(3)
    assert checker.feed({"op": "manifest", "m": ONE_FILE.sign(KEY).to_cbor()}) == (None, b"")
    assert checker.feed({"op": "data", "b": b"de"})[1] == b"de"
    with pytest.raises(WireError, match="more bytes"):
        checker.feed({"op": "data", "b": b"f"})  # 2 bytes from offset 3 of 5 were all there was
    at_end = ArtifactReplyChecker(5)
    at_end.feed({"op": "manifest", "m": ONE_FILE.sign(KEY).to_cbor()})
    at_end.feed({"op": "end"})
    assert at_end.ended
    for offset, manifest in ((6, ONE_FILE.sign(KEY)), (1, MANIFEST)):  # past the end; several files
        with pytest.raises(WireError, match="one file"):
            ArtifactReplyChecker(offset).feed({"op": "manifest", "m": manifest.to_cbor()})


def test_model_names_are_content_addressed_and_the_held_lists_merge() -> None:
    digest = "ab" * 32
    assert model_artifact_name(digest) == "sha256:" + digest
    assert model_digest_of("model_weights", "sha256:" + digest) == digest
    for kind, name in (
        ("layer_package", "sha256:" + digest),
        ("model_weights", "sha256:" + digest[:-1]),
        ("model_weights", "w"),
    ):
        assert model_digest_of(kind, name) is None  # a placement artifact
    with pytest.raises(WireError):
        model_artifact_name("AB" * 32)
    placement = held_artifacts_extra([MANIFEST])
    models = {"models_held": [["m", digest]], HELD_ARTIFACTS_KEY: [["model_weights", "sha256:" + digest, "c" * 64]]}
    merged = merge_held_extras({"draft": "d"}, placement=placement, models=models)
    assert merged["models_held"] == [["m", digest]] and merged["draft"] == "d"
    assert merged[HELD_ARTIFACTS_KEY] == placement[HELD_ARTIFACTS_KEY] + models[HELD_ARTIFACTS_KEY]  # placement first
    assert held_artifacts_from_extra(merged)[("model_weights", "sha256:" + digest)] == "c" * 64
    assert merge_held_extras({}, placement={}, models={}) == {}


def test_cached_models_take_only_the_announcement_items_left() -> None:
    """Placement's 16 entries, 16 models_held and a telemetry summary leave room for only some of
    the cached models in artifacts_held (with a full summary, none: those go over model_fetch);
    the result is a valid announcement extra with room kept for what the relay agent and the
    signature add."""
    full = [["layer_package", f"p{i}", "a" * 64] for i in range(MAX_ANNOUNCED_ARTIFACTS)]
    models_held = [[f"m{i}", f"{i:064x}"] for i in range(16)]
    cached = [["model_weights", f"sha256:{i:064x}", "c" * 64] for i in range(MAX_ANNOUNCED_MODEL_ARTIFACTS + 5)]
    entry = {"node": "n" * 64, "model": "m", "age_ms": 1, "n": 1, **{f"k{j}": 1 for j in range(8)}}
    others = {"tm": {"v": 1, "entries": [entry] * 6}, "draft": "d"}
    placement, models = {HELD_ARTIFACTS_KEY: full}, {"models_held": models_held, HELD_ARTIFACTS_KEY: cached}
    merged = merge_held_extras(others, placement=placement, models=models)
    held = merged[HELD_ARTIFACTS_KEY]
    assert held[:MAX_ANNOUNCED_ARTIFACTS] == full  # placement's are all kept
    assert 0 < len(held) - MAX_ANNOUNCED_ARTIFACTS < MAX_ANNOUNCED_MODEL_ARTIFACTS  # models: what fits
    assert extra_items(merged) + LATER_EXTRA_ITEMS <= MAX_EXTRA_ITEMS + 1
    _check_extra(merged, 0, [MAX_EXTRA_ITEMS + 1 - LATER_EXTRA_ITEMS])  # the announcement's own check
    crowded = merge_held_extras({**others, "tm": {"v": 1, "entries": [entry] * 8}}, placement=placement, models=models)
    assert crowded[HELD_ARTIFACTS_KEY] == full
    _check_extra(crowded, 0, [MAX_EXTRA_ITEMS + 1 - LATER_EXTRA_ITEMS])
    roomy = merge_held_extras({}, placement={}, models={HELD_ARTIFACTS_KEY: cached})
    assert roomy[HELD_ARTIFACTS_KEY] == cached[:MAX_ANNOUNCED_MODEL_ARTIFACTS]
