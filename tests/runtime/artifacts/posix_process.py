"""A separate process that publishes to or fetches from a POSIX root (the crash tests kill it at a
stage through HYDRA_TEST_CRASH_AT; the netns test runs it inside network namespaces).

    python posix_process.py publish ROOT KIND NAME SEED_HEX PATH=FILE...   prints the manifest JSON
    python posix_process.py fetch ROOT KIND NAME DEST TRUSTED_NODE_ID      prints the manifest JSON
"""

from __future__ import annotations

import sys
from pathlib import Path

from nacl.signing import SigningKey

from hydra_node.runtime.artifacts.manifest import signer
from hydra_node.runtime.artifacts.posix import PosixStore


def main(argv: list[str]) -> int:
    mode, root, kind, name, *rest = argv
    store = PosixStore(Path(root))
    if mode == "publish":
        seed, *pairs = rest
        files = {p.split("=", 1)[0]: Path(p.split("=", 1)[1]) for p in pairs}
        manifest = store.publish(
            kind, name, files, identity={"writer": "subprocess"}, sign=signer(SigningKey(bytes.fromhex(seed)))
        )
    else:
        dest, trusted = rest
        manifest = store.fetch(kind, name, Path(dest), trust=lambda node: node == trusted)
    sys.stdout.write(manifest.to_json())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
