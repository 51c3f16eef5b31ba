"""VerifiedAnnouncements (hydra_node/mesh/verified.py): signatures checked once per exact content."""

from __future__ import annotations

import dataclasses

import nacl.signing
import pytest

from hydra_node.mesh.membership import Announcement
from hydra_node.mesh.membership.signing import sign_announcement, verify_announcement
from hydra_node.mesh.verified import VerifiedAnnouncements
from hydra_node.mesh.wire.ids import node_id_from_public_key


def signed(seq: int = 1, **extra) -> Announcement:
    key = nacl.signing.SigningKey(b"\x01" * 32)
    ann = Announcement(
        node_id=node_id_from_public_key(bytes(key.verify_key)),
        addresses=("127.0.0.1:9338",),
        incarnation=7,
        seq=seq,
        extra=extra,
    )
    return sign_announcement(key, ann)


class Counting:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, ann: Announcement) -> bool:
        self.calls += 1
        return verify_announcement(ann)


def test_a_verified_announcement_is_not_verified_again():
    inner = Counting()
    verify = VerifiedAnnouncements(inner)
    ann = signed()
    assert all(verify(dataclasses.replace(ann)) for _ in range(5))
    assert inner.calls == 1 and verify.hits == 4
    assert verify(signed(seq=2)) and inner.calls == 2  # another version is checked


def test_forgeries_are_checked_every_time_even_when_equal_to_a_verified_one():
    inner = Counting()
    verify = VerifiedAnnouncements(inner)
    good = signed(n=1)
    assert verify(good)
    # True == 1 in Python, but the wire bytes differ, so the signature does not cover it
    lookalike = dataclasses.replace(good, extra={**good.extra, "n": True})
    assert lookalike == good
    assert not verify(lookalike) and not verify(lookalike)
    tampered = dataclasses.replace(good, addresses=("10.0.0.1:9338",))
    assert not verify(tampered)
    assert inner.calls == 4 and verify.hits == 0


def test_memory_is_bounded_least_recently_used_first():
    inner = Counting()
    verify = VerifiedAnnouncements(inner, max_entries=2)
    a, b, c = signed(seq=1), signed(seq=2), signed(seq=3)
    for ann in (a, b, a, c):  # a was used again, so b is the one forgotten
        verify(ann)
    assert inner.calls == 3
    verify(a)
    assert inner.calls == 3
    verify(b)
    assert inner.calls == 4
    with pytest.raises(ValueError):
        VerifiedAnnouncements(inner, max_entries=0)
