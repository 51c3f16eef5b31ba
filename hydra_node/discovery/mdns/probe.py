"""A small stand-alone mDNS discovery process (tests, benchmarks, LAN debugging).

``python -m hydra_node.discovery.mdns.probe --interface 10.79.0.1 --port 15353 --expect 2``
announces a synthetic advert, waits until it sees ``--expect`` other nodes, prints one
JSON line (``{"name", "elapsed_s", "seen": [...]}``), lingers, and exits 0; exit 1 on
timeout (the line then lists what it did see).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import secrets
import sys

import trio

from hydra_node.discovery.mdns.service import MDNS_GROUP, MDNS_PORT, MdnsConfig, MdnsService
from hydra_node.discovery.mdns.wire import MdnsAdvert
from hydra_node.discovery.node_choice import lan_fingerprint
from hydra_node.mesh.wire.ids import MESH_KEY_BYTES, MeshSecret


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="lan_probe", description=__doc__.splitlines()[0])
    p.add_argument("--group", default=MDNS_GROUP)
    p.add_argument("--port", type=int, default=MDNS_PORT)
    p.add_argument("--interface", default="127.0.0.1")
    p.add_argument("--name", default="probe")
    p.add_argument("--mesh-id", default="lab-mesh")
    p.add_argument("--secret", default="lab-secret", help="text the lab mesh key is derived from (lab use only)")
    p.add_argument("--expect", type=int, default=1, help="number of other nodes to wait for")
    p.add_argument("--timeout", type=float, default=15.0)
    p.add_argument("--linger", type=float, default=2.0, help="seconds to stay announced after success")
    return p.parse_args(argv)


def lab_mesh_key(secret: bytes) -> MeshSecret:
    """A mesh key derived from a lab secret, so every probe started with it advertises the same fingerprint."""
    return MeshSecret(hashlib.blake2b(secret, digest_size=MESH_KEY_BYTES, person=b"hydra-lab-mesh").digest())


def make_advert(name: str, interface: str, port: int, mesh_id: str, secret: bytes) -> MdnsAdvert:
    """A synthetic advert; its ``tok_fp`` is the node's own LAN fingerprint of the lab mesh key."""
    node_id = secrets.token_hex(16)
    return MdnsAdvert(
        instance=f"hydra-{node_id[:12]}",
        port=port,
        addresses=(interface,),
        node_id=node_id,
        mesh_id=mesh_id,
        token_fingerprint=lan_fingerprint(lab_mesh_key(secret)),
        name=name,
        models=("SmolLM2-135M-Instruct",),
        node_count=1,
        version="0.1.0",
        origin=secrets.token_hex(8),
    )


async def probe(args: argparse.Namespace) -> int:
    advert = make_advert(args.name, args.interface, 9337, args.mesh_id, args.secret.encode())
    service = MdnsService(MdnsConfig(group=args.group, port=args.port, interface=args.interface), advert)
    result = 1
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        await nursery.start(service.run)
        with trio.move_on_after(args.timeout):
            await service.wait_for(lambda ads: len(ads) >= args.expect)
            result = 0
        elapsed = trio.current_time() - start
        seen = [{"name": a.name, "addresses": list(a.addresses), "instance": a.instance} for a in service.adverts()]
        print(
            json.dumps({"name": args.name, "ok": result == 0, "elapsed_s": round(elapsed, 4), "seen": seen}), flush=True
        )
        if result == 0:
            await trio.sleep(args.linger)
        nursery.cancel_scope.cancel()
    return result


def main(argv: list[str] | None = None) -> int:
    return trio.run(probe, _parse(argv))


if __name__ == "__main__":
    sys.exit(main())
