"""Exceptions raised by cape for problems with user input."""

from __future__ import annotations


class CapeInputError(ValueError):
    """A user-facing input problem (file, AnnData key, config value, dataset name).

    The message is a single line naming the problem; the CLI prints it without a traceback.
    """

    def __init__(self, message: str) -> None:
        # One line only: the CLI prints ``str(err)`` as-is.
        super().__init__(" ".join(str(message).split()))
