"""A model's identity (hydra_node/routing/identity.py): what a continuation checks before resuming a
generation on another target; hashed from the file, announced, carried by local and remote targets."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest
import trio

from hydra_node.mesh.membership import ModelEntry
from hydra_node.routing.identity import IDENT_HEX, ModelIdentities, model_ident
from hydra_node.routing.local import LocalRunners
from hydra_node.routing.remote import RemoteGeneration
from hydra_node.runtime.runner.records import RunnerState

A = "a" * 64


def test_the_identity_is_short_hex_of_the_file_digest_and_the_template_override():
    sha = hashlib.sha256(b"weights").hexdigest()
    ident = model_ident(sha)
    assert len(ident) == IDENT_HEX and int(ident, 16) >= 0 and ident == model_ident(sha.upper())
    assert ModelEntry("m", "ready", ident=ident).ident == ident  # announceable as it is
    assert model_ident(sha, "{{ messages }}") != ident != model_ident(hashlib.sha256(b"other").hexdigest())


async def test_identities_are_hashed_off_the_trio_thread_and_remembered(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + bytes(1000))
    ids = ModelIdentities(tmp_path / "kv" / "digests.json")
    assert ids.of(f) is None
    ready: list = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ids.run, lambda: ready)
        await trio.sleep(0.6)
        assert ids.of(f) is None  # not ready: not hashed
        ready.append(f)
        with trio.fail_after(10):
            while ids.of(f) is None:
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    assert ids.of(f) == model_ident(hashlib.sha256(f.read_bytes()).hexdigest())
    again = ModelIdentities(tmp_path / "kv" / "digests.json")
    assert await again.learn(f) == ids.of(f) and again.digests.hashed == 0  # from the table


def test_local_targets_carry_their_file_s_identity():
    def runner(path):
        return SimpleNamespace(
            model=SimpleNamespace(id=str(path), path=path),
            generate=None,
            embeddings=SimpleNamespace(embed=None),
            caps=None,
            tokenize=None,
            queue_depth=0,
            in_flight=0,
            slots=1,
            free_slots=1,
            state=RunnerState.READY,
        )

    known = {"x.gguf": "0123456789abcdef"}
    local = LocalRunners("me", {"x": runner("x.gguf"), "y": runner("y.gguf")}, identity=lambda p: known.get(p))
    assert {t.model: t.identity for t in local.targets()} == {"x.gguf": "0123456789abcdef", "y.gguf": None}


@pytest.mark.parametrize("ident", ["fedcba9876543210", None])
def test_remote_targets_carry_the_announced_identity(ident):
    class Mesh:
        def members(self):
            return {
                A: SimpleNamespace(
                    role="host",
                    queue_depth=0,
                    models=(ModelEntry("m", "ready", 1, ident),),
                    extra={},
                    version_key=lambda: (1, 0),
                )
            }

        def member_states(self, now):
            return {A: "alive"}

        def link(self, peer_id):
            return None

    async def main():
        remote = RemoteGeneration(Mesh(), node_id="me", local_open=lambda m: None)  # type: ignore[arg-type]
        (t,) = remote.targets()
        assert t.identity == ident

    trio.run(main)
