"""The `hydra-node` / `hydra` command line: argument parsing and commands (`main`), one HTTP
client for every command that talks to a running node (`client`), and the per-feature option
groups (`models`, `discovery`, `speculative`). The top layer: it may import everything."""
