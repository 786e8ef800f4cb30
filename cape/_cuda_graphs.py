"""Training steps replayed as CUDA graphs: one launch per step instead of one per kernel.

A small model's step on a GPU is bound by the host: Python and the CUDA launch of each of its ~100–300 kernels take
far longer than the kernels run, so the card idles. :class:`CapturedStep` records a whole step (forward, backward and
optimiser update) once per input shape as a CUDA graph and replays it; the host then spends a few microseconds per
step. The step function must be capturable: device tensors in and out, no host synchronisation (no ``.item()``,
``float(tensor)``, ``nonzero`` or error-checked linear algebra), no new Python constants between calls (values that
change must live in device tensors updated in place), and an optimiser built with ``capturable=True``. The first
``warmup`` calls run eagerly on a side stream (as PyTorch's whole-network capture recipe asks: it creates the
optimiser state and the libraries' handles); where capturing fails, the step stays eager and a warning says why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch

__all__ = ["CapturedStep"]

logger = logging.getLogger("cape")


class CapturedStep:
    """``step(*inputs)`` run eagerly for ``warmup`` calls, then replayed from one CUDA graph per input shape.

    Parameters
    ----------
    step
        The training step: takes device tensors (e.g. a batch's row indices), returns a tuple of device tensors.
        Outputs of a replayed step are the graph's static tensors: read (or copy) them before the next call.
    warmup
        Eager calls before the first capture.
    name
        What the warning names when a capture fails.
    """

    def __init__(self, step: Callable[..., tuple[torch.Tensor, ...]], warmup: int = 3, name: str = "training step"
                 ) -> None:
        self.step, self.warmup, self.name = step, int(warmup), name
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, list[torch.Tensor], tuple[torch.Tensor, ...]]] = {}
        self.calls = 0
        self.failed: str | None = None
        self._side = torch.cuda.Stream()

    @property
    def captured(self) -> bool:
        """Whether some step ran from a graph (False while warming up, or where capturing failed)."""
        return bool(self.graphs)

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self.calls += 1
        key = tuple((tuple(t.shape), t.dtype) for t in inputs)
        entry = self.graphs.get(key)
        if entry is None and self.failed is None and self.calls > self.warmup:
            entry = self._capture(key, inputs)
        if entry is None:
            return self._eager(inputs)
        graph, static_inputs, outputs = entry
        for static, value in zip(static_inputs, inputs, strict=True):
            static.copy_(value, non_blocking=True)
        graph.replay()
        return outputs

    def _eager(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        if self.calls > self.warmup:
            return self.step(*inputs)
        # Warm-up on a side stream, as capture asks; the main stream waits for it.
        self._side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self._side):
            out = self.step(*inputs)
        torch.cuda.current_stream().wait_stream(self._side)
        return out

    def _capture(self, key: tuple, inputs: Sequence[torch.Tensor]):
        static_inputs = [t.clone() for t in inputs]
        graph = torch.cuda.CUDAGraph()
        try:
            torch.cuda.synchronize()
            with torch.cuda.graph(graph):
                outputs = self.step(*static_inputs)
        except Exception as err:  # an operation that cannot be captured: the eager step is always correct
            self.failed = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            logger.warning("CUDA graph capture of the %s failed (%s); running it kernel by kernel", self.name,
                           self.failed)
            torch.cuda.synchronize()
            return None
        self.graphs[key] = (graph, static_inputs, outputs)
        # Capture records the kernels without running them: this call's step is the first replay.
        return self.graphs[key]
