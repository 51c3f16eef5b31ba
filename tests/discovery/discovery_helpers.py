"""Helpers shared by the discovery tests (imported as a plain module: pytest puts this folder on sys.path)."""

from __future__ import annotations

import json
import secrets
from typing import Any, Callable

from nostr_sdk import LocalRelayBuilder, RateLimit
from trio_websocket import ConnectionClosed

from hydra_node.discovery.mdns.probe import lab_mesh_key
from hydra_node.discovery.node_choice import lan_fingerprint
from hydra_node.discovery.mdns.wire import MdnsAdvert
from hydra_node.discovery.nostr.relay import RelayConfig

TEST_GROUP = "224.0.0.251"
FAST_RELAY = RelayConfig(connect_timeout_s=2.0, disconnect_timeout_s=0.5, backoff_base_s=0.05, backoff_cap_s=0.5)


def make_advert(
    name: str = "a",
    *,
    mesh_id: str = "mesh-1",
    secret: bytes = b"s3cret",
    port: int = 9337,
    models: tuple[str, ...] = ("SmolLM2-135M",),
    origin: str | None = None,
) -> MdnsAdvert:
    node_id = secrets.token_hex(16)
    return MdnsAdvert(
        instance=f"hydra-{node_id[:12]}",
        port=port,
        addresses=("127.0.0.1",),
        node_id=node_id,
        mesh_id=mesh_id,
        token_fingerprint=lan_fingerprint(lab_mesh_key(secret)),
        name=name,
        models=models,
        node_count=1,
        version="0.1.0",
        origin=origin or secrets.token_hex(8),
    )


def build_local_relay(port: int | None = None):
    """nostr-sdk's LocalRelay on loopback with rate limits raised far above the default 60 events/min."""
    b = LocalRelayBuilder().addr("127.0.0.1").rate_limit(RateLimit(max_reqs=1000, notes_per_minute=100_000))
    if port is not None:
        b = b.port(port)
    return b.build()


class HostileRelay:
    """A NIP-01 relay that answers every REQ with scripted raw messages (for bad-input tests)."""

    def __init__(self, script: Callable[[str], list[Any]]) -> None:
        self.script = script
        self.url = ""
        self.received: list[Any] = []

    async def handler(self, request) -> None:
        ws = await request.accept()
        try:
            while True:
                msg = json.loads(await ws.get_message())
                self.received.append(msg)
                if msg[0] == "REQ":
                    for item in self.script(msg[1]):
                        await ws.send_message(item if isinstance(item, str) else json.dumps(item))
                elif msg[0] == "EVENT":
                    await ws.send_message(json.dumps(["OK", msg[1]["id"], True, ""]))
        except ConnectionClosed:
            pass
