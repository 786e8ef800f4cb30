"""cape-bench intervention (Sachs-shaped data), the SCM rows of the perturbation baselines, and the workflow option."""

from __future__ import annotations

import json

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from _workflow import snakemake

from cape.data.loaders import SACHS_CONDITIONS, SACHS_OBSERVATIONAL
from cape.tasks.perturbation_scm import SCMPerturbationPredictor
from cape_benchmarks.baselines import run_perturbation_benchmark
from cape_benchmarks.cli import main
from cape_benchmarks.intervention import run_intervention_benchmark, shift_metrics

GENES = ["praf", "pmek", "plcg", "PIP2", "PIP3", "p44/42", "pakts473", "PKA", "PKC", "P38", "pjnk"]
EDGES = [("PIP2", "PKC"), ("plcg", "PIP2"), ("PIP3", "plcg"), ("PIP2", "PIP3"), ("plcg", "PKC"), ("PKC", "pjnk"),
         ("PKC", "P38"), ("PKA", "P38"), ("PKC", "praf"), ("PKA", "praf"), ("praf", "pmek"), ("pmek", "p44/42"),
         ("PKC", "pmek"), ("PKA", "pakts473"), ("PIP3", "pakts473"), ("PKA", "pmek"), ("PKA", "p44/42"),
         ("PKA", "pjnk")]


def _fake_sachs(n=40) -> ad.AnnData:
    """Shaped like cape.data.load('sachs2005'): 9 conditions, 11 proteins, the consensus graph."""
    rng = np.random.default_rng(0)
    conds = np.repeat([c for c, _, _ in SACHS_CONDITIONS], n)
    targets = np.repeat([t or "none" for _, _, t in SACHS_CONDITIONS], n)
    adata = ad.AnnData(rng.gamma(2.0, 30.0, size=(len(conds), 11)).astype(np.float32), var=pd.DataFrame(index=GENES))
    adata.obs_names = [f"c{i}" for i in range(adata.n_obs)]
    adata.obs["condition"] = pd.Categorical(conds)
    adata.obs["target"] = pd.Categorical(targets)
    adata.obs["observational"] = np.isin(conds, SACHS_OBSERVATIONAL)
    idx = {g: i for i, g in enumerate(GENES)}
    rows, cols = zip(*[(idx[a], idx[b]) for a, b in EDGES], strict=True)
    adata.varp["true_graph"] = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(11, 11))
    return adata


def test_shift_metrics():
    m = shift_metrics(np.array([0.0, 1.0, -1.0]), np.array([1.0, 2.0, 1.0]))
    assert m["mse"] == pytest.approx((1 + 1 + 4) / 3)
    assert m["sign_accuracy"] == pytest.approx(1 / 3)  # 0 is never the right sign


def test_intervention_benchmark_on_sachs_shaped_data(tmp_path):
    records = run_intervention_benchmark(tmp_path, quick=True, peers=[], adata=_fake_sachs())
    methods = {r["method"] for r in records}
    assert {"no_change", "consensus_linear", "consensus_class", "cape_learned", "cape_linear", "cape_class",
            "cape_learned_tau0.05"} <= methods
    assert {r["condition"] for r in records} == {"pakts473+ctrl", "PKC+ctrl", "PIP2+ctrl", "pmek+ctrl", "PIP3+ctrl",
                                                 "PKA+ctrl"}
    # pakts473 has no descendants in the consensus graph: only the all-other-genes set
    assert {r["genes"] for r in records if r["condition"] == "pakts473+ctrl"} == {"all_other"}
    none = [r for r in records if r["method"] == "no_change" and r["metric"] == "sign_accuracy"]
    assert none and all(r["value"] == 0.0 for r in none)
    assert {r["metric"] for r in records} == {"mse", "sign_accuracy", "beats_no_change"}
    text = (tmp_path / "intervention.md").read_text()
    assert "beats no change" in text and "PIP3 → plcg" in text
    assert json.loads((tmp_path / "intervention.json").read_text())
    assert (tmp_path / "intervention.png").stat().st_size > 0


def test_bench_intervention_cli(tmp_path, capsys):
    path = tmp_path / "sachs.h5ad"
    _fake_sachs().write_h5ad(path)
    rc = main(["--quiet", "intervention", "--quick", "--peers", "none", "--input", str(path),
               "--out", str(tmp_path / "out")])
    assert rc == 0 and (tmp_path / "out" / "intervention.md").exists()
    rc = main(["intervention", "--peers", "nope", "--input", str(path), "--out", str(tmp_path / "bad")])
    assert rc == 2 and "unknown peer" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_scm_rows_in_the_perturbation_benchmark(tiny_perturbation):
    records = run_perturbation_benchmark(tiny_perturbation, scm={
        "cape": {"equations": "learned", "epochs": 10},
        "true_dag": {"equations": "linear", "graph": tiny_perturbation.varp["true_dag"]}}, seeds=(0,))
    frame = pd.DataFrame(records)
    mse = frame[(frame.metric == "top20_de_mse") & (frame.subgroup == "overall")].set_index("method")["value"]
    assert {"scm_learned[cape]", "scm_linear[true_dag]"} <= set(mse.index)
    assert frame[frame.method == "scm_linear[true_dag]"]["seed"].isna().all()
    # the oracle graph must beat predicting no change
    assert mse["scm_linear[true_dag]"] < mse["no_change"]


def test_scm_predictor_knock_out_only_moves_descendants(tiny_perturbation):
    model = SCMPerturbationPredictor(tiny_perturbation.varp["true_dag"], equations="linear")
    model.fit(tiny_perturbation, [])
    gene = "G0"
    pred = model.predict([f"{gene}+ctrl"]).iloc[0]
    A = tiny_perturbation.varp["true_dag"].toarray() != 0
    reach = A[0].copy()
    for _ in range(20):
        reach = reach | (reach.astype(int) @ A.astype(int) > 0)
    moved = np.abs(pred.to_numpy() - model.control_mean_) > 0
    moved[0] = False
    assert not (moved & ~reach).any()
    with pytest.raises(Exception, match="graph=None"):
        SCMPerturbationPredictor(A, equations="learned")


def test_workflow_predict_option_dry_run(workdir):
    proc = snakemake(workdir, "-n", "-p", "--config", "predict={'intervene': ['CD3D=0', 'LYZ=2x']}")
    assert proc.returncode == 0, proc.stderr
    assert "rule predict" in proc.stdout and "--intervene CD3D=0 LYZ=2x" in proc.stdout
    assert "results/pbmc68k_reduced/predict/shifts.png" in proc.stdout
    plain = snakemake(workdir, "-n")
    assert plain.returncode == 0 and "rule predict" not in plain.stdout
    bad = snakemake(workdir, "-n", "--config", "predict={'intervene': ['CD3D']}")
    assert bad.returncode != 0 and "predict.intervene" in bad.stdout + bad.stderr
