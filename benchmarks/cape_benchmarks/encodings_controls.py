"""Controls of ``cape-bench encodings`` that separate causal structure from gene identity (issue 33).

Each takes a position set (an AnnData with Steps I–III's keys) and a seed, and returns a copy in which one thing is
destroyed while everything else is kept:

* ``random_directions``: every positioned gene keeps the norm ‖e‖ of its Poincaré point (its causal generality, the
  thin shell Step II puts genes on) but gets a direction drawn uniformly on the sphere: the angles stay as spread
  as CAPE's, the causal neighbourhoods are gone. Step III is re-run with the set's recorded map (scale, bands).
* ``permuted``: the gene labels are permuted among the positioned genes: gene i takes gene π(i)'s point, edges and
  generality, so the graph is the same up to relabelling, but genes sit where other genes' causes and effects are.
  RoPE on a permuted set ranks genes by a uniformly random order.

A control's seed is the model's seed in the benchmark, so that the seeds' spread includes the control's own draw.
"""

from __future__ import annotations

import anndata as ad
import numpy as np
import scipy.sparse as sp
import torch

from cape import tl
from cape._errors import CapeInputError
from cape.hyperbolic.poincare import poincare_to_lorentz

CONTROLS = ("random_directions", "permuted")

#: What each control keeps and destroys, in the benchmark's report.
CONTROL_WORDS = {"random_directions": "every gene keeps its Poincaré norm, its direction is random",
                 "permuted": "the genes' labels are permuted (the same positions and graph, on other genes)"}


def _positioned(adata: ad.AnnData) -> np.ndarray:
    """Indices of the genes that have a position: in ``var["cape_used"]`` with finite Poincaré coordinates."""
    if "cape_poincare" not in adata.varm:
        raise CapeInputError("a control needs varm['cape_poincare'] (run Steps II-III first)")
    used = (adata.var["cape_used"].to_numpy(dtype=bool) if "cape_used" in adata.var
            else np.ones(adata.n_vars, dtype=bool))
    finite = np.isfinite(np.asarray(adata.varm["cape_poincare"], dtype=np.float64)).all(axis=1)
    return np.flatnonzero(used & finite)


def _rerun_step_iii(adata: ad.AnnData) -> None:
    """Re-derive the Lorentz points and the angles from ``varm["cape_poincare"]`` with the recorded Step III map."""
    e = np.asarray(adata.varm["cape_poincare"], dtype=np.float64)
    if "cape_lorentz" in adata.varm:
        adata.varm["cape_lorentz"] = poincare_to_lorentz(torch.from_numpy(e)).numpy()
    if "cape_angles" in adata.varm:
        params = adata.uns.get("cape", {}).get("rotary_encoding", {}).get("params", {})
        tl.rotary_encoding(adata, **{k: params[k] for k in ("scale", "bands", "band_top") if k in params})


def random_directions(adata: ad.AnnData, seed: int) -> ad.AnnData:
    """A copy in which every positioned gene's Poincaré point keeps its norm and gets a uniformly random direction."""
    out = adata.copy()
    rows = _positioned(out)
    e = np.asarray(out.varm["cape_poincare"], dtype=np.float64).copy()
    rng = np.random.default_rng(seed)
    u = rng.standard_normal((rows.size, e.shape[1]))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    e[rows] = np.linalg.norm(e[rows], axis=1, keepdims=True) * u
    out.varm["cape_poincare"] = e
    _rerun_step_iii(out)
    out.uns.setdefault("cape", {})["control"] = {"name": "random_directions", "seed": int(seed)}
    return out


def permute_genes(adata: ad.AnnData, seed: int) -> ad.AnnData:
    """A copy in which the positioned genes' labels are permuted: gene ``rows[i]`` takes everything Steps I–III
    gave gene ``rows[π(i)]`` (varm rows, ``varp["cape_dag"]`` rows and columns, ``var["cape_*"]`` columns)."""
    out = adata.copy()
    rows = _positioned(out)
    perm = np.random.default_rng(seed).permutation(rows.size)
    source = np.arange(out.n_vars)
    source[rows] = rows[perm]  # gene g takes gene source[g]'s identity
    for key in list(out.varm):
        if key.startswith("cape_"):
            out.varm[key] = np.asarray(out.varm[key])[source]
    for key in [k for k in out.var.columns if k.startswith("cape_") and k != "cape_used"]:
        out.var[key] = out.var[key].to_numpy()[source]
    if "cape_dag" in out.varp:
        dag = sp.csr_matrix(out.varp["cape_dag"])
        out.varp["cape_dag"] = dag[source][:, source]  # A'[g, h] = A[source[g], source[h]]
    out.uns.setdefault("cape", {})["control"] = {"name": "permuted", "seed": int(seed)}
    return out


def apply_control(adata: ad.AnnData, control: str | None, seed: int) -> ad.AnnData:
    """``adata`` itself (no control) or the copy the named control makes (:data:`CONTROLS`)."""
    if control is None:
        return adata
    if control == "random_directions":
        return random_directions(adata, seed)
    if control == "permuted":
        return permute_genes(adata, seed)
    raise CapeInputError(f"unknown control {control!r}; choose from {', '.join(CONTROLS)}")
