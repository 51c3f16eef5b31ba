"""A split healing after it lost a worker: what the replan did and what the heal cost (pure).

:class:`~hydra_node.runtime.hosting.hosted_model.HostedModel` records a
:class:`~hydra_node.runtime.runner.records.WorkerLoss` when a worker of its live plan is lost
(its lease ended, or its peer is no longer alive in the membership), and once the replanned
runner is ready it reports a :class:`HealReport` (``/api/status`` ``splits.<id>.last_heal``,
the ``split.healed`` event).  docs/splits.md "When a worker dies or stalls".
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass

__all__ = ["HealReport", "Replan", "replan_kind"]


class Replan(enum.StrEnum):
    """What the new plan did about the lost worker."""

    REPLACEMENT = "replacement_worker"  # another worker took its layers
    FEWER = "fewer_workers"  # the surviving workers (and the host) took them
    LOCAL = "local"  # the model runs unsplit on this node (it fits, or it was only split by --split)
    SAME = "same_worker"  # the lost worker was back (its node restarted its worker) and took them again


def replan_kind(old_workers: Collection[str], lost: str, new_workers: Collection[str]) -> Replan:
    """The :class:`Replan` from the old plan's worker peers, the lost one, and the new plan's."""
    if not new_workers:
        return Replan.LOCAL
    if lost in new_workers:
        return Replan.SAME
    survivors = set(old_workers) - {lost}
    if set(new_workers) - survivors:
        return Replan.REPLACEMENT
    return Replan.FEWER


@dataclass(frozen=True)
class HealReport:
    """The last heal of a split (``splits.<id>.last_heal``).

    ``worker_lost``: the lost worker's peer id; ``reason``: what said so; ``at``: when (unix s);
    ``replan``: what the new plan did; ``workers``: the new plan's worker peers; ``reload_s``: from
    the loss to the new runner's ready; ``requests_interrupted``: generations in flight when the
    worker was lost (they failed with ``split_worker_lost``); ``requests_continued``: generations
    with resume tokens (continuations) this model's runner started since it was ready again."""

    worker_lost: str
    reason: str
    at: float
    replan: Replan
    workers: tuple[str, ...]
    reload_s: float
    requests_interrupted: int
    requests_continued: int
