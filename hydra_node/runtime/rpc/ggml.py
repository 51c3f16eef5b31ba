"""ctypes bindings to the ggml RPC backend inside llama-cpp-python's own libraries.

The libraries are opened **by soname** (``libggml.so.0``, ``libggml-rpc.so.0``) with
``RTLD_GLOBAL``: that is the file ``libllama.so`` was linked against, so we share its
one ggml device registry.  The wheel ships ``libggml.so`` as a *copy*, not a symlink;
opening it creates a second ggml with its own registry and llama.cpp then silently
ignores every RPC device we register.

Signatures are those of ``ggml/include/ggml-rpc.h`` and ``ggml-backend.h`` in the
llama.cpp vendored by llama-cpp-python 0.3.36.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

from hydra_node.runtime.rpc.proto import (  # re-exported: the protocol version is part of this binding's contract
    GGML_RPC_MAX_SERVERS,
    RPC_PROTO,
    RPC_PROTO_MAJOR_VERSION,
    RPC_PROTO_MINOR_VERSION,
    RPC_PROTO_PATCH_VERSION,
    ProtoVersion,
)

__all__ = [
    "GGML_RPC_MAX_SERVERS",
    "RPC_PROTO",
    "RPC_PROTO_MAJOR_VERSION",
    "RPC_PROTO_MINOR_VERSION",
    "RPC_PROTO_PATCH_VERSION",
    "ProtoVersion",
    "RpcUnavailable",
    "Ggml",
    "DeviceInfo",
    "load",
]

GGML_BACKEND_DEVICE_TYPE_CPU = 0
GGML_BACKEND_DEVICE_TYPE_GPU = 1

_SONAMES = ("libggml-base.so.0", "libggml.so.0", "libggml-rpc.so.0")
REBUILD_HINT = "rebuild llama-cpp-python with -DGGML_RPC=on (make install does this)"


class RpcUnavailable(RuntimeError):
    """This node's llama-cpp-python cannot do RPC (our install's fault, not a peer's)."""


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    description: str
    free_bytes: int
    total_bytes: int
    backend: str  # name of the backend registry: "CPU", "RPC", ...


class Ggml:
    """Typed entry points of the shared ggml; get the single instance with :func:`load`."""

    def __init__(self, libdir: Path):
        try:
            libs = [ctypes.CDLL(str(libdir / name), mode=ctypes.RTLD_GLOBAL) for name in _SONAMES]
        except OSError as exc:
            raise RpcUnavailable(f"cannot open ggml RPC libraries in {libdir}: {exc}; {REBUILD_HINT}") from exc
        self._base, self._ggml, self._rpc = libs
        vp, cp, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t

        def fn(lib, name, restype, *argtypes):
            try:
                f = getattr(lib, name)
            except AttributeError as exc:
                raise RpcUnavailable(f"ggml symbol {name} missing; {REBUILD_HINT}") from exc
            f.restype, f.argtypes = restype, list(argtypes)
            return f

        self.dev_count = fn(self._ggml, "ggml_backend_dev_count", sz)
        self.dev_get = fn(self._ggml, "ggml_backend_dev_get", vp, sz)
        self.dev_by_type = fn(self._ggml, "ggml_backend_dev_by_type", vp, ctypes.c_int)
        self.register = fn(self._ggml, "ggml_backend_register", None, vp)
        self.dev_name = fn(self._base, "ggml_backend_dev_name", cp, vp)
        self.dev_description = fn(self._base, "ggml_backend_dev_description", cp, vp)
        self.dev_memory = fn(self._base, "ggml_backend_dev_memory", None, vp, ctypes.POINTER(sz), ctypes.POINTER(sz))
        self.dev_type = fn(self._base, "ggml_backend_dev_type", ctypes.c_int, vp)
        self.dev_backend_reg = fn(self._base, "ggml_backend_dev_backend_reg", vp, vp)
        self.reg_name = fn(self._base, "ggml_backend_reg_name", cp, vp)
        self.reg_dev_count = fn(self._base, "ggml_backend_reg_dev_count", sz, vp)
        self.reg_dev_get = fn(self._base, "ggml_backend_reg_dev_get", vp, vp, sz)
        self.cpu_buffer_type = fn(self._base, "ggml_backend_cpu_buffer_type", vp)
        # void ggml_backend_rpc_start_server(const char *endpoint, const char *cache_dir,
        #                                    size_t n_threads, size_t n_devices, ggml_backend_dev_t *devices)
        self.rpc_start_server = fn(self._rpc, "ggml_backend_rpc_start_server", None, cp, cp, sz, sz, ctypes.POINTER(vp))
        # ggml_backend_reg_t ggml_backend_rpc_add_server(const char *endpoint)
        self.rpc_add_server = fn(self._rpc, "ggml_backend_rpc_add_server", vp, cp)

    def device_info(self, dev: int) -> DeviceInfo:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        reg = self.dev_backend_reg(dev)
        return DeviceInfo(
            name=(self.dev_name(dev) or b"").decode(errors="replace"),
            description=(self.dev_description(dev) or b"").decode(errors="replace"),
            free_bytes=free.value,
            total_bytes=total.value,
            backend=(self.reg_name(reg) or b"").decode(errors="replace") if reg else "",
        )

    def devices(self) -> list[DeviceInfo]:
        """Every device in the shared registry, in registry order.

        Careful: querying the memory of an RPC device talks to its worker.
        """
        return [self.device_info(self.dev_get(i)) for i in range(self.dev_count())]

    def cpu_device(self) -> int:
        dev = self.dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)
        if not dev:
            raise RpcUnavailable("ggml has no CPU device")
        return dev


def llama_libdir() -> Path:
    """Folder of the libraries llama-cpp-python itself loaded."""
    import llama_cpp  # imported here: loading it is slow and pulls in libllama

    return Path(llama_cpp.__file__).resolve().parent / "lib"


@functools.cache
def load() -> Ggml:
    """Open the shared ggml once per process; :class:`RpcUnavailable` if RPC is absent."""
    import llama_cpp

    if not llama_cpp.llama_supports_rpc():
        raise RpcUnavailable(f"llama-cpp-python {llama_cpp.__version__} was built without RPC; {REBUILD_HINT}")
    return Ggml(llama_libdir())


def check_rpc_support() -> None:
    """Refuse to start with a llama-cpp-python that was built without RPC.

    Looks for ggml's RPC library beside llama-cpp-python's without importing it: loading
    llama.cpp in the node process would initialise every GPU backend here too (on a CUDA
    build about 550 MiB of RSS and a GPU context, measured on an H200); only runners load it
    (and check ``llama_supports_rpc()`` again)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("llama_cpp")
    libdir = Path(spec.origin).parent / "lib" if spec is not None and spec.origin else None
    if libdir is None or not any(libdir.glob("libggml-rpc.so*")):
        raise RuntimeError(
            "this llama-cpp-python was built without RPC support; run `make install`, which "
            "builds llama-cpp-python 0.3.36 with CMAKE_ARGS=-DGGML_RPC=on"
        )
