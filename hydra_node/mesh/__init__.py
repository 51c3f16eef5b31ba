"""Mesh: encrypted peer links (handshake, frames, streams) and, beside them, membership and gossip.

The wire protocol is specified language-neutrally in protocol/README.md. Link
public surface: `hydra_node.mesh.link.endpoints` (connect_link, open_link,
LinkListener, serve_links), `hydra_node.mesh.link.peer_link` (PeerLink, LinkSettings),
`hydra_node.mesh.wire.token` (issue_invite, parse_invite), `hydra_node.mesh.wire.ids`
(node_id_from_public_key, MeshSecret), `hydra_node.mesh.wire.envelope` (seal,
open_envelope), `hydra_node.mesh.wire.cbor` (encode, decode).

The node's part in the mesh is `hydra_node.mesh.service.MeshService` (links, gossip,
`join(plan)`), built by the composition root from narrow inputs: a signing key, its state
directory (`keyfile`, `peerstore`), `MeshSettings`, and a callable giving the content of our
announcement (`announcer.AnnouncementContent`). Joining is planned by `joining` (pure) and
admission by invite is `admission`; one link per peer is kept by `links.LinkTable`. The mesh
imports nothing above it (runtime, routing, inference, APIs): what peers may ask of this node is
declared by the root with `MeshService.handle_stream` / `handle_tunnel`.
"""
