"""Gene labels that do not overlap: each is put at the first free spot around its point, or left out."""

from __future__ import annotations

import numpy as np

#: gid of the labels written here, so that callers and tests can find them among an axes' texts.
LABEL_GID = "cape_gene_label"


def place_labels(ax, xy: np.ndarray, names: list[str], *, outward: np.ndarray | None = None,
                 obstacles: np.ndarray | None = None, marker_pt: float = 2.0, avoid: tuple = (),
                 fontsize: float = 7.0) -> list:
    """Write ``names[k]`` next to data point ``xy[k]`` in that order (most important first) without overlap.

    Each label tries offsets of growing distance around its point (starting in the direction ``outward[k]`` when
    given) and takes the first one that overlaps no label already written and stays inside the axes; among those
    spots, it prefers ones that cover fewer ``obstacles`` (data points drawn). A label with no free spot is left
    out. Labels away from their point get a thin leader line.

    ``marker_pt`` is the radius of a point's marker in points: labels start beyond it, and a point covers that much
    around it. ``avoid`` are artists already drawn (texts) that labels must not overlap either.

    Call it after the axes' limits, aspect and any colourbar are set: spots are found in pixels.

    Returns
    -------
    The annotations written (``gid`` :data:`LABEL_GID`), in the order of ``names``, without those left out.
    """

    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    ax.apply_aspect()
    px_per_pt = fig.dpi / 72.0
    to_px = ax.transData.transform
    anchors = to_px(np.asarray(xy, dtype=float).reshape(-1, 2))
    points = to_px(np.asarray(obstacles, dtype=float).reshape(-1, 2)) if obstacles is not None else np.empty((0, 2))
    frame = ax.get_window_extent(renderer)
    marker_px = marker_pt * px_per_pt
    placed = [tuple(artist.get_window_extent(renderer).extents) for artist in avoid]
    written = []
    for k, name in enumerate(names):
        width, height = _text_size(ax, name, fontsize, renderer)
        start = 0.0 if outward is None else float(np.arctan2(outward[k][1], outward[k][0]))
        best = None
        for rank, (dx, dy) in enumerate(_offsets(start, px_per_pt, marker_pt)):
            box = _box(anchors[k], dx, dy, width, height)
            if not _inside(box, frame) or any(_overlap(box, other) for other in placed):
                continue
            covered = int(np.sum((points[:, 0] > box[0] - marker_px) & (points[:, 0] < box[2] + marker_px)
                                 & (points[:, 1] > box[1] - marker_px) & (points[:, 1] < box[3] + marker_px)))
            cost = covered + 0.05 * rank  # a nearer spot wins unless it hides more points
            if best is None or cost < best[0]:
                best = (cost, dx, dy, box)
            if covered == 0:
                break
        if best is None:
            continue
        _, dx, dy, box = best
        placed.append(box)
        far = np.hypot(dx, dy) > (marker_pt + 8) * px_per_pt
        text = ax.annotate(name, xy[k], xytext=(dx / px_per_pt, dy / px_per_pt), textcoords="offset points",
                           fontsize=fontsize, ha=_ha(dx), va=_va(dy), zorder=5,
                           arrowprops={"arrowstyle": "-", "color": "0.4", "lw": 0.4, "shrinkA": 0, "shrinkB": 2}
                           if far else None,
                           bbox={"boxstyle": "square,pad=0.05", "fc": "white", "ec": "none", "alpha": 0.7})
        text.set_gid(LABEL_GID)
        written.append(text)
    return written


def _text_size(ax, name: str, fontsize: float, renderer) -> tuple[float, float]:
    probe = ax.text(0, 0, name, fontsize=fontsize)
    extent = probe.get_window_extent(renderer)
    probe.remove()
    return extent.width + 2.0, extent.height + 1.0  # the white box's padding


def _offsets(start: float, px_per_pt: float, marker_pt: float):
    """Offsets in pixels: rings of 3–40 points beyond the marker, 16 directions each, beginning at ``start``."""

    turns = start + np.deg2rad([0, 22.5, -22.5, 45, -45, 67.5, -67.5, 90, -90, 112.5, -112.5, 135, -135,
                                157.5, -157.5, 180])
    for distance in marker_pt + np.array([3, 8, 14, 21, 30, 40]):
        for angle in turns:
            yield distance * px_per_pt * np.cos(angle), distance * px_per_pt * np.sin(angle)


def _ha(dx: float) -> str:
    return "left" if dx > 1e-6 else "right" if dx < -1e-6 else "center"


def _va(dy: float) -> str:
    return "bottom" if dy > 1e-6 else "top" if dy < -1e-6 else "center"


def _box(anchor: np.ndarray, dx: float, dy: float, width: float, height: float) -> tuple[float, float, float, float]:
    """(x0, y0, x1, y1) in pixels of a text aligned like :func:`_ha` / :func:`_va` at ``anchor + (dx, dy)``."""

    x, y = anchor[0] + dx, anchor[1] + dy
    x0 = {"left": x, "right": x - width, "center": x - width / 2}[_ha(dx)]
    y0 = {"bottom": y, "top": y - height, "center": y - height / 2}[_va(dy)]
    return x0, y0, x0 + width, y0 + height


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _inside(box, frame) -> bool:
    return box[0] >= frame.x0 and box[2] <= frame.x1 and box[1] >= frame.y0 and box[3] <= frame.y1
