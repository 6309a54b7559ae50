"""The README's Python examples run verbatim (on the CPU here; on the GPU where there is one)."""

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("k", range(len(BLOCKS)))
def test_readme_example_runs(k):
    if "sklearn" in BLOCKS[k]:
        pytest.importorskip("sklearn")
    if "SMILES" in BLOCKS[k]:
        pytest.importorskip("rdkit")
    exec(compile(BLOCKS[k], f"README.md example {k + 1}", "exec"), {"__name__": "readme_example"})
