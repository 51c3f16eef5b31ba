"""Waiting for a target of a model that is coming back: the pure part (docs/scheduler.md "Waiting
for a target").

A request (new, or a continuation: :mod:`hydra_node.routing.continuation`) that finds no routable
target for its model waits up to ``[scheduler].target_wait_s`` for one when the model is *expected
back* (:func:`expected_back`): a runner of it is loading or restarting here or on an alive peer, an
alive member claims it is loading it (``Announcement.extra["rehosting"]``) or wants it kept hosted
(``extra["keep_hosted"]``: a re-host is pending), or a target of it was routable moments ago and its
host did not leave cleanly (it just died: a re-host may follow). :func:`wait_step` is the decision
made at each look while waiting. The router (:mod:`hydra_node.routing.router`) runs the loop.

Sans-IO: no trio, no clock (``now`` is passed in); the gossiped extras are parsed defensively (a
shape this version does not know is ignored, never an error).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hydra_node.routing.target import RouteTarget, TargetState
from hydra_node.runtime.hosting.rehost_wire import parse_rehost_extra

__all__ = [
    "DEFAULT_TARGET_WAIT_S",
    "LOADING_STATES",
    "MAX_TARGET_WAIT_S",
    "MeshView",
    "Routable",
    "WaitOutcome",
    "expected_back",
    "keep_hosted_models",
    "rehosting_models",
    "wait_step",
]

#: ``[scheduler].target_wait_s`` unless the config says otherwise (0: fail at once).
DEFAULT_TARGET_WAIT_S = 60.0
MAX_TARGET_WAIT_S = 3600.0
#: Target states of a runner that is on its way to ready (a restarting local runner is listed as loading).
LOADING_STATES = frozenset({TargetState.STARTING, TargetState.PLACING, TargetState.LOADING, TargetState.RESTARTING})
#: States in which a runner's own verdict is that it is not coming back by itself soon.
_GIVEN_UP = frozenset({TargetState.FAILED, TargetState.STOPPED})


class WaitOutcome(enum.StrEnum):
    """How a wait ended (``hydra_route_target_waits_total{outcome}``)."""

    ROUTED = "routed"  # a target became routable: the request went on
    TIMED_OUT = "timed_out"  # target_wait_s passed
    GAVE_UP = "gave_up"  # the model stopped being expected back (its runner failed, its host left)
    CLIENT_GONE = "client_gone"  # the client went away while waiting


@dataclass(frozen=True)
class MeshView:
    """What the mesh says about models coming back: the announcement ``extra`` of every alive
    member, and the peers that left cleanly (said goodbye: not a death a re-host follows)."""

    extras: tuple[Mapping[str, Any], ...] = ()
    left: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Routable:
    """When a model last had a routable target, and on which hosts."""

    at: float
    hosts: frozenset[str] = field(default_factory=frozenset)
    #: those of ``hosts`` that are this node (an unload here, which removes its target, is a clean leave)
    local: frozenset[str] = field(default_factory=frozenset)


def rehosting_models(extra: Mapping[str, Any]) -> frozenset[str]:
    """The models a member claims it is loading now (``extra["rehosting"]``, read by the re-host
    wire's one parser: :func:`~hydra_node.runtime.hosting.rehost_wire.parse_rehost_extra`)."""
    if not isinstance(extra, Mapping):
        return frozenset()
    return parse_rehost_extra(extra).claims


def keep_hosted_models(extra: Mapping[str, Any]) -> frozenset[str]:
    """The models a member wants kept hosted by at least one node (``extra["keep_hosted"]`` entries
    with min_hosts >= 1); an entry of another shape is ignored."""
    if not isinstance(extra, Mapping):
        return frozenset()
    return frozenset(w.model for w in parse_rehost_extra(extra).keep if w.min_hosts >= 1)


def expected_back(
    model: str,
    targets: Iterable[RouteTarget],
    view: MeshView,
    *,
    last_routable: Routable | None,
    now: float,
    wait_s: float,
) -> str | None:
    """Why ``model`` is expected to have a routable target soon (a short phrase), or None.

    ``targets``: the model's targets that could take the request once ready (a continuation passes
    only those of its identity, or of unknown identity while loading, on hosts it may use);
    ``last_routable``: the router's record of its last routable target (``now`` on the same clock)."""
    listed = [t for t in targets if t.model == model]
    for t in listed:
        if t.state in LOADING_STATES:
            return f"its runner here is {t.state.value}" if t.local else f"peer {t.node_id[:16]} is {t.state.value}"
    for extra in view.extras:
        if model in rehosting_models(extra):
            return "a member is loading it (re-host)"
    for extra in view.extras:
        if model in keep_hosted_models(extra):
            return "a member wants it kept hosted (re-host pending)"
    if last_routable is None or now - last_routable.at > wait_s:
        return None
    if any(t.state in _GIVEN_UP for t in listed):
        return None  # its runner's own verdict: failed (a crash loop) or stopped
    # hosts that left cleanly: peers that said goodbye, and this node when its target is gone (the
    # model was unloaded here: a restarting or failed runner stays listed)
    unloaded = last_routable.local if not any(t.local for t in listed) else frozenset()
    if last_routable.hosts and last_routable.hosts <= view.left | unloaded:
        return None  # nothing suggests it comes back
    return f"a host served it {max(0.0, now - last_routable.at):.0f} s ago"


def wait_step(*, routable: bool, expected: str | None, waited_s: float, wait_s: float) -> WaitOutcome | None:
    """One look while waiting: how the wait ends now, or None to keep waiting."""
    if routable:
        return WaitOutcome.ROUTED
    if expected is None:
        return WaitOutcome.GAVE_UP
    if waited_s >= wait_s:
        return WaitOutcome.TIMED_OUT
    return None
