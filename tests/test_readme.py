import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks(kind: str = "") -> list[str]:
    """The README's python examples; `kind` selects those marked `<!-- example: KIND -->` (run by
    the test of that feature, e.g. the export examples need an exported model), "" the rest."""
    blocks = re.findall(
        r"(<!-- example: (\w+) -->\n)?```python\n(.*?)```", README.read_text(), re.S
    )
    return [code for _, marked, code in blocks if marked == kind]


def test_readme_library_example_runs():
    blocks = _python_blocks()
    assert blocks, "README.md has no python example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {})
