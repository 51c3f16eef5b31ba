"""The artifact_fetch stream's pure parts: the header, the reply checker's order rules, and the
announcement entry; a holder's frames in any order give data, a typed refusal or WireError."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.signing import SigningKey

from hydra_node.runtime.artifacts.errors import ManifestInvalid
from hydra_node.runtime.artifacts.manifest import ArtifactFile, Manifest
from hydra_node.runtime.artifacts.peer_wire import (
    HELD_ARTIFACTS_KEY,
    MAX_ANNOUNCED_ARTIFACTS,
    ArtifactReplyChecker,
    ArtifactRequest,
    WireError,
    held_artifacts_extra,
    held_artifacts_from_extra,
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
