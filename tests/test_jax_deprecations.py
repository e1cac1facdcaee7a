"""tfm names no JAX attribute that the installed JAX has deprecated.

A warning filter cannot promise this alone: JAX warns about a deprecated module attribute once
per process (its `__getattr__` is cached), so when a dependency touches the name first (orbax
does at import, for `jax.sharding.SingleDeviceSharding` under jax 0.12.1) tfm's own use passes
without a word. So the source is read instead: every `jax...` name it uses, through imports and
aliases, is looked up in the deprecation table of the JAX module it belongs to. The table is the
installed JAX's own, so CI's newest-JAX leg checks against the newest release.
"""

import ast
import importlib
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "tfm"
SOURCES = sorted(PACKAGE.rglob("*.py"))


def _dotted_names(path: pathlib.Path) -> set[str]:
    """Every `jax.a.b` a file names: through `import jax[.x] [as y]`, `from jax.x import y [as
    z]`, and the attribute chains hanging off those names."""
    tree = ast.parse(path.read_text())
    alias_of: dict[str, str] = {}
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "jax":
                    if alias.asname:
                        alias_of[alias.asname] = alias.name
                    else:
                        alias_of["jax"] = "jax"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "jax":
            for alias in node.names:
                names.add(f"{node.module}.{alias.name}")
                alias_of[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain = []
            while isinstance(node, ast.Attribute):
                chain.append(node.attr)
                node = node.value
            if isinstance(node, ast.Name) and node.id in alias_of:
                names.add(".".join([alias_of[node.id], *reversed(chain)]))
    return names


def _deprecation_table(module_name: str) -> dict:
    try:
        module = importlib.import_module(module_name)
    except ImportError:  # a name, not a module
        return {}
    table = getattr(module, "_deprecations", None)
    return table if isinstance(table, dict) else {}


def _deprecated(name: str) -> str | None:
    """JAX's message when some `module.attribute` prefix of `name` is deprecated, else None."""
    parts = name.split(".")
    for cut in range(1, len(parts)):
        table = _deprecation_table(".".join(parts[:cut]))
        if parts[cut] in table:
            message = table[parts[cut]][0]
            return message or "removed"
    return None


def test_the_reader_finds_names_through_aliases(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text(
        "import jax\nimport jax.numpy as jnp\nfrom jax import sharding as sh\n"
        "from jax.sharding import Mesh\n"
        "a = jax.sharding.NamedSharding\nb = jnp.float32\nc = sh.PartitionSpec\n"
    )
    assert {
        "jax.sharding.NamedSharding",
        "jax.numpy.float32",
        "jax.sharding.PartitionSpec",
        "jax.sharding.Mesh",
    } <= _dotted_names(source)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_no_deprecated_jax_name(path):
    used = {name: _deprecated(name) for name in sorted(_dotted_names(path))}
    assert not {name: why for name, why in used.items() if why}, path
