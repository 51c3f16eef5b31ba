"""The trace simulator runs every policy over every trace and accounts for every request."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SIM_PATH = Path(__file__).resolve().parents[2] / "bench" / "scheduler_sim.py"


def _load_sim():
    if "scheduler_sim" in sys.modules:
        return sys.modules["scheduler_sim"]
    spec = importlib.util.spec_from_file_location("scheduler_sim", SIM_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["scheduler_sim"] = module  # dataclasses look their module up while executing it
    spec.loader.exec_module(module)
    return module


def test_short_simulation_accounts_for_every_request() -> None:
    sim = _load_sim()
    table = sim.run_all(range(7, 8), duration=90.0)
    for trace in sim.TRACES:
        sizes = {table[(trace, policy)]["n"] for policy in sim.POLICIES}
        assert len(sizes) == 1 and sizes.pop() > 50  # same trace, every request finished
        for policy in sim.POLICIES:
            row = table[(trace, policy)]
            assert 0 <= row["ttft_p50"] <= row["ttft_p95"] <= row["done_p95"]


def test_hydra_avoids_the_failing_host() -> None:
    sim = _load_sim()
    trace = sim.make_trace("steady", 3, 400.0)
    counts = {}
    for policy in ("round-robin", "hydra"):
        run = sim.Sim(policy, sim.mesh(failing=True), trace, 3)
        chosen = []
        original = run.choose
        run.choose = lambda req, tried, now, f=original, c=chosen: c.append((now, f(req, tried, now))) or c[-1][1]
        run.run()
        late = [name for now, name in chosen if now > 250.0]
        counts[policy] = late.count("wan-gpu") / len(late)
    assert counts["round-robin"] > 0.15 and counts["hydra"] < counts["round-robin"] / 2
