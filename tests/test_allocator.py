"""cape._allocator: glibc's malloc keeps large freed blocks, so that a block freed and allocated again at every step
is not faulted in afresh. Each check in a fresh process: the setting is process-wide and set once."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")

# 20 blocks of 64 MiB, each written in full and freed, as torch allocates a step's activations; the loop's page
# faults. (NumPy would ask for huge pages, 512 times fewer faults.)
LOOP = """
import resource, torch
from cape._allocator import keep_freed_blocks
print(keep_freed_blocks({block}))
torch.ones(16 << 20, dtype=torch.float32)  # torch's own first-call work is not counted
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    torch.ones(16 << 20, dtype=torch.float32)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _loop(block: int, **env: str) -> tuple[bool, int]:
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")}
    out = subprocess.run([sys.executable, "-c", LOOP.format(block=block)], capture_output=True, text=True,
                         check=True, env={**environment, **env}).stdout.split()
    return out[0] == "True", int(out[1])


def test_freed_blocks_are_reused_rather_than_faulted_in_again():
    set_, kept = _loop(64 << 20)
    not_set, mapped = _loop(1 << 20)  # below glibc's own threshold: nothing to do, nothing done
    assert set_ and not not_set
    # 20 × 16,384 pages mapped afresh without; with, the pages of a few blocks, reused after.
    assert mapped > 15 * (64 << 20) // 4096
    assert kept < mapped / 3


def test_the_users_own_malloc_settings_are_left_alone():
    set_, _ = _loop(64 << 20, MALLOC_TRIM_THRESHOLD_="131072")
    assert not set_
