"""``model: "mesh"`` with reasoning members: each member that reasons gets the request's reasoning
fields fitted to its template, one that does not gets none; the arbiter and the reducer compare
answers, never thoughts; the answer keeps the thoughts of the model that wrote it (and a replayed
stream sends them first). A stand-in for the router answers for every member."""

from __future__ import annotations

import dataclasses
from contextlib import asynccontextmanager

from hydra_node.api.chat import ChatOutcome, ContentDelta, ReasoningDelta
from hydra_node.inference import NO_CAPS, Finished, GenerationRequest, ModelCaps, TextDelta
from hydra_node.moa.answers import MoaApi, caps_of, replay_events
from hydra_node.moa.config import MESH_MODEL, MoaSettings
from hydra_node.moa.mixture import MixtureOfAgents, fit_reasoning

THINKS = ModelCaps("think", thinks=True, switch=True)
NO_SWITCH = ModelCaps("think", thinks=True)
REQ = GenerationRequest(model=MESH_MODEL, kind="chat", messages=(("user", "Capital of France?"),), max_tokens=64)


def test_reasoning_fields_are_fitted_to_each_member():
    asked = dataclasses.replace(REQ, thinking=True, thinking_budget=256, reasoning_effort="minimal")
    assert fit_reasoning(asked, THINKS) == asked
    plain = fit_reasoning(asked, NO_CAPS)
    assert (plain.thinking, plain.thinking_budget, plain.reasoning_effort) == (None, None, "")
    off = dataclasses.replace(REQ, thinking=False)
    assert fit_reasoning(off, THINKS) == off
    assert (fit_reasoning(off, NO_SWITCH).thinking, fit_reasoning(off, NO_SWITCH).thinking_budget) == (None, 0)
    zero = dataclasses.replace(REQ, thinking_budget=0)
    assert (fit_reasoning(zero, THINKS).thinking, fit_reasoning(zero, THINKS).thinking_budget) == (False, None)


@dataclasses.dataclass
class Entry:
    id: str
    hosts: list
    states: dict


class MembersRouter:
    """A stand-in for the router: each member model on its own node, answering ``answers[model]``
    (``(thoughts, text)``); records every request it is given."""

    def __init__(self, answers: dict[str, tuple[str, str]], caps: dict[str, ModelCaps]):
        self.answers, self.caps, self.requests = answers, caps, []

    def models(self):
        return [Entry(m, [f"node-{m}"], {f"node-{m}": "ready"}) for m in self.answers]

    def recently_seen(self, model: str) -> bool:
        return False

    def capabilities(self, model: str) -> ModelCaps:
        return self.caps.get(model, NO_CAPS)

    @asynccontextmanager
    async def generate(self, req):
        self.requests.append(req)
        thoughts, text = self.answers[req.model]

        async def events():
            if thoughts:
                yield TextDelta("", reasoning=thoughts)
            yield TextDelta(text)
            yield Finished("stop", 5, 3, served_by=f"node-{req.model}", reasoning_tokens=2 if thoughts else 0)

        yield events()


async def test_the_arbiter_compares_answers_not_thoughts_and_the_pick_keeps_its_own():
    router = MembersRouter(
        {"a": ("I recall Paris.", "Paris."), "b": ("Hmm, France... Paris!", "paris"), "c": ("", "Rome.")},
        {"a": THINKS, "b": NO_SWITCH},
    )
    api = MoaApi(MixtureOfAgents(router, MoaSettings()))  # type: ignore[arg-type]
    assert api.capabilities().reasons and caps_of(router, api, MESH_MODEL).reasons  # type: ignore[arg-type]
    asked = dataclasses.replace(REQ, thinking=True, thinking_budget=100)
    out, info, _ = await api.answer(asked)
    assert info["majority"] and set(info["groups"][0]["members"]) == {"a", "b"}  # same answer, other thoughts
    chosen = info["chosen"]
    assert out.reasoning == router.answers[chosen][0] and out.content == router.answers[chosen][1]
    by_model = {r.model: r for r in router.requests}
    assert (by_model["a"].thinking, by_model["a"].thinking_budget) == (True, 100)
    assert (by_model["b"].thinking, by_model["b"].thinking_budget) == (True, 100)
    if "c" in by_model:  # (it may have been cancelled first: a majority was already there)
        assert (by_model["c"].thinking, by_model["c"].thinking_budget) == (None, None)
    assert out.usage["completion_tokens_details"]["reasoning_tokens"] >= 4


async def test_the_reducer_sees_answers_only_and_its_own_thoughts_are_the_answers():
    router = MembersRouter(
        {"a": ("secret thoughts A", "Paris."), "b": ("secret thoughts B", "Lyon."), "r": ("merging", "Paris!")},
        {"a": THINKS, "b": THINKS, "r": NO_SWITCH},
    )
    mixture = MixtureOfAgents(router, MoaSettings(members=("a", "b"), reducer="r"))  # type: ignore[arg-type]
    out, info, _ = await MoaApi(mixture).answer(dataclasses.replace(REQ, thinking=False))
    assert info["reducer"]["ran"] and out.content == "Paris!" and out.reasoning == "merging"
    reducer_req = next(r for r in router.requests if r.model == "r")
    shown = reducer_req.messages[-1].content
    assert "Paris." in shown and "Lyon." in shown and "secret" not in shown
    assert (reducer_req.thinking, reducer_req.thinking_budget) == (None, 0)  # "off" without a switch


async def test_a_mesh_of_models_that_do_not_reason_does_not_reason():
    router = MembersRouter({"a": ("", "x"), "b": ("", "y")}, {})
    assert not MoaApi(MixtureOfAgents(router, MoaSettings())).capabilities().reasons  # type: ignore[arg-type]


async def test_a_replayed_answer_sends_its_thoughts_first():
    out = ChatOutcome(content="Paris.", finish_reason="stop", usage={}, served_by="h", reasoning="Hmm.")
    events = [ev async for _, ev in replay_events(out)]
    assert events[:2] == [ReasoningDelta("Hmm."), ContentDelta("Paris.", ())]
