"""``cape predict``: knock-out / over-expression predictions from Step I's structural equations."""

from __future__ import annotations

import argparse
import logging

import matplotlib
import numpy as np
import pandas as pd

from .. import pl
from .._errors import CapeInputError
from .._io import atomic_path, save_figure, write_h5ad
from .._settings import resolve_seed
from ..tl._predict_intervention import EQUATIONS, load_equations, predict_intervention
from ._command_io import check_output, positive_int, read_input

logger = logging.getLogger("cape")


def parse_interventions(items: list[str]) -> dict[str, str]:
    """``["GENE=0", "GENE2=2x"]`` → ``{"GENE": "0", "GENE2": "2x"}`` (one-line error on a malformed item)."""
    out: dict[str, str] = {}
    for item in items:
        gene, sep, value = item.rpartition("=")
        if not sep or not gene.strip() or not value.strip():
            raise CapeInputError(f"--intervene {item!r}: expected GENE=VALUE (a number, ko, or a multiple such as 2x)")
        if gene.strip() in out:
            raise CapeInputError(f"--intervene names {gene.strip()} twice")
        out[gene.strip()] = value.strip()
    return out


def reached_shifts(adata, key: str) -> pd.DataFrame:
    """The predicted mean shift of the genes the intervention reaches (``role`` ``intervened`` or ``descendant``),
    largest first; the genes it does not reach are left out, with a log line saying how many.

    A gene that is not downstream of an intervened gene keeps its value (counterfactual) or its draw
    (interventional) by construction, so its 0 says nothing about the gene: listing it buries the answer.
    """
    record = adata.uns[key]
    intervened = [str(g) for g in record["intervention"]]
    descendants = [str(g) for g in np.atleast_1d(record.get("descendants", [])) if str(g) not in intervened]
    genes = intervened + descendants
    shift = adata.var[f"{key}_shift"]
    table = pd.DataFrame({"gene": genes, "role": ["intervened"] * len(intervened) + ["descendant"] * len(descendants),
                          "shift": shift.loc[genes].to_numpy(float)})
    table = table.reindex(table["shift"].abs().sort_values(ascending=False, kind="stable").index)
    left_out = adata.n_vars - len(genes)
    if left_out:
        logger.info("--table: %d gene(s) reached by the intervention listed; %d left out (not downstream of %s "
                    "in the graph: unchanged)", len(genes), left_out, ", ".join(intervened))
    return table


def register(commands) -> None:
    parser = commands.add_parser("predict", help="predict knock-outs / over-expression with Step I's equations")
    parser.add_argument("--input", "-i", required=True, help="input .h5ad with Step I's graph (from `cape causal`)")
    parser.add_argument("--intervene", nargs="+", required=True, metavar="GENE=VALUE",
                        help="do(GENE = VALUE): a number in the units Step I was fitted on, ko (= 0), or a multiple "
                             "of the gene's observed mean such as 2x")
    parser.add_argument("--output", "--out", "-o", dest="output", required=True,
                        help="output .h5ad: the input with layers[KEY] (counterfactual over all cells), or the "
                             "predicted cells (interventional / --n-cells)")
    parser.add_argument("--mode", choices=["counterfactual", "interventional"], default="counterfactual",
                        help="counterfactual (default): each observed cell keeps its noise; interventional: new "
                             "cells from sampled noise")
    parser.add_argument("--equations", choices=EQUATIONS, default="learned",
                        help="learned (Step I's encoder/SEM/decoder), linear (least-squares refit on the graph) or "
                             "equivalence_class (least-squares effects averaged over the parent sets the graph's "
                             "Markov equivalence class allows, IDA; one gene)")
    parser.add_argument("--graph", default=None,
                        help="varp key of the graph for --equations linear / equivalence_class (cape_dag)")
    parser.add_argument("--n-cells", type=positive_int, default=None, help="cells to predict (default: all)")
    parser.add_argument("--key-added", default="cape_intervention", help="layer/var/uns key (cape_intervention)")
    parser.add_argument("--table", default=None,
                        help="also write the predicted mean shift of each gene the intervention reaches: the "
                             "intervened genes and their descendants in the graph (.tsv); the others keep their values")
    parser.add_argument("--plot", default=None, help="also plot the top predicted shifts (.png)")
    parser.add_argument("--top", type=positive_int, default=20, help="genes in the plot (20)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    intervention = parse_interventions(args.intervene)
    out = check_output(args.output, args.input)
    outputs = [str(out)]
    if args.table is not None:
        outputs.append(str(check_output(args.table, args.input, *outputs, suffix=".tsv", option="--table")))
    if args.plot is not None:
        check_output(args.plot, args.input, *outputs, suffix=".png", option="--plot")
    adata = read_input(args.input, expect_counts=False)
    load_equations(adata, args.graph)  # names the missing step before anything else
    cells = predict_intervention(adata, intervention, n_cells=args.n_cells, mode=args.mode, equations=args.equations,
                                 seed=resolve_seed(None), key_added=args.key_added,
                                 graph=args.graph)
    result = cells if cells is not None else adata
    shifts = reached_shifts(adata, args.key_added)
    fig = None
    if args.plot is not None:  # everything is computed before the first file is written: no partial outputs
        matplotlib.use("agg")
        fig = pl.intervention(adata, key=args.key_added, n_genes=args.top, return_fig=True)
    write_h5ad(result, out)
    if args.table is not None:
        with atomic_path(args.table) as tmp:
            shifts.to_csv(tmp, sep="\t", index=False)
    if fig is not None:
        save_figure(fig, args.plot)
    logger.info("wrote %s", ", ".join(p for p in (str(out), args.table, args.plot) if p))
    return 0
