from __future__ import annotations

import subprocess
import sys

import anndata as ad
import numpy as np
import pytest

from cape.cli import main


def run_cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    """The real console entry point in a subprocess, as a user would run it."""
    return subprocess.run([sys.executable, "-m", "cape", *args], capture_output=True, text=True, cwd=cwd,
                          check=False)


def run_inprocess(capsys, *args: str) -> subprocess.CompletedProcess:
    """``main()`` in this process (fast); same result shape as :func:`run_cli`."""
    try:
        code = main(list(args))
    except SystemExit as exit_:  # argparse usage errors
        code = int(exit_.code or 0)
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, captured.out, captured.err)


def assert_one_line_error(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("cape: error: ")
    assert "Traceback" not in proc.stderr
    for w in words:
        assert w in lines[0]


def test_data_list(capsys):
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    for name in ("pbmc68k_reduced", "krumsiek11", "sachs2005", "norman2019"):
        assert name in out


def test_data_fetch_package_dataset(capsys, tmp_path):
    out_file = tmp_path / "k.h5ad"
    assert main(["data", "fetch", "krumsiek11", "--output", str(out_file)]) == 0
    assert "krumsiek11 graph:" in capsys.readouterr().out
    assert ad.read_h5ad(out_file).shape == (640, 11)


def test_data_fetch_unknown_name(capsys):
    proc = run_inprocess(capsys, "data", "fetch", "pbmc3k")
    assert_one_line_error(proc, "unknown dataset 'pbmc3k'", "pbmc68k_reduced")


def test_preprocess_writes_output(tmp_path, counts_adata):
    src, dst = tmp_path / "in.h5ad", tmp_path / "out" / "pp.h5ad"
    counts_adata.write_h5ad(src)
    proc = run_cli("--quiet", "preprocess", "--input", str(src), "--output", str(dst), "--n-top-genes", "30")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # --quiet
    out = ad.read_h5ad(dst)
    assert out.var["cape_used"].sum() == 30 and "counts" in out.layers
    assert not [p for p in dst.parent.iterdir() if p.name.endswith(".tmp")]


def _bad_inputs(tmp_path, counts_adata):
    text = tmp_path / "text.h5ad"
    text.write_text("not an h5ad\n")
    empty_cells = tmp_path / "cells0.h5ad"
    ad.AnnData(np.zeros((0, 4), dtype=np.float32)).write_h5ad(empty_cells)
    empty_genes = tmp_path / "genes0.h5ad"
    ad.AnnData(np.zeros((4, 0), dtype=np.float32)).write_h5ad(empty_genes)
    nan = tmp_path / "nan.h5ad"
    a = counts_adata.copy()
    a.X[2, 2] = np.nan
    a.write_h5ad(nan)
    inf = tmp_path / "inf.h5ad"
    a.X[2, 2] = np.inf
    a.write_h5ad(inf)
    neg = tmp_path / "neg.h5ad"
    a.X[2, 2] = -5
    a.write_h5ad(neg)
    return {
        "missing": (str(tmp_path / "missing.h5ad"), "input file not found"),
        "text": (str(text), "cannot read"),
        "0 cells": (str(empty_cells), "0 cells"),
        "0 genes": (str(empty_genes), "0 genes"),
        "nan": (str(nan), "NaN"),
        "inf": (str(inf), "inf"),
        "negative": (str(neg), "negative values"),
        "unknown dataset": ("dataset:nope", "unknown dataset 'nope'"),
    }


def test_bad_input_subprocess_has_no_traceback(tmp_path):
    bad = tmp_path / "text.h5ad"
    bad.write_text("not an h5ad\n")
    proc = run_cli("preprocess", "--input", str(bad), "--output", str(tmp_path / "o.h5ad"))
    assert_one_line_error(proc, "cannot read")
    assert not (tmp_path / "o.h5ad").exists()


def test_bad_inputs_one_line_no_output(tmp_path, counts_adata, capsys):
    for case, (src, words) in _bad_inputs(tmp_path, counts_adata).items():
        dst = tmp_path / "results" / f"{case.replace(' ', '_')}.h5ad"
        proc = run_inprocess(capsys, "preprocess", "--input", src, "--output", str(dst))
        assert_one_line_error(proc, words)
        assert not dst.exists(), case
        if dst.parent.exists():
            assert not list(dst.parent.iterdir()), f"partial output left for {case}"


def test_duplicated_genes_warn_in_one_line(tmp_path, counts_adata):
    names = list(counts_adata.var_names)
    names[1] = names[0]
    counts_adata.var_names = names
    src, dst = tmp_path / "dup.h5ad", tmp_path / "pp.h5ad"
    counts_adata.write_h5ad(src)
    proc = run_cli("preprocess", "--input", src.as_posix(), "--output", dst.as_posix(), "--n-top-genes", "20")
    assert proc.returncode == 0, proc.stderr
    warnings = [ln for ln in proc.stderr.splitlines() if "duplicated gene names" in ln]
    assert warnings and warnings[0].startswith("cape: warning:")
    assert "Traceback" not in proc.stderr
    assert ad.read_h5ad(dst).var_names.is_unique


@pytest.mark.parametrize(
    "args, words",
    [
        (["preprocess", "--input", "x.h5ad"], "required: --output"),
        (["preprocess", "--input", "x.h5ad", "--output", "y.txt"], "--output must end in .h5ad"),
        (["--device", "cuda:7", "data", "list"], "CUDA is not available"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_usage_errors(args, words, capsys):
    proc = run_inprocess(capsys, *args)
    if "CUDA" in words and "cuda" not in proc.stderr.lower():
        pytest.skip("this machine has CUDA")
    assert_one_line_error(proc, words)


def test_cli_log_lines_follow_the_current_stderr(monkeypatch):
    """The CLI's log handler outlives one call of main: it must write to the stderr of the moment, not to a
    stream captured earlier and since closed (a test harness's or a notebook's)."""
    import io
    import logging
    import sys

    from cape.cli import _configure_logging

    logger = logging.getLogger("cape")
    before = list(logger.handlers)
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    try:
        _configure_logging(quiet=False)
        first.close()
        second = io.StringIO()
        monkeypatch.setattr(sys, "stderr", second)
        logger.warning("still heard")
        assert "cape: warning: still heard" in second.getvalue()
    finally:
        for handler in logger.handlers:
            if handler not in before:
                logger.removeHandler(handler)


def test_help_lists_the_users_commands_only(capsys):
    """The benchmarks are a project of their own (``cape-bench``): ``cape --help`` names no benchmark, and the old
    ``cape bench ...`` is a one-line error pointing at the new command."""
    proc = run_inprocess(capsys, "--help")
    assert proc.returncode == 0 and "train" in proc.stdout
    assert "bench" not in proc.stdout
    proc = run_inprocess(capsys, "bench", "encodings", "--task", "annotation", "--quick")
    assert_one_line_error(proc, "'cape-bench encodings --task annotation --quick'")


def test_import_cape_never_imports_the_benchmarks():
    code = ("import sys, cape, cape.cli, cape.tl, cape.pl, cape.tasks\n"
            "assert not [m for m in sys.modules if m.startswith('cape_benchmarks')]\n"
            "assert 'bench' not in dir(cape)")
    subprocess.run([sys.executable, "-c", code], check=True)
