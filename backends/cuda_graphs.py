"""``torch.cuda.CUDAGraph`` capture of a step's forward, for hyspec.engine.step_graphs.

The forward is first run twice on a side stream (Triton compiles its kernels,
cuBLAS creates its workspaces: neither may happen inside a capture), then
recorded once.  Recording executes nothing, so the buffers it leaves are
the graph's outputs, refreshed by every replay.  All graphs of one engine
share one memory pool: they are replayed one at a time on one stream, and
the outputs of each stay referenced by their step, so no later capture
reuses them.

Not executed on this project's CI (no GPU): the structure the recording
needs is checked there with ``ReexecutingCapturer``; ``scripts/gpu_first_contact.sh``
runs this capturer on a GPU.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

WARMUP_RUNS = 2


class CUDAGraphCapturer:
    kind = "cuda_graph"

    def __init__(self, device: torch.device):
        self.device = device
        self._pool: Any = None

    def capture(self, fn: Callable[[], Any]) -> tuple[Callable[[], None], Any]:
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                fn()
        current.wait_stream(side)
        torch.cuda.synchronize(self.device)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = fn()
        return graph.replay, outputs


__all__ = ["CUDAGraphCapturer"]
