"""S3 placement throughput: S3Store.publish / fetch vs boto3's plain upload_file / download_file
(the "aws s3 cp" equivalent) of the same bytes against the same S3-compatible server, side by side.

The server is moto's standalone S3 server (a child process on loopback, as in the tests). Each
round moves one file of ``--mb`` random MiB both ways on both sides; rounds alternate which side
goes first. Ours does more per byte than the baseline: sha256 of every byte (while reading, and
again while writing on fetch), the signed manifest and its pointer, old-version collection, a
staging directory with fsync and rename. Reported: median seconds and MB/s per side and the ratio
ours/baseline of the throughputs (goal >= 0.8).

Run: .venv/bin/python bench/placement_s3.py [--mb 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "runtime" / "artifacts"))

import nacl.signing
from s3server import TEST_CREDENTIALS, S3Server, start_moto, stop_moto

from hydra_node.runtime.artifacts.manifest import signer
from hydra_node.runtime.artifacts.s3 import S3Store

__all__ = ["TEST_CREDENTIALS", "s3_rows", "start_moto", "stop_moto"]


def s3_rows(endpoint: str, src: Path, work: Path, rounds: int) -> list[tuple[str, float, float, float]]:
    """(operation, ours MB/s, baseline MB/s, ratio) for publish and fetch of ``src``."""
    server = S3Server(endpoint)
    client = server.client()
    bucket = server.new_bucket("bench")
    store = S3Store(bucket, endpoint=endpoint, region=server.region)
    sign = signer(nacl.signing.SigningKey.generate())
    mb = src.stat().st_size / 1e6
    times: dict[str, list[float]] = {k: [] for k in ("publish", "upload_file", "fetch", "download_file")}

    for r in range(rounds):
        dest, plain, key = work / f"fetched-{r}", work / f"plain-{r}.bin", f"plain/{r}/{src.name}"
        steps = {
            "publish": partial(store.publish, "model_weights", "bench", {src.name: src}, identity={}, sign=sign),
            "upload_file": partial(client.upload_file, str(src), bucket, key),
            "fetch": partial(store.fetch, "model_weights", "bench", dest),
            "download_file": partial(client.download_file, bucket, key, str(plain)),
        }
        order = (
            ["publish", "upload_file", "fetch", "download_file"]
            if r % 2 == 0
            else ["upload_file", "publish", "download_file", "fetch"]
        )
        for name in order:
            t0 = time.perf_counter()
            steps[name]()
            times[name].append(time.perf_counter() - t0)
        assert (dest / src.name).stat().st_size == plain.stat().st_size == src.stat().st_size
        shutil.rmtree(dest)
        plain.unlink()
    rate = {k: mb / statistics.median(v) for k, v in times.items()}
    return [
        ("publish vs upload_file", rate["publish"], rate["upload_file"], rate["publish"] / rate["upload_file"]),
        ("fetch vs download_file", rate["fetch"], rate["download_file"], rate["fetch"] / rate["download_file"]),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=64, help="size of the file moved (MiB)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    os.environ.update(TEST_CREDENTIALS)
    work = Path(tempfile.mkdtemp(prefix="hydra-bench-s3-"))
    try:
        src = work / "weights.bin"
        with open(src, "wb") as f:
            f.writelines(os.urandom(1 << 20) for _ in range(args.mb))
        proc, endpoint = start_moto(work / "moto.log")
        try:
            rows = s3_rows(endpoint, src, work, args.rounds)
        finally:
            stop_moto(proc)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"S3 (moto server on loopback), {args.mb} MiB, median of {args.rounds} rounds")
    print(f"{'operation':<26}{'ours MB/s':>11}{'boto3 MB/s':>12}{'ratio':>8}")
    for name, ours, base, ratio in rows:
        print(f"{name:<26}{ours:>11.1f}{base:>12.1f}{ratio:>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
