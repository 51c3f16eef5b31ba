"""Loaded at start-up by a client subprocess whose PYTHONPATH holds this folder: guards it
(netguard.py) and writes what it refused to ``$HYDRA_NETGUARD_RECORD`` when it exits."""

import os

import netguard

netguard.install(os.environ.get("HYDRA_NETGUARD_RECORD") or None)
