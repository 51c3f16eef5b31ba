"""What each long-lived process imports: a module it never uses costs memory and start time on every
machine (numpy is about 11 MB RSS in the node, nostr-sdk 19 MB; trio about 7 MB in the RPC worker)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _loaded(module: str, names: tuple[str, ...]) -> list[str]:
    code = f"import sys, {module}\nprint(' '.join(n for n in {names!r} if n in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.split()


@pytest.mark.parametrize(
    "module, heavy",
    [
        # the node never evaluates a model; nostr-sdk (about 19 MB) loads only when Nostr is used
        ("hydra_node.node", ("numpy", "llama_cpp", "jinja2", "nostr_sdk")),
        ("hydra_node.runtime.rpc.worker", ("trio", "numpy", "llama_cpp")),  # a ggml RPC server and a pipe
    ],
)
def test_a_process_does_not_import_what_it_never_uses(module, heavy):
    assert _loaded(module, heavy) == []
