"""Two hosts in separate network namespaces share one POSIX root (as two nodes share an NFS or VAST
mount): what one publishes, the other fetches verified, trusting the publisher's node id."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from nacl.signing import SigningKey
from netlab import NetLab

from hydra_node.runtime.artifacts.manifest import Manifest

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2 for network namespaces"),
]

ROOT = Path(__file__).resolve().parents[3]
PROCESS = str(Path(__file__).with_name("posix_process.py"))


def test_a_second_host_on_the_same_root_fetches_what_the_first_published(tmp_path) -> None:
    root = tmp_path / "shared"
    root.mkdir()
    (tmp_path / "w.bin").write_bytes(os.urandom(200_000))
    seed = bytes([0xD4]) * 32
    publisher = bytes(SigningKey(seed).verify_key).hex()
    env = ["env", f"PYTHONPATH={ROOT}"]
    with NetLab(2, subnet="10.89.0") as lab:
        pub = lab.run(
            1,
            [
                *env,
                sys.executable,
                PROCESS,
                "publish",
                str(root),
                "model_weights",
                "m",
                seed.hex(),
                f"w.bin={tmp_path / 'w.bin'}",
            ],
        )
        assert pub.returncode == 0, pub.stderr
        got = lab.run(
            2,
            [
                *env,
                sys.executable,
                PROCESS,
                "fetch",
                str(root),
                "model_weights",
                "m",
                str(tmp_path / "dest"),
                publisher,
            ],
        )
        assert got.returncode == 0, got.stderr
        refused = lab.run(
            2,
            [
                *env,
                sys.executable,
                PROCESS,
                "fetch",
                str(root),
                "model_weights",
                "m",
                str(tmp_path / "other"),
                "ab" * 32,
            ],
        )
    assert Manifest.from_json(got.stdout) == Manifest.from_json(pub.stdout)
    assert (tmp_path / "dest" / "w.bin").read_bytes() == (tmp_path / "w.bin").read_bytes()
    assert refused.returncode != 0 and "SignatureInvalid" in refused.stderr and not (tmp_path / "other").exists()
