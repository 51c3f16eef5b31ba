"""A hosted model's identity: what a continuation checks before it resumes a generation elsewhere.

Two targets of one model id may hold different files (another quantisation, another revision):
resuming one's token ids on the other would continue in another tokenisation. The identity
(:func:`model_ident`) is 16 hex characters of sha256 over the GGUF file's sha256 and the chat
template override, if any (the template in the file is covered by the file's digest). A node
announces it per model (``ident`` of the membership model entry, protocol/README.md) once it has
hashed the file, and only a node that resumes generations (``resume_tokens``) announces one: an
older peer announces none, so it is never chosen to continue a generation it would duplicate.

:class:`ModelIdentities` hashes each hosted file once its runner is ready, in a worker thread,
remembered across restarts in ``HOME/kv/digests.json``
(:class:`~hydra_node.runtime.artifacts.kv_identity.FileDigests`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path

import trio

from hydra_node.mesh.membership.announcement import IDENT_HEX
from hydra_node.runtime.artifacts.kv_identity import FileDigests, model_ident

__all__ = ["IDENT_HEX", "ModelIdentities", "model_ident"]

log = logging.getLogger("hydra.routing.identity")

#: IDENT_HEX: hex characters of an identity (64 bits: collisions between a mesh's files are not a concern).
#: How often :meth:`ModelIdentities.run` looks for ready runners whose file is not hashed yet,
#: and how long it waits before trying a file that could not be read again.
IDENT_POLL_S = 0.5
IDENT_RETRY_S = 30.0


class ModelIdentities:
    """The identities of the model files this node hosts, by path (:meth:`of`: None until hashed)."""

    def __init__(self, store: Path | None) -> None:
        self.digests = FileDigests(store)
        self._known: dict[Path, str] = {}
        self.failures = 0

    def of(self, path: Path) -> str | None:
        return self._known.get(Path(path))

    async def learn(self, path: Path) -> str:
        """Hash ``path`` (in a worker thread; the cache answers at once for a file seen before)."""
        path = Path(path)
        digest = await trio.to_thread.run_sync(self.digests.sha256, path)
        ident = self._known[path] = model_ident(digest)
        log.info("event=model_identity path=%s ident=%s", path, ident)
        return ident

    async def run(self, ready_paths: Callable[[], Iterable[Path]]) -> None:
        """Hash every file ``ready_paths()`` names (the files of ready runners) that is not known yet."""
        retry_at: dict[Path, float] = {}
        while True:
            for path in map(Path, list(ready_paths())):
                if path in self._known or retry_at.get(path, 0.0) > trio.current_time():
                    continue
                try:
                    await self.learn(path)
                except OSError as exc:  # unreadable: no identity (no continuation goes there) until it is
                    retry_at[path] = trio.current_time() + IDENT_RETRY_S
                    self.failures += 1
                    log.warning("event=model_identity_failed path=%s error=%r", path, str(exc))
            await trio.sleep(IDENT_POLL_S)
