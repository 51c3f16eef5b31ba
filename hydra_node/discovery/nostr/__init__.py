"""Nostr listings of public meshes: event building and checking (`events`, `keys`, `wire`,
sans-IO), the listing table (`table`), NIP-01 relay sessions over trio-websocket (`relay`,
`_ws`), and the publish/subscribe services (`services`)."""
