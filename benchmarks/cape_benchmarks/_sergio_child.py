"""Child process that simulates counts with SERGIO: ``PYTHON _sergio_child.py IN.npz OUT.npz``.

SERGIO (Dibaeinia & Sinha 2020; ``sergio-scsim`` on PyPI) is GPL-3 licensed, so cape never imports it: it runs in
the interpreter of an environment of its own (``make sergio-env``) and this file imports only NumPy and SERGIO.
Input: ``sources``, ``targets`` and ``signs`` of the DAG's edges (gene indices; +1 activation, −1 repression),
``n_genes``, ``n_types``, ``cells_per_type`` and ``seed``, and optionally ``k_range`` (the range of |K|, default
[1, 5]) and ``noise`` (SERGIO's technical-noise parameters: outlier probability, mean and scale, library-size mean
and scale, dropout shape and percentile; default the values below). Each edge gets a Hill interaction (n = 2, |K|
uniform in ``k_range``, the sign of the edge), each master regulator a random low or high production rate per cell
type, and the steady-state cells get SERGIO's technical noise (outliers, library size, dropout, Poisson counts).
Output: ``counts`` (cells × genes, in input order), ``cell_type`` and ``genes``
(the indices SERGIO simulated: genes without any edge are absent from its network).
"""

from __future__ import annotations

import sys

#: The technical noise of SERGIO's README / demo notebook (outlier genes, library size, dropout); callers pass others.
DEFAULT_NOISE = (0.01, 0.8, 1.0, 4.6, 0.4, 6.5, 82.0)


def simulate(sources, targets, signs, n_types: int, cells_per_type: int, seed: int, k_range=(1.0, 5.0),
             noise=DEFAULT_NOISE):
    import numpy as np
    from SERGIO import sergio
    from SERGIO.GRN import GRN, Gene, SingleInteraction
    from SERGIO.MR import mrProfile
    from SERGIO.Noise import scNoise

    np.random.seed(seed)  # noqa: NPY002 (SERGIO draws from NumPy's global generator)
    strengths = np.random.default_rng(seed).uniform(float(k_range[0]), float(k_range[1]), size=len(sources))
    grn = GRN()
    for s, t, sign, strength in zip(sources, targets, signs, strengths, strict=True):
        k = float(sign) * float(strength)
        grn.add_interaction(SingleInteraction(reg=[Gene(name=str(s), decay=0.8)], tar=Gene(name=str(t), decay=0.8),
                                              k=k, h=None, n=2))
    grn.setMRs()
    profile = mrProfile(MR_names=grn.get_mrs(), n_types=n_types)
    profile.build_rnd(range_dict={"L": [1, 2.5], "H": [3.5, 5]})
    grn.init(profile, update_half_resp=True)
    sim = sergio(grn)
    sim.simulate(nCells=cells_per_type, noise_s=1, safety_iter=150, scale_iter=10)
    expr = sim.getSimExpr()  # genes × cells
    prob_o, mean_o, scale_o, mean_l, scale_l, shape_d, perc_d = (float(v) for v in noise)
    counts = scNoise()._add_noise(expr.to_numpy(), prob_o=prob_o, mean_o=mean_o, scale_o=scale_o, mean_l=mean_l,
                                  scale_l=scale_l, shape_d=shape_d, perc_d=perc_d, to_count=True)
    genes = np.array([int(g) for g in expr.index])
    order = np.argsort(genes)
    cell_type = np.repeat(np.arange(n_types), cells_per_type)
    return counts[order].T, cell_type, genes[order]


def main(argv: list[str]) -> int:
    import numpy as np

    src, dst = argv
    data = np.load(src)
    options = {key: data[key] for key in ("k_range", "noise") if key in data.files}
    counts, cell_type, genes = simulate(data["sources"], data["targets"], data["signs"], int(data["n_types"]),
                                        int(data["cells_per_type"]), int(data["seed"]), **options)
    np.savez(dst, counts=counts, cell_type=cell_type, genes=genes)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
