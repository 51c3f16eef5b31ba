"""Model capabilities and the tokenizer through a node that does not host the model: a real runner
child (the FIM fixture: tests/fixtures/fim_model.py) on a host mesh member announcing its
``model_caps``, and a member hosting nothing whose router reads them, tokenizes and detokenizes on
the host over a ``tokenize`` stream, and sends a fill-in-the-middle completion there; the thinking
fixture (tests/fixtures/models.py) reports its reasoning format and, with no FIM tokens, refuses a
``suffix`` in its runner."""

from __future__ import annotations

import time

import pytest
import trio
from nacl.signing import SigningKey
from waiting import wait_until

from hydra_node.inference import Finished, GenerationError, GenerationRequest, ModelCaps, TokenizeRequest
from hydra_node.mesh.announcer import AnnouncementContent
from hydra_node.mesh.joining import JoinPlan
from hydra_node.mesh.membership import ModelEntry
from hydra_node.mesh.service import MeshService, MeshSettings
from hydra_node.models import resolve_model
from hydra_node.routing.remote import RemoteGeneration
from hydra_node.routing.remote_tokenize import TOKENIZE_KIND, RemoteTokenizer
from hydra_node.routing.router import Router
from hydra_node.runtime.hosting.caps_wire import caps_extra
from hydra_node.runtime.runner.records import RunnerSettings
from hydra_node.runtime.runner.supervisor import RunnerSupervisor
from tests.fixtures.fim_model import fim_model
from tests.fixtures.models import thinking_model

pytestmark = pytest.mark.live

TIMEOUT_S = 300
MODEL = "fim"
SETTINGS = RunnerSettings(n_ctx=1024, warmup=False)
PROMPT = "def add(a, b):\n"


def completion(**kw) -> GenerationRequest:
    return GenerationRequest(model=MODEL, kind="completion", prompt=PROMPT, max_tokens=8, temperature=0.0, **kw)


async def text_of(router: Router, req: GenerationRequest) -> str:
    async with router.generate(req) as events:
        evs = [ev async for ev in events]
    assert isinstance(evs[-1], Finished)
    return "".join(getattr(ev, "text", "") for ev in evs[:-1])


async def test_a_node_without_the_model_sees_its_caps_tokenizes_on_its_host_and_fills_in_the_middle(tmp_path):
    sup = RunnerSupervisor(resolve_model(f"{MODEL}={fim_model()}"), tmp_path / "h", SETTINGS, node_id="host")

    def host_content() -> AnnouncementContent:  # what the node's root announces (node.py)
        return AnnouncementContent(models=(ModelEntry(MODEL, str(sup.state)),), extra=caps_extra([(MODEL, sup.caps)]))

    host = MeshService(
        signing_key=SigningKey.generate(),
        state_dir=tmp_path / "h" / "mesh",
        settings=MeshSettings(listen_host="127.0.0.1", listen_port=0),
        announcement=host_content,
        name="host",
    )
    host_tok = RemoteTokenizer(
        host, node_id=host.node_id, local_tokenize=lambda m: sup.tokenize if m == MODEL else None
    )
    host_gen = RemoteGeneration(host, node_id=host.node_id, local_open=lambda m: sup.generate if m == MODEL else None)
    host.handle_stream(TOKENIZE_KIND, host_tok.serve)  # as the root declares them
    host.handle_stream("generate", host_gen.serve)
    user = MeshService(
        signing_key=SigningKey.generate(),
        state_dir=tmp_path / "u" / "mesh",
        settings=MeshSettings(listen_host="127.0.0.1", listen_port=0),
        announcement=lambda: AnnouncementContent(models=()),
        name="user",
    )
    user_tok = RemoteTokenizer(user, node_id=user.node_id, local_tokenize=lambda m: None)
    router = Router(user.node_id)
    router.add_source(
        RemoteGeneration(
            user, node_id=user.node_id, local_open=lambda m: None, tokenize_remote=user_tok.tokenize_remote
        )
    )
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            assert sup.caps == ModelCaps(fim=True) and sup.status().caps == ModelCaps(fim=True)
            await nursery.start(host.run, JoinPlan())
            await nursery.start(user.run, JoinPlan.from_tokens([host.invite(600)], time.time()))
            await wait_until(lambda: any(t.caps is not None for t in router.all_targets()))
            await wait_until(lambda: user.node_id in host.members())

            # the capabilities, as the host announced them, on a node that does not host the model
            assert router.capabilities(MODEL) == ModelCaps(fim=True)
            assert router.capabilities("nothing-like-it") == ModelCaps()

            # tokenize / detokenize round trip, on the host's runner through the mesh
            text = "Hello world, <|im_start|>"
            tok = await router.tokenize(TokenizeRequest(MODEL, "tokenize", content=text, with_pieces=True))
            assert tok.served_by == "host" and tok.tokens and tok.tokens[-1] == 1  # <|im_start|> read as its token
            assert "".join(p for p in tok.pieces if isinstance(p, str)) == text
            plain = await router.tokenize(TokenizeRequest(MODEL, "tokenize", content=text, parse_special=False))
            assert len(plain.tokens) > len(tok.tokens)  # the special token's text as text
            back = await router.tokenize(TokenizeRequest(MODEL, "detokenize", tokens=tok.tokens))
            assert back.content == text
            with pytest.raises(GenerationError) as err:  # the host's 400, relayed as a peer's error (502)
                await router.tokenize(TokenizeRequest(MODEL, "detokenize", tokens=(10**6,)))
            assert err.value.status == 502 and "vocabulary" in err.value.message

            # fill in the middle: the infill layout changes the answer; a reasoning field is refused
            filled = await text_of(router, completion(suffix="\n    return result\n"))
            assert filled != await text_of(router, completion())
            with pytest.raises(GenerationError) as err:
                await text_of(router, completion(reasoning_effort="low"))
            assert (err.value.status, err.value.code) == (400, "unsupported_parameter")
            assert (sup.tokenizer.served, sup.tokenizer.failed) == (3, 1)
            nursery.cancel_scope.cancel()


async def test_a_thinking_model_reports_its_reasoning_and_without_fim_tokens_refuses_a_suffix(tmp_path):
    sup = RunnerSupervisor(resolve_model(f"think={thinking_model()}"), tmp_path, SETTINGS, node_id="n")
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            assert sup.caps == ModelCaps("think", thinks=True, switch=True)  # inference/reasoning.py detect()
            req = GenerationRequest(model="m", kind="completion", prompt="x = ", suffix=" + 1", max_tokens=2)
            with pytest.raises(GenerationError) as err:
                async with sup.generate(req) as events:
                    async for _ in events:
                        pass
            assert (err.value.status, err.value.code) == (400, "invalid_prompt")
            assert "fill-in-the-middle" in err.value.message and "'suffix'" in err.value.message
            nursery.cancel_scope.cancel()
