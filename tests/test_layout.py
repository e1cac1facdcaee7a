"""The package's shape: the paper core never imports the XLA:CPU kit (only `tfm.implementation`
loads it, when a setting asks), no module imports itself back through others, none grows past
~450 lines. Read statically from the source, so nothing is imported to check it."""

import ast
import pathlib
import re

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "tfm"
CORE = ("attention", "cache", "config", "layers", "loss", "model", "training", "tokens")


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _imports(path: pathlib.Path) -> set[str]:
    """The tfm modules a file imports, at any depth of its code: `from tfm.x import y` is
    module `tfm.x.y` where that is a module, else `tfm.x` (y is a name defined there)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in MODULES else node.module)
    return {name for name in found if name == "tfm" or name.startswith("tfm.")}


@pytest.mark.parametrize("module", CORE)
def test_the_paper_core_never_imports_the_kit(module):
    imported = _imports(MODULES[f"tfm.{module}"])
    assert not [name for name in imported if name.startswith("tfm.xla_cpu")], imported


def test_only_the_choice_module_imports_the_kit():
    """Inference, the job and every other module reach the kit's op forms through
    `tfm.implementation` alone (the kit's own modules import each other)."""
    importers = {
        name
        for name, path in MODULES.items()
        if not name.startswith("tfm.xla_cpu")
        and any(target.startswith("tfm.xla_cpu") for target in _imports(path))
    }
    assert importers == {"tfm.implementation"}
    assert any(name.startswith("tfm.inference.") for name in MODULES)
    assert any(name.startswith("tfm.job.") for name in MODULES)


def test_no_import_cycles():
    graph = {
        name: {target for target in _imports(path) if target in MODULES and target != name}
        for name, path in MODULES.items()
    }
    state: dict[str, str] = {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = "open"
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                cycle = trail[trail.index(target) :] + [target]
                raise AssertionError(" -> ".join(cycle))
            if target not in state:
                visit(target, [*trail, target])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_no_module_is_long():
    lengths = {name: len(path.read_text().splitlines()) for name, path in MODULES.items()}
    assert max(lengths.values()) <= 460, sorted(lengths.items(), key=lambda kv: -kv[1])[:3]


def _layout_paths(text: str) -> list[str]:
    """The paths of ARCHITECTURE.md's layout block (each name at its indent, under the folder
    above it) and every `path/like.py` the rest of the page quotes."""
    block = text.split("```", 2)[1]
    paths, folders = [], []  # folders: (indent, path) of the folders enclosing the line
    for line in block.splitlines():
        found = re.match(r"( *)([\w.-]+/?(?:, [\w.-]+/?)*)(?:  |$)", line)
        if not found or len(found.group(1)) >= 20:  # a wrapped description
            continue
        indent = len(found.group(1))
        folders = [(i, f) for i, f in folders if i < indent]
        parent = folders[-1][1] if folders else ""
        for name in found.group(2).split(", "):
            if "." in name or name.endswith("/"):
                paths.append(parent + name)
            if name.endswith("/"):
                folders.append((indent, parent + name))
    quoted = re.findall(r"`((?:tfm|tests|benchmarks|configs|docs|experiments)/[\w./-]+)`", text)
    return paths + quoted


def test_every_path_architecture_names_exists():
    text = (PACKAGE.parent / "docs" / "ARCHITECTURE.md").read_text()
    paths = _layout_paths(text)
    assert "tfm/implementation.py" in paths and "tfm/cpu_host/side_by_side.py" in paths
    missing = [path for path in paths if not (PACKAGE.parent / path).exists()]
    assert not missing, missing
