"""Child process that simulates counts with SERGIO: ``PYTHON _sergio_child.py IN.npz OUT.npz``.

SERGIO (Dibaeinia & Sinha 2020; ``sergio-scsim`` on PyPI) is GPL-3 licensed, so cape never imports it: it runs in
the interpreter of an environment of its own (``make sergio-env``) and this file imports only NumPy and SERGIO.
Input: ``sources``, ``targets`` and ``signs`` of the DAG's edges (gene indices; +1 activation, −1 repression),
``n_genes``, ``n_types``, ``cells_per_type`` and ``seed``, and optionally ``k_range`` (the range of |K|, default
[1, 5]) and ``noise`` (SERGIO's technical-noise parameters: outlier probability, mean and scale, library-size mean
and scale, dropout shape and percentile; default the values below). Each edge gets a Hill interaction (n = 2, |K|
uniform in ``k_range``, the sign of the edge), each master regulator a random low or high production rate per cell
type, and the steady-state cells get SERGIO's technical noise (outliers, library size, dropout, Poisson counts).
Output: ``counts`` (cells × genes, in input order), ``cell_type`` and ``genes`` (the indices SERGIO simulated: genes
without any edge are absent from its network).

Knock-outs (optional input ``knockouts``: one row of gene indices per knock-out, padded with −1, and
``knockout_cells_per_type``). SERGIO 1.9.3 has no perturbation API (its source lists knock-outs among "things to
implement"), so they are made here without changing SERGIO's model: once SERGIO has set up the wild-type network
(production rates of the master regulators per cell type, each interaction's K and half-response from the
wild-type steady state), every knock-out adds a copy of the cell types to the same simulation, in which the
knocked-out genes' production is multiplied by 0 (:func:`_gene_class`; their outgoing interactions keep their
wild-type K and half-response) and they start at 0, so they stay at exactly 0: do(x = 0). SERGIO's steady-state
estimates, its starting point, are recomputed for the knocked-out copies. Every copy runs as many steps as the
control cells; a knock-out's cells are ``knockout_cells_per_type`` random steps of each of its types' trajectories,
drawn as SERGIO draws the control cells. The technical noise is added once, to the control and knock-out cells
together. Extra output ``condition``: −1 for a control cell, else the knock-out's row. Without knock-outs the
output is SERGIO's own simulation, draw for draw.
"""

from __future__ import annotations

import sys

import numpy as np

SAFETY_ITER = 150
SCALE_ITER = 10
#: The technical noise of SERGIO's README / demo notebook (outlier genes, library size, dropout); callers pass others.
DEFAULT_NOISE = (0.01, 0.8, 1.0, 4.6, 0.4, 6.5, 82.0)


def _gene_class():
    """SERGIO's gene with a production factor per cell type (``keep_``: 0 where it is knocked out) and its
    trajectory kept as one row per step (SERGIO's ``np.append`` per step and cell type is quadratic in the
    steps); the numbers are SERGIO's own."""
    from SERGIO.GRN import Gene

    class KnockableGene(Gene):
        keep_ = None
        rows_ = None

        def _calc_prod(self, cTypes, regs_conc="ss"):
            prod = super()._calc_prod(cTypes, regs_conc=regs_conc)
            return prod if self.keep_ is None else prod * self.keep_[cTypes]

        def append_sim_conc(self, conc, cTypes):
            if len(cTypes) != len(self.keep_):
                raise ValueError("every cell type is simulated for the same number of steps")
            self.rows_ = [] if self.rows_ is None else self.rows_
            self.rows_.append(np.maximum(0.0, np.asarray(conc, dtype=np.float64).ravel()))  # SERGIO: max(0, conc)

        def get_last_conc(self, cTypes):
            return self.rows_[-1][cTypes]

    return KnockableGene


def _network(sources, targets, signs, n_types: int, seed: int, k_range=(1.0, 5.0)):
    """SERGIO's wild-type network, set up (levels, production rates, half-responses, steady-state estimates)."""
    from SERGIO.GRN import GRN, SingleInteraction
    from SERGIO.MR import mrProfile

    np.random.seed(seed)  # noqa: NPY002 (SERGIO draws from NumPy's global generator)
    strengths = np.random.default_rng(seed).uniform(float(k_range[0]), float(k_range[1]), size=len(sources))
    gene = _gene_class()
    grn = GRN()
    for s, t, sign, strength in zip(sources, targets, signs, strengths, strict=True):
        k = float(sign) * float(strength)
        grn.add_interaction(SingleInteraction(reg=[gene(name=str(s), decay=0.8)], tar=gene(name=str(t), decay=0.8),
                                              k=k, h=None, n=2))
    grn.setMRs()
    profile = mrProfile(MR_names=grn.get_mrs(), n_types=n_types)
    profile.build_rnd(range_dict={"L": [1, 2.5], "H": [3.5, 5]})
    grn.init(profile, update_half_resp=True)
    return grn


def _add_knockouts(grn, knockouts, n_types: int) -> None:
    """One copy of the ``n_types`` cell types per knock-out (module docstring), in the order of ``knockouts``."""
    n_copies = 1 + len(knockouts)
    genes = grn.attr_["genes"]
    for gene in genes.values():
        gene.keep_ = np.ones(n_types * n_copies)
        if gene.isMR_:
            gene.prod_rates_ = np.tile(gene.prod_rates_, n_copies)
    for k, knocked in enumerate(knockouts, start=1):
        for g in knocked:
            if g >= 0:
                genes[str(int(g))].keep_[k * n_types:(k + 1) * n_types] = 0.0
    grn.nCellTypes_ = n_types * n_copies
    if len(knockouts):
        grn._estimate_params(half_resp=False)  # steady-state estimates with the knock-outs; wild-type K and h


def _technical_noise(expr, noise=DEFAULT_NOISE):
    """SERGIO's ``scNoise()._add_noise(expr, *noise, to_count=True)`` step by step and draw for draw (a step whose
    parameters include a 0 is skipped, as there), except that a cell with no expression at all (possible once
    knock-outs silence most of a small network) stays empty instead of turning NaN in SERGIO's library-size step
    (0 / 0)."""
    from SERGIO.Noise import scNoise

    prob_o, mean_o, scale_o, mean_l, scale_l, shape_d, perc_d = (float(v) for v in noise)
    sim, ret = scNoise(), expr.copy()
    if prob_o and mean_o and scale_o:
        ret = sim._add_outlier(ret, prob_o, mean_o, scale_o)
    if mean_l and scale_l:
        with np.errstate(divide="ignore", invalid="ignore"):
            ret = np.nan_to_num(sim._add_library_size(ret, mean_l, scale_l), nan=0.0, posinf=0.0)
    if shape_d and perc_d:
        ret = sim._add_dropout(ret, shape_d, perc_d)
    return sim._to_count(ret)


def simulate(sources, targets, signs, n_types: int, cells_per_type: int, seed: int, k_range=(1.0, 5.0),
             noise=DEFAULT_NOISE, knockouts=(), knockout_cells_per_type: int = 10):
    from SERGIO import sergio

    grn = _network(sources, targets, signs, n_types, seed, k_range)
    _add_knockouts(grn, knockouts, n_types)
    sim = sergio(grn)
    sim.simulate(nCells=cells_per_type, noise_s=1, safety_iter=SAFETY_ITER, scale_iter=SCALE_ITER)
    names = sim.gNames_
    trajectories = np.stack([np.vstack(grn.attr_["genes"][g].rows_) for g in names])  # genes × steps × types
    blocks, condition, cell_type = [], [], []
    for ct in range(grn.nCellTypes_):  # the cells: random steps after the burn-in, as SERGIO's getSimExpr draws
        n = cells_per_type if ct < n_types else knockout_cells_per_type
        steps = SAFETY_ITER + np.random.randint(low=0, high=cells_per_type * SCALE_ITER, size=n)  # noqa: NPY002
        blocks.append(trajectories[:, steps, ct])
        condition.append(np.full(n, ct // n_types - 1))
        cell_type.append(np.full(n, ct % n_types))
    counts = _technical_noise(np.hstack(blocks), noise)
    genes = np.array([int(g) for g in names])
    order = np.argsort(genes)
    return counts[order].T, np.concatenate(cell_type), genes[order], np.concatenate(condition)


def main(argv: list[str]) -> int:
    src, dst = argv
    data = np.load(src)
    options = {key: data[key] for key in ("k_range", "noise", "knockouts") if key in data.files}
    if "knockout_cells_per_type" in data.files:
        options["knockout_cells_per_type"] = int(data["knockout_cells_per_type"])
    counts, cell_type, genes, condition = simulate(
        data["sources"], data["targets"], data["signs"], int(data["n_types"]), int(data["cells_per_type"]),
        int(data["seed"]), **options)
    np.savez(dst, counts=counts, cell_type=cell_type, genes=genes, condition=condition)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
