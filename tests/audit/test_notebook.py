"""A fit in a Jupyter notebook, executed cell by cell in a real IPython kernel (nbclient)."""

from __future__ import annotations

import pytest
from conftest import TESTS, read_run

pytestmark = pytest.mark.slow  # a kernel of its own: 8 s

CELLS = [
    f"import sys\nsys.path.insert(0, {TESTS!r})\nimport conftest  # the backend and TensorFlow's log level",
    "import tensorflow as tf\n"
    "\n"
    "\n"
    "def stage(x, y):\n"
    "    out = tf.numpy_function(lambda batch: batch, [x], tf.float32)\n"
    "    out.set_shape(x.shape)\n"
    "    return out, y",
    "import rnnmon\n"
    "from conftest import sequences, tiny_model\n"
    "x, y = sequences(12)\n"
    "data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).map(stage)\n"
    "tiny_model().fit(data, verbose=0, callbacks=[rnnmon.UtilizationMonitor(LOGDIR)])",
]


def test_a_finding_names_the_notebook_cell_as_ipython_does(tmp_path):
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("ipykernel")
    cells = [CELLS[0] + f"\nLOGDIR = {str(tmp_path)!r}", *CELLS[1:]]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    nbclient.NotebookClient(notebook, timeout=180, kernel_name="python3").execute()
    assert [cell.execution_count for cell in notebook.cells] == [1, 2, 3]
    findings = {f["code"]: f for f in read_run(str(tmp_path)).findings}
    # `stage` is defined on line 4 of the second cell: IPython's traceback says "Cell In[2], line 4"
    assert "MapDataset(stage) (defined at Cell In[2], line 4)" in findings["PIPELINE_PY_FUNCTION"]["message"]
    logged = "".join(output.get("text", "") for output in notebook.cells[2].outputs)
    assert "PIPELINE_PY_FUNCTION" in logged and "(defined at Cell In[2], line 4)" in logged
