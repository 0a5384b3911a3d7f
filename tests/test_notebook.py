"""The getting-started notebook runs top to bottom on the host server."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).parent.parent / "notebooks" / "getting_started.ipynb"


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_getting_started_notebook_runs(tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    outputs = {
        i: "".join(
            o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) for o in c.outputs
        )
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code"
    }
    assert not any(o.get("output_type") == "error" for c in nb.cells for o in c.get("outputs", []))
    assert "True" in outputs[max(outputs)]  # client.closed
    assert any(text.strip() == "True" for text in outputs.values())  # all tasks matched
