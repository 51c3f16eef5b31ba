"""Which tests are `live`: they start real processes or load the real model.

`tests/conftest.py` applies the marker to every collected test from these rules, so a new test
is marked without anyone remembering to, and `pytest -m "not live"` stays a fast inner loop.
"""

from __future__ import annotations

from types import ModuleType

import pytest

__all__ = ["LIVE_FIXTURES", "LIVE_MARKERS", "PROCESS_MODULES", "imports_process_machinery", "is_live"]


#: Fixtures that load the real model or start processes; a test using any of them (even through
#: another fixture, e.g. the speculative engines) is live.
LIVE_FIXTURES = frozenset(
    {
        "model_path",
        "spawn",
        "start_worker",
        "run_child",
        "shared_node",
        "shared_keyed_node",
        "shared_mesh",
        "thinking_mesh",
        "vision_mesh",
    }
)
#: Markers that already mean real nodes or hosts.
LIVE_MARKERS = frozenset({"slow", "netns"})
#: Modules whose names in a test module mean it drives real processes.
PROCESS_MODULES = frozenset({"subprocess", "harness", "netlab"})


def imports_process_machinery(module: ModuleType) -> bool:
    """True if ``module`` imported a process module, a name from one, or a hydra_node ``*Supervisor``
    (the child-process supervisors: runner, RPC worker, draft server)."""
    for value in vars(module).values():
        origin = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None)
        if not isinstance(origin, str):
            continue
        if origin.split(".")[0] in PROCESS_MODULES:
            return True
        if isinstance(value, type) and origin.startswith("hydra_node.") and value.__name__.endswith("Supervisor"):
            return True
    return False


def is_live(item: pytest.Item, module_verdicts: dict[str, bool]) -> bool:
    """Live by fixture, by an older marker, or by its module's imports (judged once per module,
    remembered in ``module_verdicts``)."""
    if LIVE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    if any(item.get_closest_marker(name) is not None for name in LIVE_MARKERS):
        return True
    module = getattr(item, "module", None)
    if module is None:
        return False
    if module.__name__ not in module_verdicts:
        module_verdicts[module.__name__] = imports_process_machinery(module)
    return module_verdicts[module.__name__]
