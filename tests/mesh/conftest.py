"""Fixtures for the mesh link tests: fixed mesh keys, node identities, a running listener."""

from __future__ import annotations

from typing import Any, Awaitable, Callable

import pytest
import trio
from nacl.signing import SigningKey

from hydra_node.mesh.link.endpoints import LinkListener
from hydra_node.mesh.wire.ids import MeshSecret
from hydra_node.mesh.link.peer_link import LinkSettings


@pytest.fixture
def mesh() -> MeshSecret:
    """The mesh every test node belongs to (fixed key)."""
    return MeshSecret(bytes([0x42]) * 32)


def _member_settings(mesh: MeshSecret | None, **overrides: Any) -> LinkSettings:
    return LinkSettings(identity=SigningKey.generate(), mesh=mesh, **overrides)


async def _start_listener(
    nursery: trio.Nursery, settings: LinkSettings, on_link: Any = None
) -> tuple[LinkListener, str]:
    listener = LinkListener(settings, on_link)
    port = await nursery.start(listener.serve, "127.0.0.1", 0)
    return listener, f"ws://127.0.0.1:{port}"


@pytest.fixture
def member_settings() -> Callable[..., LinkSettings]:
    """member_settings(mesh, **overrides) -> LinkSettings with a fresh node identity."""
    return _member_settings


@pytest.fixture
def start_listener() -> Callable[..., Awaitable[tuple[LinkListener, str]]]:
    """await start_listener(nursery, settings, on_link=None) -> (listener, ws://127.0.0.1:port)."""
    return _start_listener
