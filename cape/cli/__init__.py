"""The ``cape`` command line: one subcommand per workflow stage, ``cape bench <name>`` per benchmark.

One module per command, named after it (``cape train`` → :mod:`cape.cli.train`; every ``cape bench <name>`` in
:mod:`cape.cli.bench`); each exposes ``register(commands)`` adding its parser with ``set_defaults(func=run)``;
``func(args)`` returns an exit code (or ``None`` for 0). User mistakes raise :class:`cape.CapeInputError`,
which ``main`` prints as one line on stderr with exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Sequence

from .. import __version__
from .._errors import CapeInputError
from .._settings import default_threads, resolve_device, settings
from . import bench, causal, data, embed, encode, encodings, evaluate, predict, preprocess, train
from ._io import positive_int

#: In the order ``cape --help`` lists them.
COMMAND_MODULES = (bench, data, preprocess, encodings, causal, predict, train, embed, encode, evaluate)


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in one line (exit 2) instead of usage + message."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"cape: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cape", description="Causality-aware positional encodings for single-cell data.")
    parser.add_argument("--version", action="version", version=f"cape {__version__}")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: cape.settings.seed = 0)")
    parser.add_argument("--device", default=None, help="'auto' (default), 'cpu', 'cuda' or 'cuda:N'")
    parser.add_argument("--quiet", action="store_true", help="only print errors; no progress bars")
    # dest differs from the `--threads` of `cape bench encodings/pretrain` (threads per model), which would
    # otherwise overwrite it in the shared namespace.
    parser.add_argument("--threads", dest="global_threads", type=positive_int, default=None,
                        help="CPU threads for torch and BLAS (default: the CPUs this process may use, from its "
                             "affinity mask and cgroup quota; OMP_NUM_THREADS lowers it)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True
    for module in COMMAND_MODULES:
        module.register(commands)
    return parser


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of the message: a handler kept across calls of ``main``
    must not hold on to a stream that a notebook or a test harness has since replaced and closed."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ assigns it; the current sys.stderr always wins
        pass


def _configure_logging(quiet: bool) -> None:
    logger = logging.getLogger("cape")
    if not any(getattr(h, "_cape_cli", False) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("cape: %(message)s"))
        handler._cape_cli = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    # Warnings (e.g. duplicated gene names made unique) become one line each, like errors.
    def _one_line_warning(message, category, filename, lineno, file=None, line=None):
        if not quiet:
            print(f"cape: warning: {message}", file=sys.stderr)

    warnings.showwarning = _one_line_warning
    settings.verbosity = 0 if quiet else 2
    if quiet:
        settings.progress = False


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``cape`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.quiet)
    try:
        if args.seed is not None:
            settings.seed = args.seed
        if args.command != "data":  # every other command computes; `cape data` need not import torch

            settings.n_threads = args.global_threads if args.global_threads is not None else default_threads()
        if args.device is not None:

            resolve_device(args.device)  # validate early: one line if CUDA is missing
            settings.device = args.device
        code = args.func(args)
    except CapeInputError as err:
        print(f"cape: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("cape: interrupted", file=sys.stderr)
        return 130
    return int(code or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
