"""Progress of long loops (cape._progress): bars where they can be drawn, rate-limited lines elsewhere."""

from __future__ import annotations

import subprocess
import sys
from typing import ClassVar

import pytest

import cape
from cape._progress import ProgressLines, format_seconds, progress
from cape._settings import PROGRESS


@pytest.fixture
def quiet_settings():
    old = cape.settings.progress, cape.settings.verbosity
    yield cape.settings
    cape.settings.progress, cape.settings.verbosity = old


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == PROGRESS]


def test_lines_report_the_first_the_last_and_one_per_interval(caplog):
    clock = _Clock()
    bar = ProgressLines(range(20), desc="train", total=20, unit="epoch", interval=10.0, clock=clock)
    with caplog.at_level(PROGRESS, logger="cape"):
        for epoch in bar:
            clock.now += 3.0                                       # three seconds an epoch
            bar.set_postfix({"train_loss": 1.0 / (epoch + 1)}, val_accuracy=0.5)
    lines = _messages(caplog)
    # epoch 1, then every fourth epoch (12 s > 10 s since the last line), and the last one
    assert [line.split(",")[0] for line in lines] == [
        "train: epoch 1/20", "train: epoch 5/20", "train: epoch 9/20", "train: epoch 13/20", "train: epoch 17/20",
        "train: epoch 20/20"]
    assert lines[0] == "train: epoch 1/20, train_loss 1, val_accuracy 0.5, 3 s elapsed, at most 57 s left"
    assert lines[-1] == "train: epoch 20/20, train_loss 0.05, val_accuracy 0.5, 1 min 00 s in all"


def test_an_early_stop_gets_its_last_line_and_an_error_none(caplog):
    clock = _Clock()
    with caplog.at_level(PROGRESS, logger="cape"):
        bar = ProgressLines(range(100), desc="fit", clock=clock, unit="epoch")
        for epoch in bar:
            clock.now += 1.0
            if epoch == 6:
                break
        bar.close()
        bar.close()                                                # closing twice says nothing more
        failing = ProgressLines(range(100), desc="broken", clock=clock)
        with pytest.raises(RuntimeError):
            for step in failing:
                clock.now += 1.0
                if step == 4:
                    raise RuntimeError("diverged")
        del failing
    assert _messages(caplog) == ["fit: epoch 1/100, 1 s elapsed, at most 1 min 39 s left",
                                 "fit: epoch 7/100, 7 s in all",
                                 "broken: step 1/100, 1 s elapsed, at most 1 min 39 s left"]


def test_format_seconds():
    assert [format_seconds(s) for s in (0.4, 59.4, 61, 3599, 3720)] == ["0 s", "59 s", "1 min 01 s", "59 min 59 s",
                                                                       "1 h 02 min"]


def test_progress_follows_the_settings(quiet_settings, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    quiet_settings.progress, quiet_settings.verbosity = None, 1
    assert isinstance(progress(range(3), desc="x"), ProgressLines)   # stderr a file or pipe: lines
    assert not isinstance(progress(range(3), desc="x", lines=False), ProgressLines)
    quiet_settings.verbosity = 0                                      # silent
    assert quiet_settings.progress_mode() is None and progress(range(3)).disable
    quiet_settings.verbosity = 1
    quiet_settings.progress = False                                   # an explicit False hides everything
    assert quiet_settings.progress_mode() is None and progress(range(3)).disable
    quiet_settings.progress = True                                    # an explicit True draws a bar
    bar = progress(range(3))
    assert not isinstance(bar, ProgressLines) and not bar.disable
    bar.close()
    quiet_settings.progress = None
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert quiet_settings.progress_mode() == "bar"                    # a terminal


def test_a_notebook_kernel_gets_bars(quiet_settings, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    quiet_settings.progress, quiet_settings.verbosity = None, 1

    class Shell:
        config: ClassVar[dict] = {"IPKernelApp": {}}

    class IPython:
        @staticmethod
        def get_ipython():
            return Shell()

    assert not quiet_settings.in_notebook()
    monkeypatch.setitem(sys.modules, "IPython", IPython)
    assert quiet_settings.in_notebook() and quiet_settings.progress_mode() == "bar"
    Shell.config = {}                                                 # a terminal IPython: stderr decides
    assert quiet_settings.progress_mode() == "lines"


_SCRIPT = """
import sys
import cape
from cape._progress import progress
cape.settings.verbosity = int(sys.argv[1])
bar = progress(range(3), desc="demo", total=3, unit="epoch")
for i in bar:
    bar.set_postfix(loss=0.5)
"""


@pytest.mark.parametrize("verbosity", [0, 1])
def test_a_script_with_stderr_in_a_pipe_prints_lines(verbosity, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    err = subprocess.run([sys.executable, "-c", _SCRIPT, str(verbosity)], capture_output=True, text=True,
                         check=True).stderr
    lines = [line for line in err.splitlines() if line.startswith("cape")]
    if verbosity == 0:
        assert lines == []
    else:
        assert [line.split(",")[0] for line in lines] == ["cape: demo: epoch 1/3", "cape: demo: epoch 3/3"]
        assert "loss 0.5" in lines[-1] and "in all" in lines[-1]

