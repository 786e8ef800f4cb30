"""The ``cape`` command line: one subcommand per workflow stage (the benchmarks have their own ``cape-bench``).

One module per command, named after it (``cape train`` → :mod:`cape.cli.train_command`); each exposes
``register(commands)`` adding its parser with ``set_defaults(func=run)``; ``func(args)`` returns an exit code (or
``None`` for 0). User mistakes raise :class:`cape.CapeInputError`, which ``main`` prints as one line on stderr with
exit code 2, never a traceback. :func:`add_global_options` and :func:`run_command` are shared with the ``cape-bench``
command line.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Sequence

from .. import __version__
from .._errors import CapeInputError
from .._settings import StderrHandler, default_threads, resolve_device, settings
from . import (
    causal_command,
    data_command,
    embed_command,
    encode_command,
    encodings_command,
    evaluate_command,
    perturb_command,
    predict_command,
    preprocess_command,
    train_command,
)
from ._command_io import positive_int

#: In the order ``cape --help`` lists them.
COMMAND_MODULES = (data_command, preprocess_command, encodings_command, causal_command, predict_command, train_command,
                   embed_command, encode_command, evaluate_command, perturb_command)


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in one line (exit 2) instead of usage + message."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog.split()[0]}: error: {message} (see '{self.prog} --help')\n")


def add_global_options(parser: argparse.ArgumentParser) -> None:
    """``--version``, ``--seed``, ``--device``, ``--quiet`` and ``--threads``: the options before the command."""
    parser.add_argument("--version", action="version", version=f"{parser.prog} {__version__}")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: cape.settings.seed = 0)")
    parser.add_argument("--device", default=None, help="'auto' (default), 'cpu', 'cuda' or 'cuda:N'")
    parser.add_argument("--quiet", action="store_true", help="only print errors; no progress bars")
    # dest differs from the `--threads` of `cape-bench encodings/pretrain` (threads per model), which would
    # otherwise overwrite it in the shared namespace.
    parser.add_argument("--threads", dest="global_threads", type=positive_int, default=None,
                        help="CPU threads for torch and BLAS (default: the CPUs this process may use, from its "
                             "affinity mask and cgroup quota; OMP_NUM_THREADS lowers it)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cape", description="Causality-aware positional encodings for single-cell data.")
    add_global_options(parser)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True
    for module in COMMAND_MODULES:
        module.register(commands)
    _moved_bench(commands)
    return parser


def _moved_bench(commands) -> None:
    """``cape bench ...`` (before the benchmarks left the library): one line naming ``cape-bench``, exit code 2."""
    moved = commands.add_parser("bench", add_help=False, prefix_chars="\0")
    moved.add_argument("rest", nargs=argparse.REMAINDER)

    def run(args: argparse.Namespace) -> int:
        command = " ".join(["cape-bench", *args.rest])
        raise CapeInputError(f"the benchmarks have their own command: use '{command}'")

    moved.set_defaults(func=run)


def _configure_logging(quiet: bool) -> None:
    logger = logging.getLogger("cape")
    if not any(getattr(h, "_cape_cli", False) for h in logger.handlers):
        handler = StderrHandler()
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
    return run_command(build_parser().parse_args(argv))


def run_command(args: argparse.Namespace, prog: str = "cape") -> int:
    """Apply the global options of ``args`` (:func:`add_global_options`) and run its command; ``prog`` names the
    command line in one-line errors."""
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
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    return int(code or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
