"""Every python example in the README and in docs/ runs (those marked `<!-- example: KIND -->`
run in the test of that feature, e.g. the export recipes in tests/test_export.py)."""

import json
import pathlib
import re

import pytest

from tfm.experiments import table3_text

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]


def _python_blocks(kind: str = "", documents: list[pathlib.Path] | None = None) -> list[str]:
    """The python examples of `documents` (default: the README and docs/); `kind` selects those
    marked `<!-- example: KIND -->`, "" the unmarked ones."""
    found = []
    for document in documents or DOCUMENTS:
        blocks = re.findall(
            r"(<!-- example: (\w+) -->\n)?```python\n(.*?)```", document.read_text(), re.S
        )
        found += [code for _, marked, code in blocks if marked == kind]
    return found


def test_the_readme_has_a_library_example_and_stays_short():
    assert _python_blocks(documents=[README]), "README.md has no python example"
    assert len(README.read_text().splitlines()) <= 300


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.name)
def test_the_python_examples_run(document):
    for block in _python_blocks(documents=[document]):
        exec(compile(block, str(document), "exec"), {})


def test_every_document_the_readme_links_to_exists():
    for target in re.findall(r"\]\(((?:docs|benchmarks|experiments)/[^)#]+)\)", README.read_text()):
        assert (ROOT / target).is_file(), target


def test_the_readme_table3_block_is_the_committed_table():
    """The README's Table 3 figures are the committed sweep's, not copied by hand: the block
    between the markers is `collect --readme`'s rendering of experiments/table3-mini/table3.json
    (after a run lands, paste in the output of `python -m tfm.experiments collect --workdir
    experiments/table3-mini --readme`)."""
    block = re.search(
        r"<!-- table3-summary -->\n(.*?)<!-- /table3-summary -->", README.read_text(), re.S
    )
    assert block, "README.md has no <!-- table3-summary --> block"
    table = json.loads((ROOT / "experiments/table3-mini/table3.json").read_text())
    assert block.group(1) == table3_text.readme_summary(table)
