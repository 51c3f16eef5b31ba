"""ChildSupervisor with tiny real child processes (python -c scripts)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from hydra_node.pidfile import read_pidfile, reap_stale
from hydra_node.backoff import Backoff, CrashLoop
from hydra_node.runtime.supervise import (
    ChildExited,
    ChildFailed,
    ChildNotReady,
    ChildOutput,
    ChildSpec,
    ChildState,
    ChildSupervisor,
    GiveUp,
)

PY = sys.executable
#: Bound on any one test: python start-up on a busy 2-core machine.
LIMIT_S = 60
QUICK = Backoff(initial_s=0.05, factor=2.0, max_s=0.2, jitter=0.0)
READY_THEN_SLEEP = "import sys, time; print('ready', flush=True); time.sleep(300)"
PARENT = Path(__file__).with_name("supervised_parent.py")


async def read_ready(proc: trio.Process) -> str:
    """Readiness = one line on stdout; "refuse" means retrying cannot help."""
    buf = b""
    while b"\n" not in buf:
        chunk = await proc.stdout.receive_some(1024)
        if not chunk:
            raise ChildNotReady("exited before ready")
        buf += chunk
    line = buf.split(b"\n", 1)[0].decode()
    if line == "refuse":
        raise ChildNotReady("bad arguments", permanent=True)
    return line


def spec(script: str, **kw) -> ChildSpec:
    kw.setdefault("stdout", subprocess.PIPE)
    return ChildSpec([PY, "-c", script], ready=read_ready, kind="test", **kw)


def alive(pid: int) -> bool:
    """Exists and is not a zombie (a reparented child may wait for a reaper that never comes)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


async def test_ready_child_is_reported_killed_restarted_and_stopped(tmp_path):
    pidfile = tmp_path / "run" / "test.pid"
    output = ChildOutput(tmp_path / "child.log")
    script = "import sys; print('boo', file=sys.stderr, flush=True); " + READY_THEN_SLEEP
    sup = ChildSupervisor(
        "tester", spec(script, pidfile=pidfile, output=output), backoff=QUICK, on_ready=lambda line: f"got {line}"
    )
    assert sup.state is ChildState.STARTING and sup.pid is None
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            assert await nursery.start(sup.run) == "got ready"
            first = sup.pid
            assert sup.state is ChildState.READY and sup.state == "ready" and alive(first)
            rec = read_pidfile(pidfile)
            assert rec.pid == first and rec.kind == "test" and rec.owner_pid == os.getpid() and rec.alive()

            assert sup.kill()
            while not (sup.state is ChildState.READY and sup.restarts == 1):
                await sup.wait_changed()
            assert sup.pid != first and not alive(first)
            assert "killed by signal SIGKILL" in sup.last_error and "boo" in sup.last_error
            assert read_pidfile(pidfile).pid == sup.pid
            second = sup.pid
            nursery.cancel_scope.cancel()
    assert sup.state is ChildState.STOPPED and sup.pid is None and not sup.kill()
    assert not alive(second) and not pidfile.exists()
    assert (tmp_path / "child.log").read_text().count("boo") == 2


async def test_child_that_never_gets_ready_backs_off_then_gives_up(autojump_clock):
    spawned: list[float] = []

    async def build() -> ChildSpec:
        spawned.append(trio.current_time())
        return spec("import sys; sys.exit(3)", grace_s=0.001)

    sup = ChildSupervisor(
        "crasher", build, backoff=Backoff(initial_s=1.0, factor=2.0, max_s=30.0, jitter=0.0), crash_loop=CrashLoop(3)
    )
    with pytest.raises(ChildFailed) as info:
        await sup.run()
    assert info.value.reason is GiveUp.CRASH_LOOP and info.value.failures == 3
    assert info.value.last_error == "exited before ready"
    assert sup.state is ChildState.FAILED and sup.restarts == 2
    gaps = [b - a for a, b in zip(spawned, spawned[1:])]
    assert gaps == [pytest.approx(1.0, abs=0.01), pytest.approx(2.0, abs=0.01)]  # virtual seconds


async def test_crash_loop_counts_only_start_failures_when_readiness_forgives(autojump_clock):
    lives = 0

    async def build() -> ChildSpec:
        nonlocal lives
        lives += 1  # ready, crash, ready, crash, then never ready again
        return spec("print('ready')" if lives <= 2 else "pass", grace_s=0.001)

    sup = ChildSupervisor("flaky", build, backoff=QUICK, crash_loop=CrashLoop(2), forgive_when_ready=True)
    with pytest.raises(ChildFailed) as info:
        await sup.run()
    assert info.value.reason is GiveUp.CRASH_LOOP and lives == 4 and sup.restarts == 3


async def test_refusal_and_first_start_failure_are_not_retried():
    with trio.fail_after(LIMIT_S):
        refuser = ChildSupervisor("refuser", spec("print('refuse')"), backoff=QUICK)
        with pytest.raises(ChildFailed) as info:
            await refuser.run()
        assert info.value.reason is GiveUp.REFUSED and info.value.last_error == "bad arguments"
        assert refuser.state is ChildState.FAILED and refuser.restarts == 0

        quitter = ChildSupervisor("quitter", spec("pass"), backoff=QUICK, fatal_first_start=True)
        with pytest.raises(ChildFailed) as info:
            await quitter.run()
        assert info.value.reason is GiveUp.FIRST_START and quitter.restarts == 0


async def test_spawn_failure_is_seen_at_once(tmp_path):
    closed: list[bool] = []
    bad = ChildSpec([str(tmp_path / "no-such-program")], ready=read_ready, on_exit=lambda: closed.append(True))
    sup = ChildSupervisor("ghost", bad, backoff=QUICK)
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            with pytest.raises(ChildFailed) as info:
                await nursery.start(sup.run)
    assert info.value.reason is GiveUp.SPAWN and "cannot spawn ghost" in info.value.last_error
    assert sup.state is ChildState.FAILED and closed == [True]


async def test_watch_reports_how_the_child_went():
    async def watch(proc: trio.Process, line: str) -> None:
        await proc.wait()
        raise ChildExited(f"lost it after {line!r}")

    sup = ChildSupervisor("watched", spec("print('ready')", watch=watch), backoff=QUICK, crash_loop=CrashLoop(1))
    with trio.fail_after(LIMIT_S):
        with pytest.raises(ChildFailed) as info:
            await sup.run()
    assert info.value.last_error == "lost it after 'ready'" and sup.ever_ready


@pytest.mark.parametrize("ignores_sigterm", [False, True])
async def test_stop_terminates_then_kills_after_the_grace_period(ignores_sigterm):
    prelude = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " if ignores_sigterm else ""
    procs: list[trio.Process] = []

    async def ready(proc: trio.Process) -> str:
        procs.append(proc)
        return await read_ready(proc)

    child = ChildSpec([PY, "-c", prelude + READY_THEN_SLEEP], ready=ready, stdout=subprocess.PIPE, grace_s=1.0)
    sup = ChildSupervisor("stubborn", child)
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            t0 = time.monotonic()
            nursery.cancel_scope.cancel()
    took = time.monotonic() - t0
    if ignores_sigterm:
        assert procs[0].returncode == -signal.SIGKILL and took >= 1.0
    else:
        assert procs[0].returncode == -signal.SIGTERM and took < 1.0
    assert sup.state is ChildState.STOPPED


def test_child_outlives_idle_spawn_threads_but_dies_with_a_kill_9d_parent(tmp_path):
    """PR_SET_PDEATHSIG follows the forking *thread*: trio's cached threads exit after 10 idle
    seconds, so the child must still be alive once the parent has none left (it says ``idle`` then),
    and gone once the parent is."""
    parent = subprocess.Popen([PY, str(PARENT), str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        rec = read_pidfile(tmp_path / "sleeper.pid")
        assert rec.pid == child and rec.owner_pid == parent.pid and alive(child)
        assert select.select([parent.stdout], [], [], 60)[0], "the parent's trio threads did not go idle"
        assert parent.stdout.readline().strip() == "idle"
        assert alive(child), "the child died with an idle spawning thread"
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 5
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), "the child survived a kill -9 of its parent"
        assert reap_stale(tmp_path) == [f"removed stale pid file sleeper.pid (pid {child} gone)"]
        assert not (tmp_path / "sleeper.pid").exists()
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        parent.stdout.close()
