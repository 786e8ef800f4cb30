"""``cape-bench attention``: forward+backward time and peak memory of one attention layer per encoding.

The layer is what a backbone runs per block: a fused q/k/v projection, the encoding's per-forward ``begin``
and input term, its q/k transform / bias / explicit logits (``PositionalEncoding.attention``), its
``after_layer``
update (TAPE), and the output projection. The reference ``sdpa`` is the same layer with no encoding at all
(a plain
``scaled_dot_product_attention`` call). Positions are synthetic but realistic: Poincaré points of radius <
0.9 in 32 dimensions and a random gene order, for 1,200 genes plus ``<cls>``/``<pad>``.

Timing: median over interleaved repeats (every encoding once per round, so drifting machine load hits all
alike).
Peak memory: on CUDA ``torch.cuda.max_memory_allocated``; on CPU the peak of live tensor storage allocated
by torch ops during the step, tracked at the dispatcher (temporaries inside a fused kernel are not seen).
For the q/k encodings we also record whether the encoding itself (``begin`` + input term + ``transform_qk``,
forward and backward) ever produced a tensor with two genes-long axes.
"""

from __future__ import annotations

import logging
import statistics
import time
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cape import encodings as enc_registry
from cape._io import save_figure, write_json, write_text
from cape._progress import progress
from cape._settings import resolve_device
from cape._tables import mean_sd_table
from cape.encodings import GenePositions, PositionalEncoding

logger = logging.getLogger("cape")

BASELINE = "sdpa"


@dataclass(frozen=True)
class AttentionShape:
    batch: int = 8
    genes: int = 1200
    d_model: int = 512
    n_heads: int = 8
    position_dim: int = 32


FULL = AttentionShape()
QUICK = AttentionShape(batch=2, genes=256, d_model=128, n_heads=4, position_dim=16)


class _LiveTensorMemory(TorchDispatchMode):
    """Peak bytes of live tensor storages created by torch ops (CPU-friendly memory high-water mark)."""

    def __init__(self, genes: int | None = None) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = 0
        self.peak = 0
        self.genes = genes
        self.square_shapes: list[tuple[int, ...]] = []

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if not isinstance(t, torch.Tensor):
                continue
            if self.genes is not None and sum(d == self.genes for d in t.shape) >= 2:
                self.square_shapes.append(tuple(t.shape))
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key and key not in self.live:
                self.live[key] = storage.nbytes()
                self.current += storage.nbytes()
                self.peak = max(self.peak, self.current)
                weakref.finalize(storage, self._free, key)
        return out


def synthetic_positions(genes: int, dim: int, seed: int = 0) -> GenePositions:
    """Positions for a vocabulary ``<pad>``, ``<cls>``, gene_0 … gene_{genes−1}: Poincaré points, an order."""
    g = torch.Generator().manual_seed(seed)
    direction = torch.nn.functional.normalize(torch.randn(genes, dim, generator=g), dim=1)
    radius = 0.9 * torch.rand(genes, 1, generator=g)
    vectors = torch.cat((torch.zeros(2, dim), direction * radius))
    order = torch.cat((torch.zeros(2), torch.randperm(genes, generator=g).float()))
    has = torch.ones(genes + 2, dtype=torch.bool)
    has[:2] = False
    return GenePositions(vectors=vectors, order=order, has_position=has, source="synthetic")


class AttentionLayer(torch.nn.Module):
    """One attention block's attention sub-layer driven through the encoding interface (or plain SDPA)."""

    def __init__(self, shape: AttentionShape, encoding: PositionalEncoding | None) -> None:
        super().__init__()
        self.shape = shape
        self.qkv = torch.nn.Linear(shape.d_model, 3 * shape.d_model)
        self.out = torch.nn.Linear(shape.d_model, shape.d_model)
        self.encoding = encoding

    def forward(self, x: torch.Tensor, gene_ids: torch.Tensor) -> torch.Tensor:
        b, length, d = x.shape
        h = self.shape.n_heads
        ctx = None
        if self.encoding is not None:
            ctx = self.encoding.begin(gene_ids, None)
            x = self.encoding.apply_input(x, ctx)
        q, k, v = self.qkv(x).view(b, length, 3, h, d // h).permute(2, 0, 3, 1, 4)
        if self.encoding is None:
            att = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        else:
            att = self.encoding.attention(q, k, v, ctx, 0)
        out = self.out(att.transpose(1, 2).reshape(b, length, d))
        if self.encoding is not None:
            self.encoding.after_layer(ctx, out, 0)
            for key in ("re", "im"):  # make TAPE's updated state part of the step's result
                if key in ctx.state:
                    out = out + 0.0 * ctx.state[key].sum()
        return out


def _build(name: str, shape: AttentionShape, positions: GenePositions,
           device: torch.device) -> AttentionLayer:
    encoding = None
    if name != BASELINE:
        # two layers so that TAPE's position update after layer 0 is part of the measured step
        encoding = enc_registry.get(name, d_model=shape.d_model, n_heads=shape.n_heads, n_layers=2,
                                    vocab_size=shape.genes + 2, positions=positions)
    return AttentionLayer(shape, encoding).to(device)


def _step(layer: AttentionLayer, x: torch.Tensor, ids: torch.Tensor) -> None:
    layer.zero_grad(set_to_none=True)
    x.grad = None
    layer(x, ids).square().mean().backward()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(encodings: list[str] | None = None, *, quick: bool = False, repeats: int | None = None,
        device: str | None = "auto", seed: int = 0, shape: AttentionShape | None = None) -> list[dict]:
    """Time and measure every encoding's attention layer; returns flat records (one per value).

    Metrics
    -------
    time_ms
        One forward+backward of the layer, per round (rounds interleave all encodings).
    ratio_vs_sdpa
        Median over rounds of time / plain-SDPA time of the same round (paired: load drifts cancel).
    ratio_best_vs_sdpa
        Fastest round / fastest plain-SDPA round (contention only adds time).
    encoding_only_ms, estimated_ratio_vs_sdpa
        For encodings whose whole per-layer work is in ``begin``/``apply_input``/``transform_qk``/``attn_bias``
        (not HoPE's explicit attention, not TAPE's ``after_layer``): forward+backward of those hooks alone, and
        1 + (that − the same for ``none``)/SDPA layer time, median over rounds. Much less sensitive to machine
        load than the difference of two whole-layer timings.
    peak_mib
        Peak memory of one step; ``genes_x_genes_in_encoding``: 1 if a rotary encoding made an L×L tensor.
    """
    shape = shape or (QUICK if quick else FULL)
    names = [BASELINE, *(encodings or enc_registry.available())]
    unknown = [n for n in names if n != BASELINE and n not in enc_registry.available()]
    if unknown:
        enc_registry.get_class(unknown[0])  # raises CapeInputError listing the available ones
    repeats = repeats or (10 if quick else 5)
    dev = resolve_device(device)
    torch.manual_seed(seed)
    positions = synthetic_positions(shape.genes, shape.position_dim, seed)
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(shape.genes, generator=g) + 2 for _ in range(shape.batch)])
    ids[:, 0] = 1  # <cls>
    ids = ids.to(dev)
    x = torch.randn(shape.batch, shape.genes, shape.d_model, generator=g).to(dev).requires_grad_()
    layers = {name: _build(name, shape, positions, dev) for name in names}  # tables move with .to(dev)
    base = {"benchmark": "attention", "device": str(dev), "torch_threads": torch.get_num_threads(),
            **asdict(shape)}
    records: list[dict] = []

    # memory (and the genes×genes check) in a separate pass, so that tracking does not slow the timings
    for name in progress(names, desc="attention memory"):
        layer = layers[name]
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)
            before = torch.cuda.memory_allocated(dev)
            _step(layer, x, ids)
            _sync(dev)
            peak = torch.cuda.max_memory_allocated(dev) - before
        else:
            with _LiveTensorMemory() as tracker:
                _step(layer, x, ids)
            peak = tracker.peak
        records.append({**base, "encoding": name, "metric": "peak_mib", "value": peak / 2**20})
        if layer.encoding is not None and "qk" in layer.encoding.provides and layer.encoding.rotary:
            records.append({**base, "encoding": name, "metric": "genes_x_genes_in_encoding",
                            "value": float(_makes_square_tensor(layer, x, ids))})

    head_dim = shape.d_model // shape.n_heads
    qkv = torch.randn(shape.batch, shape.genes, 3, shape.n_heads, head_dim, generator=g).to(dev)
    qkv.requires_grad_()
    hooks_only = [n for n in names if n != BASELINE and _hooks_hold_all_work(layers[n].encoding)]
    if hooks_only and "none" not in hooks_only:
        hooks_only = []  # the estimate needs the 'none' reference
    for name in names:  # warm-up (allocator, kernels, caches)
        _step(layers[name], x, ids)
        if name in hooks_only:
            _encoding_step(layers[name].encoding, x, qkv, ids)
    _sync(dev)
    times: dict[str, list[float]] = {name: [] for name in names}
    hook_times: dict[str, list[float]] = {name: [] for name in hooks_only}
    for r in progress(range(repeats), desc="attention timing"):
        for name in names:
            _sync(dev)
            start = time.perf_counter()
            _step(layers[name], x, ids)
            _sync(dev)
            elapsed = (time.perf_counter() - start) * 1e3
            times[name].append(elapsed)
            records.append({**base, "encoding": name, "metric": "time_ms", "value": elapsed, "repeat": r})
            if name in hooks_only:
                start = time.perf_counter()
                _encoding_step(layers[name].encoding, x, qkv, ids)
                _sync(dev)
                elapsed = (time.perf_counter() - start) * 1e3
                hook_times[name].append(elapsed)
                records.append({**base, "encoding": name, "metric": "encoding_only_ms", "value": elapsed,
                                "repeat": r})
    for name in hooks_only:
        estimate = statistics.median(
            1 + (t - t_none) / t_sdpa
            for t, t_none, t_sdpa in zip(hook_times[name], hook_times["none"], times[BASELINE], strict=True)
        )
        records.append({**base, "encoding": name, "metric": "estimated_ratio_vs_sdpa", "value": estimate})
    best = min(times[BASELINE])
    for name in names:
        # paired per round (SDPA timed in the same round), then the median: slow drifts in load cancel
        ratio = statistics.median(t / ref for t, ref in zip(times[name], times[BASELINE], strict=True))
        records.append({**base, "encoding": name, "metric": "ratio_vs_sdpa", "value": ratio})
        # best-of-repeats ratio: contention only ever adds time, so the minimum is the least noisy estimate
        records.append({**base, "encoding": name, "metric": "ratio_best_vs_sdpa",
                        "value": min(times[name]) / best})
        logger.info("attention %s: %.1f ms median, %.3f× SDPA (best-of: %.3f×)", name,
                    statistics.median(times[name]), ratio, min(times[name]) / best)
    return records


def _hooks_hold_all_work(encoding: PositionalEncoding) -> bool:
    return ("attention" not in encoding.provides
            and type(encoding).after_layer is PositionalEncoding.after_layer)


def _encoding_step(encoding: PositionalEncoding, x: torch.Tensor, qkv: torch.Tensor, ids: torch.Tensor) -> None:
    """Forward+backward of the encoding's hooks alone (no projections, no attention)."""
    encoding.zero_grad(set_to_none=True)
    qkv.grad = None
    q, k, _ = qkv.permute(2, 0, 3, 1, 4)
    ctx = encoding.begin(ids, None)
    total = encoding.apply_input(x.detach(), ctx).sum()
    q2, k2 = encoding.transform_qk(q, k, ctx, 0)
    total = total + q2.sum() + k2.sum()
    bias = encoding.attn_bias(ctx, 0)
    if bias is not None:
        total = total + bias.sum()
    total.backward()


def _makes_square_tensor(layer: AttentionLayer, x: torch.Tensor, ids: torch.Tensor) -> bool:
    enc = layer.encoding
    b, length, d = x.shape
    h = layer.shape.n_heads
    q = torch.randn(b, h, length, d // h, device=x.device, requires_grad=True)
    k = torch.randn(b, h, length, d // h, device=x.device, requires_grad=True)
    with _LiveTensorMemory(genes=length) as tracker:
        ctx = enc.begin(ids, None)
        xi = enc.apply_input(x.detach(), ctx)
        q2, k2 = enc.transform_qk(q, k, ctx, 0)
        (q2.sum() + k2.sum() + xi.sum()).backward()
    return bool(tracker.square_shapes)


def summarise(records: list[dict]) -> dict[str, float]:
    """Median ratio vs SDPA per encoding."""
    return {r["encoding"]: r["value"] for r in records if r["metric"] == "ratio_vs_sdpa"}


def write_report(records: list[dict], out: str | Path, name: str = "attention") -> dict[str, Path]:
    """``<out>/<name>.json`` (records), ``.md`` (mean ± sd table), ``.png`` (time ratio, peak memory)."""

    matplotlib.use("Agg")

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": write_json(records, out / f"{name}.json")}
    first = records[0]
    header = (
        f"# Attention layer cost per positional encoding\n\n"
        "One attention layer (q/k/v projection, encoding, attention, output projection), "
        "forward + backward; "
        f"batch {first['batch']}, {first['genes']} genes (+<cls>), d_model {first['d_model']}, "
        f"{first['n_heads']} heads, on {first['device']} ({first['torch_threads']} torch threads). "
        "time_ms: mean ± sd over interleaved rounds; ratio_vs_sdpa: median over rounds of time / plain-SDPA "
        "time in the same round; ratio_best_vs_sdpa: fastest round / fastest SDPA round; encoding_only_ms: "
        "forward+backward of the encoding's hooks alone (encodings whose work is all in begin/apply_input/"
        "transform_qk/attn_bias); estimated_ratio_vs_sdpa: 1 + (encoding_only − the same for none) / SDPA "
        "layer time, median over rounds (the least load-sensitive estimate of the overhead); peak_mib: peak "
        "tensor memory of one step; genes_x_genes_in_encoding: 1 if the rotary encoding itself formed a "
        "genes×genes tensor (0 = never). CPU timings on a shared machine include contention noise.\n\n"
    )
    table = mean_sd_table(records, rows=["encoding"], columns=["metric"])
    paths["md"] = write_text(header + table + "\n", out / f"{name}.md")

    names = list(dict.fromkeys(r["encoding"] for r in records))
    ratio = summarise(records)
    peak = {r["encoding"]: r["value"] for r in records if r["metric"] == "peak_mib"}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    at = np.arange(len(names))
    colours = ["0.5" if n == BASELINE else ("tab:red" if n == "cape" else "tab:blue") for n in names]
    estimate = {r["encoding"]: r["value"] for r in records if r["metric"] == "estimated_ratio_vs_sdpa"}
    # the best-round ratio stays in the table: one lucky SDPA round skews it too much to plot
    axes[0].bar(at - 0.2, [ratio[n] for n in names], width=0.4, color=colours, label="median of paired rounds")
    axes[0].bar(at + 0.2, [estimate.get(n, np.nan) for n in names], width=0.4, color=colours, alpha=0.4,
                hatch="//", label="1 + encoding-only overhead")
    axes[0].axhline(1.0, color="k", lw=0.8)
    axes[0].axhline(1.1, color="tab:red", lw=0.8, ls="--", label="1.10× target")
    axes[0].set_ylabel("time / plain SDPA")
    axes[0].legend(frameon=False, fontsize=8)
    axes[1].bar(at, [peak[n] for n in names], color=colours)
    axes[1].set_ylabel("peak tensor memory of one step (MiB)")
    for ax in axes:
        ax.set_xticks(at, names, rotation=45, ha="right")
        ax.spines[["top", "right"]].set_visible(False)
    fig.suptitle(f"One attention layer, fwd+bwd: B={first['batch']}, L={first['genes']}, "
                 f"D={first['d_model']}, "
                 f"H={first['n_heads']}, {first['device']}")
    fig.tight_layout()
    paths["png"] = save_figure(fig, out / f"{name}.png")
    plt.close(fig)
    return paths

