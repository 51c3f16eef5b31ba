"""VRAM comes from ggml's device API through the RPC worker's readiness report (the worker computes on
the first GPU device when ggml has one): the announcement's hardware.vram_bytes."""

from __future__ import annotations

from hydra_node.runtime.hosting.service import ModelRuntime
from hydra_node.runtime.rpc.supervisor import WorkerState, WorkerStatistics


class ReportedWorker:
    """Holds one readiness report, as RpcWorkerSupervisor.statistics() returns it."""

    def __init__(self, device: str | None, total: int):
        self.stats = WorkerStatistics(WorkerState.READY, "127.0.0.1:1", "3.0.0", total // 2, total, device, 0, 1, None)

    def statistics(self) -> WorkerStatistics:
        return self.stats


def _runtime(worker) -> ModelRuntime:
    rt = ModelRuntime.__new__(ModelRuntime)
    rt.worker = worker
    return rt


def test_vram_is_the_gpu_workers_memory_and_zero_on_cpu():
    assert _runtime(ReportedWorker("CUDA0", 80 << 30)).vram_bytes() == 80 << 30
    assert _runtime(ReportedWorker("Vulkan0", 8 << 30)).vram_bytes() == 8 << 30
    assert _runtime(ReportedWorker("CPU", 32 << 30)).vram_bytes() == 0
    assert _runtime(ReportedWorker(None, 0)).vram_bytes() == 0
    assert _runtime(None).vram_bytes() == 0
