"""Announcement signatures checked once: a bounded memory of announcements already verified.

Every Gossip, Ping and Ack piggybacks a few peer records, most of them announcements this node
has already seen and verified many times; verifying costs a canonical CBOR encoding plus an
Ed25519 check (about 0.15 ms of CPU), and on a busy 30-node mesh it was a large share of each
node's work (see bench/mesh_membership.py --profile). An announcement whose exact content was
verified before is accepted again without the work.

"Exact" means the ``repr`` of the frozen announcement: unlike ``==`` it tells ``True`` from ``1``,
so a look-alike with different wire bytes (and so an invalid signature) is never taken for the
verified one; it costs a few microseconds.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

from hydra_node.mesh.membership import Announcement

__all__ = ["MAX_REMEMBERED_ANNOUNCEMENTS", "VerifiedAnnouncements"]

#: Verified announcements remembered (the least recently used are forgotten first): a few
#: versions of each member of a large mesh, about 0.5 kB each.
MAX_REMEMBERED_ANNOUNCEMENTS = 2048


class VerifiedAnnouncements:
    """``verify(ann) -> bool`` with memory; pass an instance where the verifier is expected.
    Failures are never remembered (a bad signature costs the full check every time)."""

    def __init__(
        self, verify: Callable[[Announcement], bool], *, max_entries: int = MAX_REMEMBERED_ANNOUNCEMENTS
    ) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self._verify = verify
        self._max = max_entries
        self._known: OrderedDict[str, None] = OrderedDict()
        self.hits = 0
        self.checks = 0

    def __call__(self, ann: Announcement) -> bool:
        key = repr(ann)
        if key in self._known:
            self._known.move_to_end(key)
            self.hits += 1
            return True
        self.checks += 1
        if not self._verify(ann):
            return False
        self._known[key] = None
        if len(self._known) > self._max:
            self._known.popitem(last=False)
        return True
