"""The request's nursery (``Request.nursery``, opened in hydra_node/http/connection.py) on real
loopback sockets: a task that a handler or a streamed body starts there is part of the request. It
is cancelled when the client goes away, when the response is over (after the body was closed and
its finalizer ran; the next request on the connection waits for it), and when the server drains
(after ``on_interrupt`` was written); a task never outlives its request."""

from __future__ import annotations

from contextlib import asynccontextmanager

import trio

from hydra_node.http.server import HttpServer, Request, Response, StreamResponse

TICK_S = 0.01
WAIT_S = 5


class Probe:
    """What a request's background task and its response's finalizer report."""

    def __init__(self):
        self.log: list[str] = []
        self.started = trio.Event()
        self.cancelled = trio.Event()
        self.finalized = trio.Event()
        self.task: trio.lowlevel.Task | None = None

    async def background(self) -> None:
        self.task = trio.lowlevel.current_task()
        self.started.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            self.log.append("task cancelled")
            self.cancelled.set()
            raise

    async def finalizer(self) -> None:
        self.log.append("finalizer")
        self.finalized.set()


def handler_for(probe: Probe):
    async def handler(request: Request):
        path = request.path
        if path == "/health":
            return Response.json(200, {"status": "ok"})
        if path == "/plain":  # a task the handler starts, answered with a whole body
            assert request.nursery is not None
            request.nursery.start_soon(probe.background)
            await probe.started.wait()
            return Response.json(200, {"ok": True})
        endless = path == "/endless"

        async def body():
            # the body itself starts the task, from inside the generator the writer iterates
            assert request.nursery is not None
            request.nursery.start_soon(probe.background)
            await probe.started.wait()
            n = 0
            while endless or n < 3:
                yield f"data: {n}\n\n".encode()
                n += 1
                await trio.sleep(TICK_S)
            yield b"data: end\n\n"

        return StreamResponse(
            200,
            body(),
            finalizer=probe.finalizer,
            on_interrupt=lambda reason: f"data: interrupted {reason}\n\n".encode(),
        )

    return handler


@asynccontextmanager
async def serving(probe: Probe):
    server = HttpServer(handler_for(probe), "127.0.0.1", 0, "test")
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        yield server
        nursery.cancel_scope.cancel()


async def _open(server: HttpServer, path: str) -> tuple[trio.SocketStream, bytearray]:
    """A connection to ``server`` that has sent ``GET path``, and the buffer its answer is read into."""
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await _get(stream, path)
    return stream, bytearray()


async def _get(stream: trio.SocketStream, path: str) -> None:
    await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())


async def _until(stream: trio.SocketStream, buf: bytearray, marker: bytes) -> None:
    while marker not in buf:
        data = await stream.receive_some(65536)
        assert data, f"connection closed before {marker!r}: {bytes(buf)!r}"
        buf += data


async def test_a_client_that_disconnects_mid_stream_cancels_the_bodys_task():
    probe = Probe()
    async with serving(probe) as server:
        s, buf = await _open(server, "/endless")
        await _until(s, buf, b"data: 1\n\n")
        assert probe.started.is_set() and not probe.cancelled.is_set()
        await s.aclose()  # the client goes away mid-stream
        with trio.fail_after(WAIT_S):
            await probe.cancelled.wait()
            await probe.finalized.wait()
        assert sorted(probe.log) == ["finalizer", "task cancelled"]


async def test_a_task_left_when_the_body_ends_is_cancelled_after_the_finalizer_before_the_next_request():
    probe = Probe()
    async with serving(probe) as server:
        s, buf = await _open(server, "/finite")
        with trio.fail_after(WAIT_S):
            await _until(s, buf, b"data: end\n\n")
            await _until(s, buf, b"\r\n0\r\n\r\n")  # the chunked body's end
        del buf[:]
        await _get(s, "/health")  # the same keep-alive connection
        with trio.fail_after(WAIT_S):
            await _until(s, buf, b'{"status":"ok"}')
        # the next request was read only once the last one's task had ended
        assert probe.log == ["finalizer", "task cancelled"]
        await s.aclose()


async def test_a_task_a_handler_starts_ends_with_its_whole_response():
    probe = Probe()
    async with serving(probe) as server:
        s, buf = await _open(server, "/plain")
        with trio.fail_after(WAIT_S):
            await _until(s, buf, b'{"ok":true}')
            await probe.cancelled.wait()
        await s.aclose()


async def test_a_drain_writes_on_interrupt_then_cancels_the_task():
    probe = Probe()
    async with serving(probe) as server:
        s, buf = await _open(server, "/endless")
        await _until(s, buf, b"data: 1\n\n")
        with trio.fail_after(WAIT_S):
            await server.drain(grace_s=WAIT_S)
            await _until(s, buf, b"data: interrupted the node is shutting down\n\n")
        assert probe.log == ["finalizer", "task cancelled"]
        await s.aclose()


async def test_the_tasks_of_a_request_live_in_the_servers_tree():
    """Not a system task: the task's ancestors include the task that runs the server."""
    probe = Probe()
    async with serving(probe) as server:
        s, buf = await _open(server, "/endless")
        await _until(s, buf, b"data: 0\n\n")
        assert probe.task is not None
        assert trio.lowlevel.current_task() in _ancestors(probe.task)
        await s.aclose()


def _ancestors(task: trio.lowlevel.Task) -> list[trio.lowlevel.Task]:
    out = []
    nursery = task.parent_nursery
    while nursery is not None:
        out.append(nursery.parent_task)
        nursery = nursery.parent_task.parent_nursery
    return out


async def test_wait_streams_done_returns_once_the_last_body_has_ended():
    """What a stop waits on before its drain interrupts what is left (node.py ``_hand_over``)."""
    probe = Probe()
    async with serving(probe) as server:
        with trio.fail_after(WAIT_S):
            await server.wait_streams_done()  # none open
        s, buf = await _open(server, "/endless")
        await _until(s, buf, b"data: 0\n\n")
        with trio.move_on_after(10 * TICK_S) as waiting:
            await server.wait_streams_done()
        assert waiting.cancelled_caught  # a body is streaming
        await s.aclose()  # the client goes: the body ends
        with trio.fail_after(WAIT_S):
            await server.wait_streams_done()
