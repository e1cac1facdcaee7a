"""The benchmarks that time a program in a fresh process of its own (core_scaling.py,
translate_file.py) run their own script as that worker; the worker prints its logs first and
its measurement as one JSON object on its last line."""

from __future__ import annotations

import json


def last_json_line(stdout: str) -> dict:
    """The worker's measurement: the JSON object on the last line of its output."""
    return json.loads(stdout.strip().splitlines()[-1])
