"""Our announcement: built from the root's content, republished only when something peers use changed."""

from __future__ import annotations

from hydra_node.mesh.announcer import AnnouncementContent, Announcer
from hydra_node.mesh.membership import Hardware, ModelEntry, RpcCapacity

NODE = "ab" * 32


def test_build_stamps_identity_role_addresses_and_name():
    content = AnnouncementContent(
        models=(ModelEntry("m", "ready"),),
        hardware=Hardware(cores=4),
        queue_depth=2,
        throughput_milli=(("m", 1500),),
        api_port=1,
        console_port=2,
        rpc=RpcCapacity(10, "CPU"),
        extra={"draft": "d", "name": "ignored"},
    )
    ann = Announcer(NODE, role="worker", name="alpha", version="9.9", source=lambda: content).build(
        incarnation=7, addresses=("10.0.0.1:9338",)
    )
    assert (ann.node_id, ann.role, ann.version, ann.incarnation, ann.addresses) == (
        NODE,
        "worker",
        "9.9",
        7,
        ("10.0.0.1:9338",),
    )
    assert ann.models == content.models and ann.hardware == content.hardware and ann.rpc == content.rpc
    assert (ann.queue_depth, ann.throughput_milli, ann.api_port, ann.console_port) == (2, (("m", 1500),), 1, 2)
    assert ann.extra == {"draft": "d", "name": "alpha"}  # our name wins


def test_changed_only_for_what_peers_use():
    current = {"content": AnnouncementContent(queue_depth=0)}
    announcer = Announcer(NODE, role="host", name="a", version="1", source=lambda: current["content"])

    def changed() -> bool:
        return announcer.changed(announcer.build(incarnation=1, addresses=()))

    assert changed()  # the first one is always published
    assert not changed()
    current["content"] = AnnouncementContent(queue_depth=0, hardware=Hardware(usable_bytes=5))
    assert not changed()  # free memory alone is no news
    current["content"] = AnnouncementContent(queue_depth=1, hardware=Hardware(usable_bytes=5))
    assert changed()
    current["content"] = AnnouncementContent(queue_depth=1, extra={"telemetry": 1})
    assert changed()
    assert not changed()
