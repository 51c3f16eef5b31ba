"""Fixtures for discovery tests: a test mDNS port, nostr-sdk's LocalRelay in-process, a hostile relay."""

from __future__ import annotations

import random
from typing import Any, Callable

import pytest
from trio_websocket import serve_websocket

from discovery_helpers import TEST_GROUP, HostileRelay, build_local_relay
from hydra_node.discovery.nostr import _uniffi_trio
from hydra_node.discovery.mdns.service import MdnsConfig


@pytest.fixture
def mdns_config() -> MdnsConfig:
    """A random high port on loopback so tests never meet a real responder (or each other)."""
    return MdnsConfig(group=TEST_GROUP, port=random.randrange(20000, 60000), interface="127.0.0.1")


@pytest.fixture
async def relay_url():
    """nostr-sdk's LocalRelay in this process (trio UniFFI shim)."""
    _uniffi_trio.install()
    relay = build_local_relay()
    await relay.run()
    try:
        yield str(await relay.url())
    finally:
        relay.shutdown()


@pytest.fixture
async def hostile_relay(nursery):
    """Factory: ``await hostile_relay(script)`` serves a HostileRelay on an ephemeral port."""

    async def factory(script: Callable[[str], list[Any]]) -> HostileRelay:
        relay = HostileRelay(script)
        server = await nursery.start(serve_websocket, relay.handler, "127.0.0.1", 0, None)
        relay.url = f"ws://127.0.0.1:{server.port}"
        return relay

    return factory
