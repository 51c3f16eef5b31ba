"""``serve --model NAME --join TOKEN``: a model missing from the cache comes from a mesh peer first.

``hydra-node serve`` downloads a catalogue name or URL before the node starts, except when it joins
a mesh: then the model may already be on a peer, a LAN hop away, and the internet is the fallback.
Such a model is fetched by the running node once it has joined (:func:`fetch_for_serve`): it waits
(bounded) for the members' announcements, takes the model from the nearest peer that announces it
(sha256-verified, over the encrypted link), and downloads it from its URL only when no peer holds
it or every holder failed. Either way the result is the cache's verified file. docs/models.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from hydra_node.models import ModelRef
from hydra_node.runtime.fetch.errors import NotInMesh, PeerFetchError
from hydra_node.runtime.fetch.fetcher import FetchSettings, ensure_local, remote_for
from hydra_node.runtime.fetch.peer import ModelShare

__all__ = ["PEER_WAIT_S", "SETTLE_S", "fetch_for_serve", "wait_for_holders"]

log = logging.getLogger("hydra.fetch")

#: Longest wait for a first alive peer after joining, before going to the internet.
PEER_WAIT_S = 15.0
#: Once a peer is alive, how long its and the others' announcements get to arrive.
SETTLE_S = 2.0


async def wait_for_holders(held: Callable[[], bool], mesh, now: Callable[[], float]) -> None:
    """Return once ``held()`` (some peer announces what we want), or the view had ``SETTLE_S`` to
    fill after a first alive peer (the caller bounds the whole wait). Also used for
    ``serve --model placement:NAME --join`` (node.py)."""
    first_alive: float | None = None
    while not held():
        if mesh is None:
            return
        if first_alive is None and "alive" in mesh.member_states(now()).values():
            first_alive = now()
        if first_alive is not None and now() - first_alive >= SETTLE_S:
            return
        await trio.sleep(0.2)


async def fetch_for_serve(
    share: ModelShare, ref: str, settings: FetchSettings, *, wait_s: float = PEER_WAIT_S, progress=None
) -> tuple[ModelRef, str]:
    """The model ``ref`` (catalogue name or URL) as a local file and where it came from
    (``cache``, ``peer:<id>`` or its URL). Typed errors of :func:`ensure_local` when the download
    fails too."""
    remote = remote_for(ref, settings)
    rec = share.cache.lookup(remote.model_id)
    if rec is not None:
        return ModelRef(rec.model_id, rec.path(share.cache.root)), "cache"
    sha256 = remote.sha256 or share.cache.pinned_sha256(remote.model_id)
    with trio.move_on_after(wait_s):
        await wait_for_holders(lambda: bool(share.holders(remote.model_id, sha256)), share.mesh, trio.current_time)
    try:
        rec = await share.fetch(remote)
        log.info("event=model_from_peer model=%s source=%s", remote.model_id, rec.source)
        return ModelRef(rec.model_id, rec.path(share.cache.root)), rec.source
    except (NotInMesh, PeerFetchError) as exc:
        log.info("event=model_fetch_fallback model=%s reason=%r action=download", remote.model_id, str(exc))
    local = await trio.to_thread.run_sync(lambda: ensure_local(ref, settings, progress=progress))
    return ModelRef(local.model_id, local.path), local.source
