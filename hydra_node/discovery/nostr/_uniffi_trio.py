"""Run nostr-sdk's asyncio-only ``async def`` calls under trio (used for the test relay only).

Every generated coroutine in ``nostr_sdk.nostr_sdk`` awaits the module-global
``_uniffi_rust_call_async``; :func:`install` replaces it with a trio version whose
wake-up goes through ``TrioToken.run_sync_soon`` (Rust calls the continuation from a
tokio thread).  The node itself speaks NIP-01 over trio-websocket and never needs
this; tests use it to run nostr-sdk's ``LocalRelay`` in-process.  It relies on private
UniFFI names, so nostr-sdk is pinned (0.45.1) and the relay tests act as a canary.
"""

from __future__ import annotations

import trio

import nostr_sdk.nostr_sdk as _m

_installed = False


class _Loop:
    """The part of an asyncio loop the UniFFI continuation callback uses."""

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self.token = token

    def call_soon_threadsafe(self, fn, *args) -> None:
        try:
            self.token.run_sync_soon(fn, *args)
        except trio.RunFinishedError:
            pass


class _Future:
    def __init__(self) -> None:
        self.event = trio.Event()
        self.result = None

    def cancelled(self) -> bool:
        return False

    def set_result(self, value) -> None:
        self.result = value
        self.event.set()


async def _call_async_trio(rust_future, ffi_poll, ffi_complete, ffi_free, lift_func, error_ffi_converter):
    loop = _Loop(trio.lowlevel.current_trio_token())
    try:
        while True:
            fut = _Future()
            ffi_poll(rust_future, _m._uniffi_continuation_callback, _m._UniffiContinuationHandleMap.insert((loop, fut)))
            await fut.event.wait()
            if fut.result == _m._UNIFFI_RUST_FUTURE_POLL_READY:
                break
        return lift_func(_m._uniffi_rust_call_with_error(error_ffi_converter, ffi_complete, rust_future))
    finally:
        ffi_free(rust_future)  # on cancellation this drops the Rust future


def install() -> None:
    """Make nostr-sdk's async API awaitable from trio (idempotent; process-wide)."""
    global _installed
    if not _installed:
        for name in (
            "_uniffi_rust_call_async",
            "_uniffi_continuation_callback",
            "_UniffiContinuationHandleMap",
            "_UNIFFI_RUST_FUTURE_POLL_READY",
            "_uniffi_rust_call_with_error",
        ):
            if not hasattr(_m, name):
                raise RuntimeError(f"nostr-sdk internals changed ({name} missing); pin nostr-sdk==0.45.1")
        _m._uniffi_rust_call_async = _call_async_trio
        _installed = True
