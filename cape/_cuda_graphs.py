"""Training steps replayed as CUDA graphs: one launch per step instead of one per kernel.

A small model's step on a GPU is bound by the host: Python and the CUDA launch of each of its ~100–300 kernels take
far longer than the kernels run, so the card idles. :class:`CapturedStep` records a whole step (forward, backward and
optimiser update) once per input shape as a CUDA graph and replays it; the host then spends a few microseconds per
step. The step function must be capturable: device tensors in and out, no host synchronisation (no ``.item()``,
``float(tensor)``, ``nonzero`` or error-checked linear algebra), no new Python constants between calls (values that
change must live in device tensors updated in place), and an optimiser built with ``capturable=True``. Its outputs
must be allocated outside the step (e.g. a running sum it adds to): the graphs share one memory pool, so whatever a
step allocates is overwritten by the next. The first ``warmup`` calls, and the first call of each new input shape,
run eagerly on a side stream (as PyTorch's whole-network capture recipe asks: they create the optimiser state, the
libraries' handles and the attention kernels' plans for that shape); where capturing fails, the step stays eager and a
warning says why.
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
        Outputs must be tensors allocated outside the step (see the module docstring).
    warmup
        Eager calls before the first capture (and each new input shape's first call is eager too).
    name
        What the warning names when a capture fails.
    """

    def __init__(self, step: Callable[..., tuple[torch.Tensor, ...]], warmup: int = 3, name: str = "training step"
                 ) -> None:
        self.step, self.warmup, self.name = step, int(warmup), name
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, list[torch.Tensor], tuple[torch.Tensor, ...]]] = {}
        self.calls = 0
        self.replays = 0
        self.seen: set[tuple] = set()
        self.failed: str | None = None
        self._side = torch.cuda.Stream()
        self._pool = None

    @property
    def captured(self) -> bool:
        """Whether some step ran from a graph (False while warming up, or where capturing failed)."""
        return self.replays > 0

    def release(self) -> None:
        """Drop the graphs and their memory pool: a finished run keeps nothing on the device (a graph's pool is freed
        only with the graph, and a step that refers to its own capture would otherwise wait for the garbage
        collector)."""
        self.graphs.clear()
        self._pool = None

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self.calls += 1
        key = tuple((tuple(t.shape), t.dtype) for t in inputs)
        entry = self.graphs.get(key)
        warm = self.calls > self.warmup and key in self.seen
        self.seen.add(key)
        if entry is None and self.failed is None and warm:
            entry = self._capture(key, inputs)
        if entry is None:
            return self._eager(inputs, side=not warm)
        graph, static_inputs, outputs = entry
        for static, value in zip(static_inputs, inputs, strict=True):
            static.copy_(value, non_blocking=True)
        graph.replay()
        self.replays += 1
        return outputs

    def _eager(self, inputs: Sequence[torch.Tensor], side: bool) -> tuple[torch.Tensor, ...]:
        if not side:
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
            with torch.cuda.graph(graph, pool=self._pool):
                outputs = self.step(*static_inputs)
        except Exception as err:  # an operation that cannot be captured: the eager step is always correct
            self.failed = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            logger.warning("CUDA graph capture of the %s failed (%s); running it kernel by kernel", self.name,
                           self.failed)
            torch.cuda.synchronize()
            return None
        self._pool = graph.pool() if self._pool is None else self._pool
        self.graphs[key] = (graph, static_inputs, outputs)
        # Capture records the kernels without running them: this call's step is the first replay.
        return self.graphs[key]
