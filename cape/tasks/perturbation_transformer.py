"""The transformer predictor of the perturbation workflow: a :class:`~cape.models.CellTransformer` with CAPE
positions pretrained on control cells only, its contextual gene embeddings fed to
:class:`~cape.tasks.perturbation_predictors.EmbeddingPerturbationPredictor`.

The CAPE positions come from a gene DAG the caller learnt without the held-out perturbations (in the workflow,
Step I fitted on the control cells and the training perturbations), embedded in hyperbolic space (Step II) here;
Step III's rotary angles (``varm["cape_angles"]``) follow with the default scale c = π/4.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp
import torch

from .._errors import CapeInputError
from ..encodings.cape import DEFAULT_BAND_TOP, DEFAULT_SCALE, cape_angles
from ..hyperbolic import embed_dag
from ..models import CellTransformer
from .perturbation import CONTROL
from .perturbation_predictors import EmbeddingPerturbationPredictor, NoChangePredictor

__all__ = ["TransformerPerturbationPredictor"]

logger = logging.getLogger("cape")


class TransformerPerturbationPredictor(NoChangePredictor):
    """Predict perturbations from the gene embeddings of a transformer pretrained on control cells.

    Parameters
    ----------
    dag
        n_genes × n_genes adjacency over the data's genes (``A[i, j] ≠ 0``: i → j) whose hyperbolic embedding gives
        the CAPE positions; it must not have been learnt from held-out perturbations. ``None``: no positions
        (``encoding`` must then be one that needs none, e.g. ``"none"``).
    encoding
        The model's positional encoding (``"cape"`` by default; see ``cape encodings``).
    pretrain_epochs, d_model, n_layers, n_heads, batch_size
        The transformer's pretraining on the control cells (masked values): small by default, since it is the
        costliest predictor of the workflow.
    embed_dim, embed_epochs
        Step II's dimension and epochs for the positions (``embed_dim`` ≤ ``d_model / 2``).
    predictor_epochs
        Epochs of the embedding predictor fitted on the training perturbations.
    seed, device
        Seed of everything random here; ``"cpu"``, ``"cuda"`` or ``"auto"``.

    Only control cells reach the transformer; the embedding predictor reads the training perturbations' means.
    """

    name = "transformer"

    def __init__(self, dag=None, *, encoding: str = "cape", pretrain_epochs: int = 5, d_model: int = 32,
                 n_layers: int = 1, n_heads: int = 2, batch_size: int = 64, embed_dim: int = 8,
                 embed_epochs: int = 200, predictor_epochs: int = 400, seed: int = 0, device: str = "cpu") -> None:
        if encoding == "cape" and dag is None:
            raise CapeInputError("encoding='cape' needs a gene DAG (dag=) for its positions")
        if 2 * embed_dim > d_model:
            raise CapeInputError(f"embed_dim ({embed_dim}) needs d_model ≥ {2 * embed_dim} (one rotary plane per "
                                 f"coordinate), got {d_model}")
        self.dag, self.encoding = dag, encoding
        self.pretrain_epochs, self.d_model, self.n_layers, self.n_heads = pretrain_epochs, d_model, n_layers, n_heads
        self.batch_size, self.embed_dim, self.embed_epochs = batch_size, embed_dim, embed_epochs
        self.predictor_epochs, self.seed, self.device = predictor_epochs, seed, device

    def fit(self, adata: ad.AnnData, train: Sequence[str], *, condition_key: str = "condition",
            control: str = CONTROL) -> TransformerPerturbationPredictor:
        super().fit(adata, train, condition_key=condition_key, control=control)
        cells = adata[(adata.obs[condition_key].astype(str) == control).to_numpy()].copy()
        cells.var["cape_used"] = True  # the vocabulary: every gene of the data
        if self.dag is not None:
            dag = np.asarray(self.dag.toarray() if hasattr(self.dag, "toarray") else self.dag, dtype=np.float64)
            if dag.shape != (adata.n_vars, adata.n_vars):
                raise CapeInputError(f"dag has shape {dag.shape}, expected {adata.n_vars} × {adata.n_vars} genes")
            result = embed_dag(dag, dim=self.embed_dim, epochs=self.embed_epochs, device=self.device,
                               seed=self.seed, names=list(cells.var_names), show_progress=False)
            # Step III's map, recorded as cape.tl.rotary_encoding records it, so the model applies exactly this one
            cells.varm["cape_poincare"] = result.poincare
            cells.varm["cape_angles"] = cape_angles(torch.from_numpy(result.poincare), DEFAULT_SCALE).numpy()
            cells.uns["cape"] = {"rotary_encoding": {"params": {"scale": DEFAULT_SCALE, "bands": 1,
                                                                "band_top": DEFAULT_BAND_TOP}}}
            cells.varp["cape_dag"] = sp.csr_matrix(dag)
        model = CellTransformer(cells, "scgpt", self.encoding, d_model=self.d_model, n_layers=self.n_layers,
                                n_heads=self.n_heads, seed=self.seed, device=self.device)
        if self.pretrain_epochs > 0:
            self.history_ = model.pretrain(cells, epochs=self.pretrain_epochs, batch_size=self.batch_size,
                                           validation_fraction=0.1)
        model.embed(cells, key_added="_cells", gene_key="_genes")
        genes = pd.DataFrame(cells.varm["_genes"], index=cells.var_names).reindex(self.genes_).fillna(0.0)
        self.gene_embeddings_ = genes.to_numpy()
        self.predictor_ = EmbeddingPerturbationPredictor(self.gene_embeddings_, epochs=self.predictor_epochs,
                                                         seed=self.seed)
        self.predictor_.fit(adata, train, condition_key=condition_key, control=control)
        logger.info("transformer predictor: %s encoding, %d control cells, %d pretraining epoch(s)", self.encoding,
                    cells.n_obs, self.pretrain_epochs)
        return self

    def predict(self, conditions: Sequence[str]) -> pd.DataFrame:
        return self.predictor_.predict(conditions)
