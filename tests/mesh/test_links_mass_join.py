"""A mass join (hydra_node/mesh/link_table.py, dial_limits.py): nodes spawned at the same instant all
join through one invite, converge to a full view with one link per pair, and the links between
joiners are dialled by the smaller node id (the 30-node version is a benchmark:
bench/mesh_membership.py --simultaneous)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from harness import NodeProcess

JOINERS = 5
ARGS = ("--no-model", "--headless", "--no-rpc-worker", "--no-mdns")


def test_nodes_spawned_at_once_converge_with_one_link_per_pair(tmp_path):
    seed = NodeProcess(tmp_path / "seed", *ARGS).start()
    token = seed.invite()
    nodes = [seed] + [NodeProcess(tmp_path / f"n{i}", *ARGS, "--join", token) for i in range(JOINERS)]
    try:
        for n in nodes[1:]:
            n.start(wait=False)  # all at once
        for n in nodes[1:]:
            n.wait_ready()

        def full_view(n: NodeProcess) -> dict:
            return n.wait_status(
                lambda s: sum(p["state"] == "alive" and p["linked"] for p in s["peers"]) == JOINERS,
                timeout=60,
                what="every peer alive and linked",
            )

        with ThreadPoolExecutor(3) as pool:
            views = list(pool.map(full_view, nodes))
        ids = {v["node_id"] for v in views}
        for v in views:
            assert {p["id"] for p in v["peers"] if p["state"] == "alive"} == ids - {v["node_id"]}
        counters = [v["mesh"]["counters"] for v in views]
        # joiners learn of each other by gossip; the larger id of a pair that needs a link first
        # waits for the smaller id to dial in, and some did (dial_limits.inbound_wait)
        assert sum(c["inbound_awaited"] for c in counters) > 0, counters
        assert all(c["dials_in_progress"] == 0 for c in counters)
    finally:
        for n in nodes:
            n.kill_all()
