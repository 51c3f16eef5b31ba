"""The grammar's time budget (pure, a fake clock): per token, per request, the set-up counted."""

from __future__ import annotations

import pytest

from hydra_node.runtime.child.engine.grammar_budget import GrammarBudget, GrammarLimits
from hydra_node.runtime.child.engine.sampler_errors import SamplingError


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def budget(token_s: float = 1.0, request_s: float = 10.0) -> tuple[GrammarBudget, Clock]:
    clock = Clock()
    return GrammarBudget(GrammarLimits(token_s, request_s), clock), clock


def test_tokens_within_their_budget_pass_and_add_up() -> None:
    b, clock = budget()
    for _ in range(9):
        b.start()
        clock.t += 0.5
        b.check()
        clock.t += 0.5
        b.stop()
    assert b.spent == pytest.approx(9.0)


def test_one_slow_token_is_a_422_grammar_too_slow_naming_the_setting_and_the_fix() -> None:
    b, clock = budget(token_s=0.25)
    b.start()
    clock.t += 0.3
    with pytest.raises(SamplingError) as err:
        b.check()
    e = err.value
    assert (e.code, e.status) == ("grammar_too_slow", 422)
    assert "grammar_token_budget_ms" in str(e) and "300 ms" in str(e) and "response_format" in str(e)
    assert e.frame(7) == {"op": "error", "id": 7, "code": "grammar_too_slow", "status": 422, "message": str(e)}


def test_the_request_budget_counts_every_token_and_the_set_up() -> None:
    b, clock = budget(token_s=1.0, request_s=2.0)
    b.charge(1.5)  # parsing the grammar
    b.start()
    clock.t += 0.4
    b.stop()
    b.start()
    clock.t += 0.2  # each token alone is well within its budget
    with pytest.raises(SamplingError) as err:
        b.stop()
    assert err.value.code == "grammar_too_slow" and "grammar_request_budget_s" in str(err.value)


@pytest.mark.parametrize("limits", [(0.0, 1.0), (1.0, 0.0), (-1.0, 1.0)])
def test_budgets_must_be_positive(limits: tuple[float, float]) -> None:
    with pytest.raises(ValueError, match="positive"):
        GrammarLimits(*limits)


def test_the_budgets_travel_from_the_runner_config_to_the_child_argv() -> None:
    from hydra_node.config import ConfigError, parse_config_text
    from hydra_node.config.runner_settings import runner_settings_from
    from hydra_node.models import resolve_model
    from hydra_node.runtime.runner.argv import runner_argv

    def argv(text: str) -> list[str]:
        return runner_argv(runner_settings_from(parse_config_text(text)), resolve_model(None), 3)

    given = argv("[runner]\ngrammar_token_budget_ms = 250\ngrammar_request_budget_s = 7.5\n")
    assert given[given.index("--grammar-token-budget-ms") + 1] == "250.0"
    assert given[given.index("--grammar-request-budget-s") + 1] == "7.5"
    default = argv("")
    assert default[default.index("--grammar-token-budget-ms") + 1] == "5000.0"
    assert default[default.index("--grammar-request-budget-s") + 1] == "60.0"
    for bad in ("grammar_token_budget_ms = 0", "grammar_request_budget_s = -1"):
        with pytest.raises(ConfigError, match=bad.split()[0]):
            parse_config_text(f"[runner]\n{bad}\n")
