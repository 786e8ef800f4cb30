from __future__ import annotations

import pytest

from cape import CapeInputError
from cape.tasks.labels import resolve_label_key


def test_label_key_resolution(trained_adata):
    assert resolve_label_key(trained_adata, "auto") is None
    trained_adata.uns["cape"]["dataset"] = {"keys": {"labels": "cell_type"}}
    assert resolve_label_key(trained_adata, "auto") == "cell_type"
    with pytest.raises(CapeInputError, match="label key obs\\['celltype'\\] not found"):
        resolve_label_key(trained_adata, "celltype")
