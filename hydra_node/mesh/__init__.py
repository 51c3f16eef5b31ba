"""Mesh: encrypted peer links (handshake, frames, streams) and, beside them, membership and gossip.

The wire protocol is specified language-neutrally in protocol/README.md. Link
public surface: `hydra_node.mesh.endpoints` (connect_link, open_link,
LinkListener, serve_links), `hydra_node.mesh.link` (PeerLink, LinkSettings),
`hydra_node.mesh.token` (issue_invite, parse_invite), `hydra_node.mesh.ids`
(node_id_from_public_key, MeshSecret), `hydra_node.mesh.envelope` (seal,
open_envelope), `hydra_node.mesh.cbor` (encode, decode).
"""
