"""The `live` marker rules (tests/live_marker.py): what makes a test live, and what does not."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import pytest

from live_marker import imports_process_machinery, is_live


def module_with(**names: Any) -> ModuleType:
    module = ModuleType("test_fake")
    for name, value in names.items():
        setattr(module, name, value)
    return module


def hydra_class(name: str) -> type:
    return type(name, (), {"__module__": "hydra_node.runtime.example"})


class FakeItem:
    def __init__(
        self, fixturenames: tuple[str, ...] = (), markers: tuple[str, ...] = (), module: ModuleType | None = None
    ) -> None:
        self.fixturenames, self.markers, self.module = fixturenames, markers, module

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.markers else None


def test_modules_that_drive_processes_are_live() -> None:
    harness, netlab, subprocess = (importlib.import_module(n) for n in ("harness", "netlab", "subprocess"))
    assert imports_process_machinery(module_with(subprocess=subprocess))
    assert imports_process_machinery(module_with(Popen=subprocess.Popen))
    assert imports_process_machinery(module_with(NodeProcess=harness.NodeProcess, request=harness.request))
    assert imports_process_machinery(module_with(wait_for=netlab.wait_for))
    assert imports_process_machinery(module_with(ChildSupervisor=hydra_class("ChildSupervisor")))


def test_pure_modules_are_not_live() -> None:
    import trio

    import waiting

    assert not imports_process_machinery(module_with(trio=trio, pytest=pytest, wait_until=waiting.wait_until))
    policies = module_with(Backoff=hydra_class("Backoff"), CrashLoop=hydra_class("CrashLoop"))
    assert not imports_process_machinery(policies)
    assert not imports_process_machinery(module_with(Supervisor=type("FakeSupervisor", (), {})))  # not ours


def test_fixtures_and_older_markers_make_a_test_live() -> None:
    pure = module_with()
    verdicts: dict[str, bool] = {}
    assert is_live(FakeItem(("draft_engine", "model_path"), module=pure), verdicts)  # through another fixture
    assert is_live(FakeItem(("spawn",), module=pure), verdicts)
    assert is_live(FakeItem(markers=("netns",), module=pure), verdicts)
    assert not is_live(FakeItem(("tmp_path", "autojump_clock"), module=pure), verdicts)
    assert verdicts == {"test_fake": False}


def test_this_module_is_in_the_inner_loop(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("live") is None
