"""Run a Python program in a fresh process from the repository root and read the JSON object it
prints on its last line: the tests that need a process of their own (eight CPU devices, a
sharded compile) report back this way."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def last_json_line(stdout: str) -> dict:
    """The JSON object on the last line of a program's output (earlier lines are its logs)."""
    return json.loads(stdout.strip().splitlines()[-1])


def run_in_repo(argv: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """`argv` from the repository root, its output captured as text (kwargs: env, input)."""
    return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=timeout, **kwargs)


def run_python(args: list[str], timeout: int) -> dict:
    """`python *args` from the repository root; fails the test with the program's stderr tail."""
    out = run_in_repo([sys.executable, *args], timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return last_json_line(out.stdout)
