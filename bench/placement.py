"""Placement throughput: PosixStore.publish / fetch vs a plain `cp` of the same bytes, side by side
(and, with --s3, S3Store vs boto3's upload_file / download_file: bench/placement_s3.py).

Each round moves ``--mb`` MiB of random bytes (split over ``--files`` files) both ways on both
sides, on the same file system, with every source in the page cache; rounds alternate which side
goes first. Ours does more per byte than `cp`: the sha256 of the copy (read back while the next
chunk copies), fsync of every file and folder, the signed manifest, the staging folder and the
renames; on fetch the manifest's signature and every file's sha256. `cp` alone leaves its bytes
in the page cache, so the baseline is shown twice: `cp`, and `cp` followed by `sync FILE`
(the same durability as ours). Reported: median MB/s per side and the ratio ours/baseline of
the throughputs (goal >= 0.8).

Run: .venv/bin/python bench/placement.py [--mb 256] [--files 1] [--rounds 3] [--s3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import nacl.signing

from hydra_node.runtime.artifacts.manifest import hash_file, signer
from hydra_node.runtime.artifacts.posix import PosixStore

Row = tuple[str, float, float, float]  # (operation, ours MB/s, baseline MB/s, ratio ours/baseline)


def make_sources(work: Path, mb: int, files: int) -> dict[str, Path]:
    src = work / "src"
    src.mkdir()
    out = {}
    per = max(1, mb // files)
    for i in range(files):
        p = src / f"part-{i:04d}.bin"
        with open(p, "wb") as f:
            f.writelines(os.urandom(1 << 20) for _ in range(per))
        out[p.name] = p
    return out


def cp(sources: list[Path], dest: Path, sync: bool) -> None:
    dest.mkdir()
    subprocess.run(["cp", *map(str, sources), str(dest)], check=True)
    if sync:
        subprocess.run(["sync", *(str(dest / p.name) for p in sources)], check=True)


def timed(times: dict[str, list[float]], name: str, step: Callable[[], object]) -> None:
    t0 = time.perf_counter()
    step()
    times[name].append(time.perf_counter() - t0)


def posix_rows(work: Path, sources: dict[str, Path], rounds: int) -> list[Row]:
    root = work / "root"
    root.mkdir()
    store = PosixStore(root)
    sign = signer(nacl.signing.SigningKey.generate())
    mb = sum(p.stat().st_size for p in sources.values()) / 1e6
    names = ("publish", "cp", "cp+sync", "fetch", "cp stored", "cp stored+sync", "sha256")
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        out = work / f"round-{r}"
        out.mkdir()
        # The publish of this round makes the stored copy the fetch rows read.
        files = list(sources.values())
        pub = [
            ("publish", partial(store.publish, "model_weights", "bench", sources, identity={}, sign=sign)),
            ("cp", partial(cp, files, out / "cp", False)),
            ("cp+sync", partial(cp, files, out / "cp-sync", True)),
        ]
        for name, step in pub if r % 2 == 0 else pub[::-1]:
            timed(times, name, step)
        stored = [root / "model_weights" / "bench" / "current" / "files" / n for n in sources]
        get = [
            ("fetch", partial(store.fetch, "model_weights", "bench", out / "fetched")),
            ("cp stored", partial(cp, stored, out / "cp-stored", False)),
            ("cp stored+sync", partial(cp, stored, out / "cp-stored-sync", True)),
        ]
        for name, step in get if r % 2 == 0 else get[::-1]:
            timed(times, name, step)
        timed(times, "sha256", partial(lambda fs: [hash_file(p) for p in fs], files))  # a verified copy's ceiling
        for n, p in sources.items():
            assert (out / "fetched" / n).stat().st_size == (out / "cp" / n).stat().st_size == p.stat().st_size
        shutil.rmtree(out)
    rate = {k: mb / statistics.median(v) for k, v in times.items()}
    pairs = [
        ("sha256 alone vs cp", "sha256", "cp"),
        ("publish vs cp", "publish", "cp"),
        ("publish vs cp+sync", "publish", "cp+sync"),
        ("fetch vs cp", "fetch", "cp stored"),
        ("fetch vs cp+sync", "fetch", "cp stored+sync"),
    ]
    return [(label, rate[ours], rate[base], rate[ours] / rate[base]) for label, ours, base in pairs]


def s3_section(work: Path, sources: dict[str, Path], rounds: int) -> list[Row]:
    """The S3 rows (bench/placement_s3.py), against a moto server started here."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from placement_s3 import TEST_CREDENTIALS, s3_rows, start_moto, stop_moto

    os.environ.update(TEST_CREDENTIALS)
    proc, endpoint = start_moto(work / "moto.log")
    try:
        return s3_rows(endpoint, next(iter(sources.values())), work, rounds)  # one object each way
    finally:
        stop_moto(proc)


def print_rows(title: str, rows: list[Row], baseline: str) -> None:
    print(title)
    print(f"{'operation':<28}{'ours MB/s':>11}{baseline + ' MB/s':>14}{'ratio':>8}")
    for name, ours, base, ratio in rows:
        print(f"{name:<28}{ours:>11.1f}{base:>14.1f}{ratio:>8.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=256, help="bytes moved per operation (MiB)")
    ap.add_argument("--files", type=int, default=1, help="split over this many files (a layer package)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--s3", action="store_true", help="also S3Store vs boto3 (moto on loopback)")
    ap.add_argument("--dir", type=Path, default=None, help="work folder (default: a new temporary folder)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hydra-bench-placement-", dir=args.dir))
    try:
        sources = make_sources(work, args.mb, args.files)
        rows = posix_rows(work, sources, args.rounds)
        print_rows(
            f"POSIX root on {work} ({args.mb} MiB in {args.files} file(s), median of {args.rounds} rounds)", rows, "cp"
        )
        if args.s3:
            print()
            print_rows(
                f"S3 (moto server on loopback), {args.mb // args.files} MiB object",
                s3_section(work, sources, args.rounds),
                "boto3",
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
