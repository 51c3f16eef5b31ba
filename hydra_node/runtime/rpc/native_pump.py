"""Drive ``hydra_node/native/pump.c`` (built by ``make install``) from trio.

The C pump moves a tunnel's bytes between a TCP socket and a data connection in a
thread of its own (the GIL is released for the whole call), with the same frames as the
Python pump (``dataconn.py``), whose AEAD functions it borrows from PyNaCl's libsodium.
It replaces some 2 ms of Python per decoded token and link (``bench/split.py``).  When
the library is missing the tunnel uses the Python pump and says so in its status.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

import trio

from hydra_node.runtime.rpc.dataconn import DataConnection

log = logging.getLogger("hydra.rpc.native_pump")

LIBRARY = Path(__file__).resolve().parents[2] / "native" / "_pump.so"
#: Threads the native pumps of one process may hold (one per tunnel connection).
MAX_PUMP_THREADS = 256
_limiter: trio.CapacityLimiter | None = None

END_REASONS = {
    0: "tcp eof",
    1: "data connection closed",
    2: "stopped",
    3: "tcp error",
    4: "data connection error",
    5: "data: oversize",
    6: "data: tamper",
    7: "data: reorder",
    8: "data: bad_frame",
}
#: End reasons that are a peer's bad frame (logged and counted like the Python pump's).
REJECTIONS = {5, 6, 7, 8}


class PumpStats(ctypes.Structure):
    _fields_ = [
        ("plain_up", ctypes.c_uint64),
        ("plain_down", ctypes.c_uint64),
        ("send_counter", ctypes.c_uint64),
        ("recv_counter", ctypes.c_uint64),
        ("frames_up", ctypes.c_uint64),
        ("frames_down", ctypes.c_uint64),
    ]


class _Native:
    def __init__(self, path: Path):
        lib = ctypes.CDLL(str(path))
        self.pump = lib.hydra_pump
        self.pump.restype = ctypes.c_int
        self.pump.argtypes = [
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.POINTER(PumpStats),
        ]
        from nacl._sodium import ffi, lib as sodium

        self.enc = int(ffi.cast("uintptr_t", ffi.addressof(sodium, "crypto_aead_xchacha20poly1305_ietf_encrypt")))
        self.dec = int(ffi.cast("uintptr_t", ffi.addressof(sodium, "crypto_aead_xchacha20poly1305_ietf_decrypt")))


_native: _Native | None = None
_load_error: str | None = None


def native() -> _Native | None:
    """The loaded library, or None (``load_error()`` says why)."""
    global _native, _load_error
    if _native is None and _load_error is None:
        try:
            _native = _Native(LIBRARY)
        except (OSError, AttributeError, ImportError) as exc:
            _load_error = f"{LIBRARY.name} not usable ({exc}); run `make install` to build it"
            log.warning("event=native_pump_unavailable error=%r (tunnels use the Python pump)", _load_error)
    return _native


def load_error() -> str | None:
    native()
    return _load_error


async def pump(tcp: trio.SocketStream, conn: DataConnection, control) -> str:
    """Run the native pump until either side ends, a frame is bad, or ``control`` ends
    (or this task is cancelled); return how it ended.  The caller closes the sockets."""
    global _limiter
    lib = native()
    assert lib is not None, "call native() first"
    if _limiter is None:
        _limiter = trio.CapacityLimiter(MAX_PUMP_THREADS)
    send_key, recv_key = conn.keys()
    stats = PumpStats(send_counter=conn.send_counter, recv_counter=conn.receive_counter)
    stop_r, stop_w = os.pipe()
    tcp_fd, data_fd = tcp.socket.fileno(), conn.tcp.socket.fileno()
    ended = "stopped"

    def run() -> int:
        return lib.pump(tcp_fd, data_fd, stop_r, send_key, recv_key, lib.enc, lib.dec, ctypes.byref(stats))

    async def stop_when_cancelled() -> None:
        try:
            await trio.sleep_forever()
        finally:
            os.write(stop_w, b"x")  # the C loop polls stop_r: it returns at once

    async def watch_control() -> None:
        nonlocal ended
        try:
            while await control.receive():
                pass
            ended = "control stream ended"
        except Exception as exc:  # StreamReset, LinkClosed
            ended = f"control: {exc}"
        nursery.cancel_scope.cancel()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop_when_cancelled)
            nursery.start_soon(watch_control)
            code = await trio.to_thread.run_sync(run, limiter=_limiter)
            if code != 2:
                ended = END_REASONS.get(code, f"code {code}")
                if code in REJECTIONS:
                    log.warning("event=tunnel_data_frame_rejected reason=%s", ended.split(": ")[1])
            nursery.cancel_scope.cancel()
    finally:
        conn.bytes_sent += stats.plain_up
        conn.bytes_received += stats.plain_down
        os.close(stop_r)
        os.close(stop_w)
    return ended
