from __future__ import annotations

import logging

import pytest
import torch

import cape
from cape import CapeInputError
from cape._settings import resolve_device, seed_everything


def test_auto_device_matches_cuda_availability():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_device(None).type == expected
    assert resolve_device("cpu").type == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present")
def test_cuda_without_cuda_is_a_user_error():
    with pytest.raises(CapeInputError, match="CUDA is not available"):
        resolve_device("cuda")


def test_unknown_device():
    with pytest.raises(CapeInputError, match="unknown device 'tpu0'"):
        resolve_device("tpu0")


def test_seed_everything_is_reproducible():
    seed_everything(3)
    a = torch.rand(4)
    seed_everything(3)
    assert torch.equal(a, torch.rand(4))


def test_verbosity_sets_cape_logger_only():
    root_level = logging.getLogger().level
    old = cape.settings.verbosity
    try:
        cape.settings.verbosity = 3
        assert logging.getLogger("cape").level == logging.DEBUG
        assert logging.getLogger().level == root_level
        with pytest.raises(CapeInputError, match="verbosity must be one of"):
            cape.settings.verbosity = 7
    finally:
        cape.settings.verbosity = old


def test_progress_respects_setting():
    old = cape.settings.progress
    try:
        cape.settings.progress = False
        assert not cape.settings.show_progress()
        cape.settings.progress = True
        assert cape.settings.show_progress()
    finally:
        cape.settings.progress = old
