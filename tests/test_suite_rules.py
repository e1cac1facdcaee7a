"""Rules the test suite keeps so that it runs the same on any host and in any order, read
statically from the tests' source: every wait on another process or thread has an end."""

import ast
import pathlib

import pytest

TESTS = pathlib.Path(__file__).resolve().parent
WAITS = {"communicate", "wait", "join"}  # methods that block until another process/thread ends
RUNS = {"run", "check_output", "check_call"}  # subprocess functions that do the same


def _unbounded_waits(path: pathlib.Path) -> list[str]:
    lines = path.read_text().splitlines()
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        name, owner = node.func.attr, node.func.value
        keywords = {k.arg for k in node.keywords}
        if "bounded" in lines[node.lineno - 1]:  # a comment there says what bounds it
            continue
        if isinstance(owner, ast.Name) and owner.id == "subprocess" and name in RUNS:
            unbounded = "timeout" not in keywords
        elif name in WAITS:
            unbounded = not node.args and "timeout" not in keywords
        elif name == "readline":  # a pipe's readline has no timeout: tests/bounded.py
            unbounded = isinstance(owner, ast.Attribute) and owner.attr in ("stdout", "stderr")
        else:
            continue
        if unbounded:
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", sorted(TESTS.glob("*.py")), ids=lambda p: p.name)
def test_every_wait_has_an_end(path):
    assert _unbounded_waits(path) == []


def test_the_rule_finds_an_unbounded_wait(tmp_path):
    source = tmp_path / "example.py"
    source.write_text(
        "import subprocess\n"
        "subprocess.run(['true'])\n"
        "subprocess.run(['true'], timeout=5)\n"
        "process.wait()\n"
        "process.wait(timeout=5)\n"
        "process.stdout.readline()\n"
        "lines.readline()\n"
    )
    assert [line.split(":")[1] for line in _unbounded_waits(source)] == ["2", "4", "6"]
