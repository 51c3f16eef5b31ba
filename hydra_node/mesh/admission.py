"""Being admitted to a mesh with an invite: dial the token's addresses, retrying with back-off."""

from __future__ import annotations

import logging
import random
from functools import partial

import trio

from hydra_node.backoff import Backoff

from hydra_node.mesh.link.endpoints import connect_link
from hydra_node.mesh.wire.errors import HandshakeError, LinkClosed, MeshError
from hydra_node.mesh.joining import PERMANENT_JOIN_ERRORS, JoinFailed
from hydra_node.mesh.link.peer_link import LinkSettings, PeerLink
from hydra_node.mesh.wire.token import InviteToken

__all__ = ["ADMISSION_ATTEMPT_S", "ADMISSION_RETRY_S", "admit_with_invite"]

log = logging.getLogger("hydra.mesh")

#: Bound on one attempt at one address (connect and handshake).
ADMISSION_ATTEMPT_S = 6.0
#: Back-off between rounds over the token's addresses (first delay, cap); jittered ±20 %.
ADMISSION_RETRY_S = (0.25, 5.0)
ADMISSION_BACKOFF = Backoff(initial_s=ADMISSION_RETRY_S[0], factor=2.0, max_s=ADMISSION_RETRY_S[1], jitter=0.2)


async def admit_with_invite(
    nursery: trio.Nursery, token: InviteToken, settings: LinkSettings, timeout_s: float
) -> PeerLink:
    """The first link that admits us (running in ``nursery``; its ``mesh`` is the mesh key).

    Retries every address in rounds until ``timeout_s`` (a round always runs whole); JoinFailed
    at once for a refusal retrying cannot fix (expired or forged token, foreign mesh ...)."""
    deadline = trio.current_time() + timeout_s
    attempt, last = 0, "no address tried"
    while True:
        for url in token.urls:
            try:
                with trio.fail_after(ADMISSION_ATTEMPT_S):
                    return await nursery.start(
                        partial(connect_link, url, settings, invite=token, expected_peer_id=token.issuer_id)
                    )
            except HandshakeError as exc:
                if exc.code in PERMANENT_JOIN_ERRORS and "busy" not in str(exc):
                    raise JoinFailed(f"{url} refused the invite: {exc}") from None
                last = f"{url}: {exc}"
            except (LinkClosed, MeshError, OSError, trio.TooSlowError) as exc:
                last = f"{url}: {exc or type(exc).__name__}"
        delay = ADMISSION_BACKOFF.delay(attempt, random.random())
        if trio.current_time() + delay > deadline:
            raise JoinFailed(f"could not join the mesh within {timeout_s:.0f} s; last error: {last}")
        log.warning("event=join_retry in_s=%.2f last_error=%r", delay, last)
        await trio.sleep(delay)
        attempt += 1
