"""The peer wire protocol, sans-IO: ids and keys (`ids`), envelopes (`envelope`), invite tokens
(`token`), the handshake (`handshake`, `handshake_messages`), the secure channel
(`secure_channel`), frames (`frames`), stream multiplexing (`mux`), named bounds (`constants`)
and errors that say who is to blame (`errors`). Specified in protocol/README.md."""
