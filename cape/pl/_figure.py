"""How a plot ends: written to a file, returned, shown, as scanpy's ``save``/``show``/``return_fig`` do.

Unlike scanpy, whose ``save`` is a suffix appended to a default name in its figure directory, ``save`` here is the
file itself: its suffix names the format (``dag.png``, ``disk.pdf``).
"""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.backend_bases import FigureCanvasBase
from matplotlib.figure import Figure

from .._errors import CapeInputError
from .._io import save_figure


def checked_save_path(save: str | os.PathLike | None) -> Path | None:
    """``save`` as a :class:`~pathlib.Path` whose suffix names a format matplotlib writes (``None`` stays
    ``None``); refused in one line otherwise, before anything is drawn."""
    if save is None:
        return None
    if isinstance(save, bool) or not isinstance(save, str | os.PathLike):
        raise CapeInputError(f"save must be a file path such as 'dag.png', got {save!r}")
    path = Path(save)
    formats = FigureCanvasBase.get_supported_filetypes()
    if path.suffix.lower().lstrip(".") not in formats:
        raise CapeInputError(f"cannot save a plot as {path.name!r}: name a file ending in one of "
                             f"{', '.join('.' + name for name in sorted(formats))}")
    return path


def finish(fig: Figure, *, save: Path | None, show: bool | None, return_fig: bool, owned: bool) -> Figure | None:
    """Write ``fig`` to ``save`` (atomically, parent folders created), then return it (``return_fig``) or show it.

    ``show=None`` shows the figure unless it was saved or returned. A saved figure that is neither shown nor
    returned is closed when the plot made it (``owned``; not when the caller passed ``ax``), so that a script saving
    many plots does not keep them all open.
    """
    if save is not None:
        save_figure(fig, save)
    if return_fig:
        return fig
    if show or (show is None and save is None):
        plt.show()
    elif save is not None and owned:
        plt.close(fig)
    return None
