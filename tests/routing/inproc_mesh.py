"""A mesh member in this process (a real ``MeshService`` on loopback, nothing spawned) announcing
``models`` as ready: what the in-process routing tests link to each other."""

from __future__ import annotations

from pathlib import Path

from nacl.signing import SigningKey

from hydra_node.mesh.announcer import AnnouncementContent
from hydra_node.mesh.membership import ModelEntry
from hydra_node.mesh.service import MeshService, MeshSettings


def mesh_member(home: Path, name: str, models: tuple[str, ...]) -> MeshService:
    content = AnnouncementContent(models=tuple(ModelEntry(m, "ready") for m in models))
    return MeshService(
        signing_key=SigningKey.generate(),
        state_dir=home / "mesh",
        settings=MeshSettings(listen_host="127.0.0.1", listen_port=0),
        announcement=lambda: content,
        name=name,
    )
