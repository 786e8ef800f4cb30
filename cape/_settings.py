"""Global settings: device, seed, verbosity, progress bars and CPU threads (cf. ``scanpy.settings``)."""

from __future__ import annotations

import logging
import math
import os
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numba
import numpy as np
import torch

from ._errors import CapeInputError

logger = logging.getLogger("cape")

#: Level of progress lines (:class:`cape._progress.ProgressLines`): between INFO and WARNING, so that the default
#: verbosity 1 shows them with the warnings and 0 hides them.
PROGRESS = 25
logging.addLevelName(PROGRESS, "PROGRESS")
_VERBOSITY_LEVELS = {0: logging.ERROR, 1: PROGRESS, 2: logging.INFO, 3: logging.DEBUG}


class StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of the message: a handler kept across calls must not hold
    on to a stream that a notebook or a test harness has since replaced and closed. Lines read ``cape: message``,
    warnings ``cape: warning: message``."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.setFormatter(_LineFormatter())

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ assigns it; the current sys.stderr always wins
        pass


class _LineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno < logging.WARNING else f"{record.levelname.lower()}: "
        return f"cape: {level}{record.getMessage()}"


class _DefaultHandler(StderrHandler):
    """cape's messages on stderr, at ``settings.verbosity``, where nothing else shows them: it stands down when the
    root logger has a handler (``logging.basicConfig``, a test harness) or another handler sits on the ``"cape"``
    logger (the command line's). Without it a notebook user would never see a warning such as "fewer cells than
    genes"; the root logger is never configured."""

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers or any(h is not self for h in logger.handlers):
            return
        super().emit(record)


logger.addHandler(_DefaultHandler())


@dataclass
class CapeSettings:
    """Process-wide defaults used when a function is called with ``device="auto"`` / ``seed=None``.

    Attributes
    ----------
    device
        ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
    seed
        Default random seed.
    verbosity
        0 errors, 1 warnings and progress (default, as in scanpy), 2 info (the command line's default), 3 debug;
        sets the level of the ``"cape"`` logger. Its messages go to stderr unless logging is configured elsewhere
        (a handler on the root logger or on ``"cape"``), which then receives them instead.
    progress
        Progress of long loops (Step I's epochs, pretraining, fine-tuning...). ``None`` (default): a bar where one
        can be drawn (stderr a terminal, a Jupyter notebook), else a log line now and then (a script whose stderr
        is a file or a pipe, the command line under Snakemake); nothing at ``verbosity`` 0. ``True``: bars always;
        ``False``: no progress at all.
    n_threads
        CPU threads for torch and the BLAS/OpenMP libraries (``None`` until set: the libraries' own defaults).
        Setting it calls ``torch.set_num_threads`` and ``threadpoolctl.threadpool_limits`` and exports
        ``OMP_NUM_THREADS`` and friends for libraries and worker processes started later. The CLI sets it to
        ``cape --threads N``, by default :func:`available_cpus`.
    """

    device: str = "auto"
    seed: int = 0
    _verbosity: int = field(default=1, repr=False)
    progress: bool | None = None
    _n_threads: int | None = field(default=None, repr=False)

    @property
    def n_threads(self) -> int | None:
        return self._n_threads

    @n_threads.setter
    def n_threads(self, value: int | None) -> None:
        if value is None:
            self._n_threads = None
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CapeInputError(f"threads must be a positive integer, got {value!r}")
        set_threads(value)
        self._n_threads = int(value)

    @property
    def verbosity(self) -> int:
        return self._verbosity

    @verbosity.setter
    def verbosity(self, value: int) -> None:
        if value not in _VERBOSITY_LEVELS:
            raise CapeInputError(f"verbosity must be one of {sorted(_VERBOSITY_LEVELS)}, got {value!r}")
        self._verbosity = int(value)
        logger.setLevel(_VERBOSITY_LEVELS[self._verbosity])

    def progress_mode(self) -> str | None:
        """How long loops report now: ``"bar"``, ``"lines"`` (log lines at level ``PROGRESS``) or ``None``."""
        if self.progress is not None:
            return "bar" if self.progress else None
        if self._verbosity == 0:
            return None
        if os.environ.get("CI"):  # a CI log keeps every carriage return of a bar: lines read better there
            return "lines"
        return "bar" if sys.stderr.isatty() or self.in_notebook() else "lines"

    def show_progress(self) -> bool:
        """Whether progress bars should be drawn now."""
        return self.progress_mode() == "bar"

    @staticmethod
    def in_notebook() -> bool:
        """Whether this process is a Jupyter kernel (stderr is no terminal there, but a bar can be drawn)."""
        ipython = sys.modules.get("IPython")
        shell = getattr(ipython, "get_ipython", lambda: None)() if ipython is not None else None
        return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


#: Environment variables read by OpenMP and the BLAS libraries when they load (later imports, child processes).
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
                   "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def set_threads(n: int) -> None:
    """Limit torch, the loaded BLAS/OpenMP libraries and those loaded later (via the environment) to ``n`` threads."""
    for var in THREAD_ENV_VARS:
        os.environ[var] = str(n)
    try:
        from threadpoolctl import threadpool_limits  # optional: it comes with scikit-learn, but may be absent
    except ImportError:  # pragma: no cover - installed with scikit-learn
        logger.debug("threadpoolctl not installed: BLAS threads limited through the environment only")
    else:
        threadpool_limits(limits=n)  # applies now, to every loaded library (not used as a context manager)
    try:  # numba's own parallel loops (scanpy's) at most n wide; this starts its pool too, before torch is set
        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    except (ValueError, RuntimeError, OSError) as err:  # no threading layer: numba runs its loops serially
        logger.debug("numba's threads not set: %s", err)
    torch.set_num_threads(n)


def start_numba_pool() -> None:
    """Start numba's thread pool now, and leave torch's thread count as it was.

    When numba's pool starts, at the first parallel numba function of the process (scanpy's ``normalize_total`` on
    sparse counts is one), its OpenMP threading layer sets OpenMP's thread count to ``NUMBA_NUM_THREADS``, every CPU
    by default. torch shares that OpenMP runtime, so from then on torch would run on every CPU whatever
    :attr:`CapeSettings.n_threads`, ``OMP_NUM_THREADS`` or ``torch.set_num_threads`` had said, and several processes
    on one machine (a Snakemake run, benchmarks side by side) would wait on each other's spinning threads. A pool
    that has started does not set the count again; cape starts it on import.
    """
    threads = torch.get_num_threads()
    try:
        numba.get_num_threads()  # starts the pool (once per process)
    except (ValueError, RuntimeError, OSError) as err:  # no threading layer: then no pool can reset torch's count
        logger.debug("numba's thread pool not started: %s", err)
    torch.set_num_threads(threads)


def cgroup_cpu_limit(root: str | os.PathLike = "/sys/fs/cgroup",
                     proc_cgroup: str | os.PathLike = "/proc/self/cgroup") -> float | None:
    """CPUs allowed by this process's cgroup quota (``quota / period``), or ``None`` when unlimited or unknown.

    Reads cgroup v2 ``cpu.max`` ("quota period" or "max period") and cgroup v1 ``cpu.cfs_quota_us`` /
    ``cpu.cfs_period_us`` (quota -1 = unlimited), in the process's own cgroup (from ``proc_cgroup``) and at the
    mount root (containers often see their cgroup there). The smallest limit found wins.
    """
    root = Path(root)
    v1_path = v2_path = ""
    try:
        for line in Path(proc_cgroup).read_text().splitlines():
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            if parts[0] == "0" and parts[1] == "":
                v2_path = parts[2]
            elif "cpu" in parts[1].split(","):
                v1_path = parts[2]
    except OSError:
        pass
    limits = []
    for folder in dict.fromkeys([root / v2_path.lstrip("/"), root]):
        limits.append(_read_cpu_max(folder / "cpu.max"))
    for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        for folder in dict.fromkeys([root / mount / v1_path.lstrip("/"), root / mount]):
            limits.append(_read_cfs(folder))
    found = [x for x in limits if x is not None]
    return min(found) if found else None


def _read_cpu_max(path: Path) -> float | None:
    try:
        fields = path.read_text().split()
    except OSError:
        return None
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota, period = float(fields[0]), float(fields[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _read_cfs(folder: Path) -> float | None:
    try:
        quota = float((folder / "cpu.cfs_quota_us").read_text().strip())
        period = float((folder / "cpu.cfs_period_us").read_text().strip())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def available_cpus(root: str | os.PathLike = "/sys/fs/cgroup",
                   proc_cgroup: str | os.PathLike = "/proc/self/cgroup") -> int:
    """The CPUs this process may use: its affinity mask, capped by the cgroup CPU quota (rounded up), at least 1.

    ``os.cpu_count()`` counts the machine's cores, which oversubscribes a job pinned to a few cores (cluster
    schedulers, ``taskset``) or throttled by a container quota.
    """
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        n = os.cpu_count() or 1
    quota = cgroup_cpu_limit(root, proc_cgroup)
    if quota is not None:
        n = min(n, math.ceil(quota))
    return max(1, n)


def physical_memory() -> int | None:
    """The machine's physical memory in bytes (POSIX ``sysconf``), or ``None`` where the system does not say."""
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # not POSIX, or the name unknown here
        return None
    return int(pages) * int(page_size) if pages > 0 and page_size > 0 else None


def default_threads() -> int:
    """Threads the CLI uses without ``--threads``: :func:`available_cpus`, lowered to torch's own default when that
    is smaller (``OMP_NUM_THREADS`` set by the user or a scheduler, or a caller that already limited torch)."""

    return max(1, min(available_cpus(), torch.get_num_threads()))


settings = CapeSettings()
logger.setLevel(_VERBOSITY_LEVELS[settings.verbosity])
start_numba_pool()


def resolve_device(device: str | None = "auto"):
    """Turn ``"auto"``/``None``/a device string into a :class:`torch.device`.

    ``"auto"`` picks CUDA when available, else CPU. Asking for CUDA on a machine without it is a user error.
    """

    if device is None or device == "auto":
        device = settings.device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise CapeInputError(f"unknown device {device!r}: use 'auto', 'cpu', 'cuda' or 'cuda:N'") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise CapeInputError(f"device {device!r} requested but CUDA is not available on this machine")
    return dev


def resolve_seed(seed: int | None) -> int:
    """Seed to use: the given one, else ``settings.seed``."""
    return settings.seed if seed is None else int(seed)


def seed_everything(seed: int | None) -> int:
    """Seed Python, NumPy and torch (CPU and CUDA); returns the seed used."""

    s = resolve_seed(seed)
    random.seed(s)
    np.random.seed(s % (2**32))  # noqa: NPY002 - third-party code draws from the legacy global RNG
    torch.manual_seed(s)
    return s
