"""Array helpers shared by every layer."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def dense(x, dtype=np.float64) -> np.ndarray:
    """``x`` (a NumPy array, a SciPy sparse matrix or array-like) as a dense NumPy array of ``dtype`` (``None``:
    keep the input's dtype)."""
    return np.asarray(x.toarray() if sp.issparse(x) else x, dtype=dtype)
