"""Hydra node: one process per machine of a peer-to-peer LLM inference mesh."""

__version__ = "0.1.0"
