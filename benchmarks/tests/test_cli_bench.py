"""The ``cape-bench`` command line (``python -m cape_benchmarks``): every benchmark command, cape's global options
and one-line errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cape_benchmarks.cli import BENCH_MODULES, main

COMMANDS = ("attention", "non-relativity", "causal", "causal-scale", "intervention", "pretrain", "embedding",
            "properties", "baselines", "recipe", "encodings", "gears", "paper-runtime", "throughput",
            "edge-confidence", "perturbation-dag")


def test_help_lists_every_benchmark(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: cape-bench")
    assert len(BENCH_MODULES) == len(COMMANDS)
    for command in COMMANDS:
        assert f"    {command} " in out


def test_python_m_runs_the_command_line():
    proc = subprocess.run([sys.executable, "-m", "cape_benchmarks", "--version"], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0 and proc.stdout.startswith("cape-bench ")


@pytest.mark.parametrize("args, words", [
    (["encodings", "--task", "nope"], ["argument --task", "cape-bench encodings --help"]),
    (["nope"], ["invalid choice: 'nope'"]),
    (["causal", "--panel", "nope"], ["argument --panel", "invalid choice: 'nope'"]),
    (["causal", "--panel", "counts", "--quick", "--settings", "boolode_nope", "--out", "x"], ["boolode_nope"]),
    (["--seed", "1", "--threads", "1", "attention", "--quick", "--encodings", "cape,nope", "--out", "x"], ["nope"]),
])
def test_errors_are_one_line(args, words, capsys):
    try:
        code = main(args)
    except SystemExit as exit_:  # argparse usage errors
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("cape-bench: error: "), err
    for word in words:
        assert word in err
