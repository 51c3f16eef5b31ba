"""Live: a node killed in the middle of a publish reports the operation failed after its restart and
retries it; it publishes the bundled GGUF to a POSIX root with `hydra placement prefetch`; a second
node (another home, the same root) serves it with `--model placement:NAME`; the CLI's status, fetch,
cache, pin and evict against the running nodes; a third node without the root, joined to the second,
takes the model from it (docs/placement.md)."""

from __future__ import annotations

import json
import signal

import pytest
from harness import NodeProcess, request

from hydra_node.cli.main import main
from hydra_node.runtime.artifacts.store import CRASH_ENV

pytestmark = pytest.mark.live


def cli(capsys, node: NodeProcess | None, *args: str) -> tuple[int, str]:
    port = str(node.console_port) if node is not None else "1"  # port 1: nothing answers there
    rc = main(["placement", *args, "--console", port])
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_a_placed_model_is_served_by_a_second_node_and_managed_from_the_cli(tmp_path, model_path, capsys):
    root = tmp_path / "ns"
    root.mkdir()
    a = NodeProcess(tmp_path / "a", "--no-model", "--posix-root", str(root), env={CRASH_ENV: "files_staged"})
    b = NodeProcess(tmp_path / "b", "--posix-root", str(root), "--model", "placement:smol")
    nodes = [a, b]
    tiny = tmp_path / "stage-0"
    tiny.mkdir()
    (tiny / "layers.bin").write_bytes(b"L" * 4096)
    try:
        # killed (SIGKILL) in the middle of a publish: after the restart the operation is failed, with a hint
        a.start()
        rc, out = cli(capsys, a, "prefetch", "layer_package", "stage-0", str(tiny), "--json")
        crashed = json.loads(out)["id"]
        assert a.proc.wait(timeout=60) == -signal.SIGKILL
        a.env.pop(CRASH_ENV)
        a.start()
        rc, out = cli(capsys, a, "status", crashed)
        assert rc == 1 and "state failed" in out and "interrupted" in out and f"placement retry {crashed}" in out
        assert not (root / "layer_package" / "stage-0").exists()  # nothing half-published is visible
        rc, out = cli(capsys, a, "retry", crashed, "--wait")
        assert rc == 0 and "state committed" in out, out

        rc, out = cli(capsys, a, "prefetch", "model_weights", "smol", str(model_path), "--wait", "--json")
        op = json.loads(out)
        assert rc == 0 and op["state"] == "committed" and op["done"], out
        assert op["manifest"]["size"] == model_path.stat().st_size
        rc, out = cli(capsys, a, "status", op["id"])
        assert rc == 0 and f"operation {op['id']}: publish model_weights/smol  state committed" in out

        b.args += ["--join", a.invite()]  # one mesh: C (below) trusts what a member (A) signed
        b.start(wait=False)  # loads while the CLI works on A
        rc, out = cli(capsys, a, "fetch", "layer_package", "stage-0", "--wait")
        assert rc == 0 and "state committed" in out and "path " in out
        rc, out = cli(capsys, a, "pin", "stage-0")
        assert rc == 0 and "pinned every kind/stage-0; cached now: 1" in out
        rc, out = cli(capsys, a, "evict", "stage-0", "--kind", "layer_package")
        assert rc == 1 and "pinned" in out
        assert cli(capsys, a, "pin", "stage-0", "--off")[0] == 0
        rc, out = cli(capsys, a, "evict", "stage-0", "--kind", "layer_package", "--posix-root", str(root))
        assert rc == 0 and "layer_package/stage-0" in out and f"removed from posix:{root}" in out
        assert not (root / "layer_package" / "stage-0").exists()
        rc, out = cli(capsys, a, "cache")
        assert rc == 0 and "0 artifacts" in out

        b.wait_ready(timeout=240)  # a loaded 2-core machine can take long to start a runner
        code, body = request(
            "POST",
            b.api_port,
            "/v1/chat/completions",
            {"model": "smol", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]},
        )
        assert code == 200 and json.loads(body)["model"] == "smol", body
        rc, out = cli(capsys, b, "cache", "--json")
        held = json.loads(out)["artifacts"]
        assert [(x["name"], x["in_use"], x["source"]) for x in held] == [("smol", True, f"posix:{root}")]
        rc, out = cli(capsys, b, "evict", "smol")
        assert rc == 1 and "artifact_held" in out and "in use" in out
        assert b.status()["placement"]["counters"]["fetched"] == 1

        rc, out = cli(capsys, None, "cache")
        assert rc == 1 and "is a node running?" in out

        # No namespace here: joined to B, C takes placement:smol from B (which holds it), verified
        # (signed by A, a member of the mesh).
        c = NodeProcess(tmp_path / "c", "--model", "placement:smol", "--join", b.invite())
        nodes.append(c)
        c.start(wait=False).wait_ready(timeout=240)
        code, body = request(
            "POST",
            c.api_port,
            "/v1/chat/completions",
            {"model": "smol", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]},
        )
        assert code == 200 and json.loads(body)["system_fingerprint"] == c.status()["node_id"], body
        rc, out = cli(capsys, c, "cache", "--json")
        (held,) = json.loads(out)["artifacts"]
        assert (held["name"], held["in_use"], held["source"]) == ("smol", True, f"peer:{b.status()['node_id']}")
    finally:
        for n in nodes:
            n.kill_all()
