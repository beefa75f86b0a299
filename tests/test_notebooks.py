"""Every notebook in notebooks/ runs top to bottom at a reduced size (KLB_NOTEBOOK_SMALL=1).

Notebooks hold no logic of their own: they call the package and plot. A notebook reads
``os.environ.get("KLB_NOTEBOOK_SMALL")`` to shrink its sizes.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path: Path, tmp_path: Path) -> None:
    os.environ["KLB_NOTEBOOK_SMALL"] = "1"
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()
