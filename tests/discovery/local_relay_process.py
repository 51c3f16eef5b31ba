"""nostr-sdk's LocalRelay as a stand-alone process (asyncio), for tests and benchmarks that run nodes as processes.

Prints ``ws://127.0.0.1:PORT`` on one line once listening, then serves until stdin closes or SIGTERM.
Usage: ``python tests/discovery/local_relay_process.py [PORT]``.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from nostr_sdk import LocalRelayBuilder, RateLimit


async def main(port: int | None) -> None:
    builder = LocalRelayBuilder().addr("127.0.0.1").rate_limit(RateLimit(max_reqs=1000, notes_per_minute=100_000))
    if port is not None:
        builder = builder.port(port)
    relay = builder.build()
    await relay.run()
    print(str(await relay.url()), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_reader(sys.stdin.fileno(), lambda: stop.set() if not sys.stdin.buffer.read1(4096) else None)
    await stop.wait()
    relay.shutdown()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else None))
