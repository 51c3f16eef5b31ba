"""llama-server's sampling extensions in the runner's sampler params (pure): ``top_k``, ``min_p``,
``repeat_penalty``/``repeat_last_n`` from the request's wire map, their checks, and which of them
keep a request out of speculation."""

from __future__ import annotations

import pytest

from hydra_node.inference import GenerationRequest
from hydra_node.runtime.child.engine.sampler import DEFAULT_TOP_K, SamplerParams, SamplingError
from hydra_node.runtime.child.engine.speculation import speculation_eligible


def _wire(**kw) -> dict:
    return GenerationRequest(model="m", kind="completion", prompt="x", **kw).to_wire()


def test_the_defaults_stay_off_the_wire_and_give_the_historic_chain():
    wire = _wire()
    assert not {"top_k", "min_p", "repeat_penalty", "repeat_last_n"} & wire.keys()
    p = SamplerParams.from_request(wire)
    assert (p.top_k, p.min_p, p.repeat_penalty, p.repeat_last_n) == (DEFAULT_TOP_K, 0.0, 1.0, 64)
    assert not p.repeats and not p.penalised


def test_each_extension_reaches_the_params():
    p = SamplerParams.from_request(_wire(top_k=0, min_p=0.05, repeat_penalty=1.3, repeat_last_n=16))
    assert (p.top_k, p.min_p, p.repeat_penalty, p.repeat_last_n) == (0, 0.05, 1.3, 16)
    assert p.repeats and p.penalised
    assert SamplerParams.from_request(_wire(top_k=1)).top_k == 1


def test_a_repeat_penalty_without_a_window_is_no_link():
    p = SamplerParams.from_request(_wire(repeat_penalty=1.5, repeat_last_n=0))
    assert not p.repeats and not p.penalised


@pytest.mark.parametrize(
    "field, value",
    [
        ("top_k", -1),
        ("top_k", 1.5),
        ("top_k", True),
        ("top_k", 100_000),
        ("min_p", 1.5),
        ("min_p", float("nan")),
        ("repeat_penalty", 0.0),
        ("repeat_penalty", 11.0),
        ("repeat_penalty", "1.1"),
        ("repeat_last_n", -1),
        ("repeat_last_n", 2.0),
    ],
)
def test_a_malformed_extension_is_a_400_naming_it(field, value):
    wire = _wire()
    wire[field] = value
    with pytest.raises(SamplingError) as err:
        SamplerParams.from_request(wire)
    assert err.value.status == 400 and field in str(err.value)


def test_a_repeat_penalty_keeps_a_greedy_request_out_of_speculation_and_top_k_min_p_do_not():
    """Speculation verifies by argmax: a penalty changes the argmax, top-k and min-p never drop it."""
    for kw, eligible in (({"repeat_penalty": 1.2}, False), ({"top_k": 1}, True), ({"min_p": 0.5}, True)):
        wire = _wire(temperature=0.0, **kw)
        p = SamplerParams.from_request(wire)
        plain = not (p.grammar or p.logit_bias or p.penalised)
        assert speculation_eligible(wire, p.greedy, plain) is eligible, kw
