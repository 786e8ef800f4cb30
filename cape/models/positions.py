"""Per-gene positions (:class:`cape.encodings.GenePositions`) from the AnnData keys written by Steps I–III.

Which key an encoding reads is its ``requires`` attribute (see :data:`cape.encodings.base.POSITION_SOURCES`):

=================  ====================================================================================
``cape_angles``    ``varm["cape_angles"]`` rotary angles φ = c·e (Step III), ``vectors_are_angles=True``
``cape_poincare``  ``varm["cape_poincare"]`` Poincaré coordinates e (Step II)
``cape_dag``       ``varp["cape_dag"]`` (Step I): topological order, PageRank ``var["cape_generality"]`` tie-break
``co_expression``  gene vectors from the expression matrix itself (scBERT's gene2vec role)
``values``         nothing: the encoding ranks genes by expression in each cell
=================  ====================================================================================

Rows are vocabulary indices; special tokens and genes without a position (outside ``var["cape_used"]``, or
with non-finite coordinates) get ``has_position = False``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.csgraph import shortest_path

from .. import encodings
from .._errors import CapeInputError
from ..encodings import (
    GenePositions,
    ordering,  # the encodings helper owns the ordering rule
    static_absolute,
)
from ..encodings import cape as cape_map
from ..encodings.base import POSITION_SOURCES
from .tokenize import GeneVocab

_VARM_KEYS = ("cape_angles", "cape_poincare")
#: Most vocabulary tokens for a dense (V, V) graph-distance table (``grape_a`` with ``distance="graph"``):
#: 8,192² float32 is 256 MiB. A model over every gene of a raw matrix (vocabulary="all") would need gigabytes.
GRAPH_DISTANCE_MAX_TOKENS = 8192

logger = logging.getLogger("cape")


def _missing(encoding: str, key: str) -> CapeInputError:
    return CapeInputError(f"encoding '{encoding}' needs gene positions: {POSITION_SOURCES[key]}")


def _rows(vocab: GeneVocab, var_names) -> tuple[np.ndarray, np.ndarray]:
    """(vocabulary index, AnnData column) pairs of the genes present in both."""
    idx = vocab.lookup(list(var_names))
    cols = np.flatnonzero(idx >= 0)
    return idx[cols], cols


def _used_mask(adata) -> np.ndarray:
    if "cape_used" in adata.var:
        return np.asarray(adata.var["cape_used"], dtype=bool)
    return np.ones(adata.n_vars, dtype=bool)


def _vocab_table(vocab: GeneVocab, var_names, values: np.ndarray, has: np.ndarray) -> np.ndarray:
    """Lay per-gene ``values`` (rows = AnnData genes) out by vocabulary index; NaN where there is no position."""
    table = np.full((len(vocab), *values.shape[1:]), np.nan)
    rows, cols = _rows(vocab, var_names)
    keep = has[cols]
    table[rows[keep]] = values[cols[keep]]
    return table


def angle_record(adata, key: str = "cape_angles") -> dict | None:
    """The Step III map that wrote ``varm[key]``: ``{"scale", "bands", "band_top"}`` from
    ``uns["cape"][key]`` (:func:`cape.tl.rotary_encoding` records angles under another than the default key there)
    or ``uns["cape"]["rotary_encoding"]`` ``["params"]`` (records older than bands: 1 band), or None without a
    record for this key or when the recorded width does not match the table's."""
    cape_uns = adata.uns.get("cape") if isinstance(adata.uns.get("cape"), Mapping) else {}
    params = None
    for entry in (cape_uns.get(key), cape_uns.get("rotary_encoding")):
        candidate = entry.get("params") if isinstance(entry, Mapping) else None
        if isinstance(candidate, Mapping) and "scale" in candidate and candidate.get("key_added", key) == key:
            params = candidate
            break
    if params is None:
        return None
    record = {"scale": float(params["scale"]), "bands": int(params.get("bands", 1)),
              "band_top": float(params.get("band_top", cape_map.DEFAULT_BAND_TOP))}
    if key in adata.varm and np.shape(adata.varm[key])[1] % record["bands"]:
        return None
    return record


def vectors_from_varm(adata, vocab: GeneVocab, key: str, encoding: str = "?") -> GenePositions:
    """``varm[key]`` laid out by vocabulary index (NaN rows: no position, incl. genes outside ``cape_used``);
    angles carry their Step III record (:func:`angle_record`)."""
    if key not in adata.varm:
        raise _missing(encoding, key)
    vec = np.asarray(adata.varm[key], dtype=np.float64)
    table = _vocab_table(vocab, adata.var_names, vec, _used_mask(adata))
    angles = key == "cape_angles"
    return GenePositions(vectors=torch.as_tensor(table, dtype=torch.float32), vectors_are_angles=angles,
                         angle_params=angle_record(adata, key) if angles else None, source=f"varm['{key}']")


def _dag(adata, encoding: str):
    if "cape_dag" not in adata.varp:
        raise _missing(encoding, "cape_dag")
    return adata.varp["cape_dag"]


def order_from_dag(adata, vocab: GeneVocab, encoding: str = "?") -> np.ndarray:
    """(V,) topological rank of each gene in ``varp["cape_dag"]`` (ties: ``var["cape_generality"]``), NaN = none."""

    dag = _dag(adata, encoding)
    generality = (np.asarray(adata.var["cape_generality"], dtype=np.float64)
                  if "cape_generality" in adata.var else None)
    used = _used_mask(adata)
    order = np.asarray(ordering.topological_positions(dag, generality, used=used), dtype=np.float64)
    return _vocab_table(vocab, adata.var_names, order, used)


def graph_distance_from_dag(adata, vocab: GeneVocab, encoding: str = "?") -> np.ndarray:
    """(V, V) hop distance on the undirected skeleton of ``varp["cape_dag"]``; unreachable pairs get
    (longest finite distance + 1); rows of tokens without a gene are 0.

    Shortest paths are computed on the vocabulary genes that have edges only (never an n_vars × n_vars array);
    the other genes are unreachable from every gene. The table is dense, so the vocabulary may hold at most
    :data:`GRAPH_DISTANCE_MAX_TOKENS` tokens (a one-line error otherwise).
    """

    if len(vocab) > GRAPH_DISTANCE_MAX_TOKENS:
        raise CapeInputError(f"encoding '{encoding}' with a graph distance needs a (V, V) table, and the vocabulary "
                             f"has {len(vocab)} tokens (at most {GRAPH_DISTANCE_MAX_TOKENS}); use vocabulary='used'")
    dag = sp.csr_matrix(_dag(adata, encoding))
    rows, cols = _rows(vocab, adata.var_names)
    skeleton = (dag != 0).astype(np.int8)
    degree = np.asarray(skeleton.sum(0)).ravel() + np.asarray(skeleton.sum(1)).ravel()
    linked = np.flatnonzero(degree[cols] > 0)  # positions in rows/cols of the genes with an edge
    sub = skeleton[cols[linked]][:, cols[linked]]
    dist = shortest_path(sub, directed=False, unweighted=True) if linked.size else np.zeros((0, 0))
    finite = np.isfinite(dist)
    # Edges to genes outside the vocabulary are dropped with them; pairs through such genes become unreachable.
    far = (dist[finite].max() if finite.any() else 0.0) + 1.0
    dist[~finite] = far
    table = np.zeros((len(vocab), len(vocab)))
    table[np.ix_(rows, rows)] = far
    table[rows, rows] = 0.0
    table[np.ix_(rows[linked], rows[linked])] = dist
    return table


def gene_positions(adata, vocab: GeneVocab, encoding: str, *, encoding_options: dict | None = None,
                   expression=None, max_dim: int | None = None) -> GenePositions | None:
    """Positions for ``encoding`` read from ``adata`` (None when it needs none).

    Every position field the AnnData can provide is filled: ``vectors`` from the varm key the encoding
    requires (else ``varm["cape_poincare"]`` when present; also when angles without a Step III record meet
    ``scale``/``bands``/``band_top`` options, which then act on e), ``order`` from ``varp["cape_dag"]`` when
    present, and
    ``graph_distance`` when ``encoding_options["distance"] == "graph"``. The encoding itself then raises a
    one-line :class:`~cape.CapeInputError` naming the missing key and the step that writes it.

    Parameters
    ----------
    adata
        AnnData with the keys of Steps I–III (see module docstring).
    vocab
        The model's gene vocabulary (rows of the result).
    encoding
        Registry name (its class attribute ``requires`` picks the vectors key).
    encoding_options
        The encoding's options (``order="expression"`` needs no positions; ``distance="graph"`` a distance table).
    expression
        ``(n_cells, n_genes)`` matrix aligned with ``adata.var_names``, for ``co_expression`` positions.
    max_dim
        Width limit of co-expression vectors (d_model).
    """
    options = encoding_options or {}
    requires = encodings.get_class(encoding).requires
    if requires is None or requires == "values" or options.get("order") == "expression":
        return None
    if requires == "co_expression":
        if options.get("gene2vec_path") is not None:
            return None  # the encoding reads the gene2vec file itself
        return co_expression_positions(adata, vocab, expression, encoding, max_dim=max_dim)
    fields: dict = {}
    vectors_key = requires if requires in _VARM_KEYS else "cape_poincare"
    remap = any(options.get(k) is not None for k in cape_map.MAP_DEFAULTS)
    if (vectors_key == "cape_angles" and remap and vectors_key in adata.varm and angle_record(adata) is None
            and "cape_poincare" in adata.varm):
        vectors_key = "cape_poincare"  # angles of unknown scale: the map the options ask for acts on e itself
    if vectors_key in adata.varm:
        pos = vectors_from_varm(adata, vocab, vectors_key, encoding)
        fields.update(vectors=pos.vectors, vectors_are_angles=pos.vectors_are_angles, angle_params=pos.angle_params)
    if "cape_dag" in adata.varp:
        fields["order"] = torch.as_tensor(order_from_dag(adata, vocab, encoding), dtype=torch.float32)
        if options.get("distance") == "graph":
            fields["graph_distance"] = torch.as_tensor(graph_distance_from_dag(adata, vocab, encoding),
                                                       dtype=torch.float32)
    if not fields:
        return None
    if "vectors" in fields and "order" in fields:
        # A gene has a position when the field its encoding reads is finite; keep the union and let the
        # encoding's own tables decide (non-finite entries are zeroed there).
        has = torch.isfinite(fields["vectors"]).all(1) | torch.isfinite(fields["order"])
        fields["has_position"] = has
    return GenePositions(source=", ".join(sorted(fields)), **fields)


def co_expression_positions(adata, vocab: GeneVocab, expression, encoding: str = "?", *,
                            max_dim: int | None = None) -> GenePositions:
    """Gene vectors learnt from co-expression (``static_absolute`` without a gene2vec file), over the vocabulary's
    genes only (``expression`` is aligned with ``adata.var_names``): the vocabulary-level table of
    :func:`cape.encodings.static_absolute.co_expression_positions`, with NaN (no position) for the other rows."""
    if expression is None:
        raise _missing(encoding, "co_expression")
    rows, cols = _rows(vocab, adata.var_names)
    if cols.size < adata.n_vars:
        expression = expression[:, cols]
    dim = min(64, cols.size - 1, max_dim or 64)
    placed = static_absolute.co_expression_positions(expression, rows, len(vocab), dim)
    table = placed.vectors.double()
    table[~placed.has_position] = np.nan
    return GenePositions(vectors=table.float(), source="co-expression")


def random_positions(vocab: GeneVocab, dim: int = 8, *, seed: int = 0) -> GenePositions:
    """Random vectors (norm < 1) and a random order for every gene, for tests and demos without Steps I–III."""
    rng = np.random.default_rng(seed)
    n = len(vocab)
    direction = rng.normal(size=(n, dim))
    vec = direction / np.linalg.norm(direction, axis=1, keepdims=True) * rng.uniform(0.1, 0.9, size=(n, 1))
    order = rng.permutation(n).astype(np.float64)
    specials = [vocab.pad_id, vocab.cls_id]
    vec[specials] = np.nan
    order[specials] = np.nan
    dist = np.abs(order[:, None] - order[None, :])
    dist[~np.isfinite(dist)] = 0.0
    return GenePositions(vectors=torch.as_tensor(vec, dtype=torch.float32),
                         order=torch.as_tensor(order, dtype=torch.float32),
                         graph_distance=torch.as_tensor(dist, dtype=torch.float32), source="random")
