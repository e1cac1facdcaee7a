"""Where a tfm program spends its time: a `jax.profiler` trace of a few runs of one workload of
`peers/workloads.py`, summed per compiled HLO op and mapped back to the model code through the
`op_name` metadata of the optimised HLO. Prints one JSON object: op time per run, op count per
run, the top ops (shape, source) and the time per source category (matmul or not, by the
innermost Flax module / function named in `op_name`). The profiles behind the speed pass of
`benchmarks/README.md` were read this way.

    python benchmarks/profile_ops.py --workload train_small [--runs 3] [--top 25]

Op times of concurrently running ops overlap, so their sum can exceed the wall time.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import jax  # noqa: E402
from peers import tfm_system  # noqa: E402
from peers.workloads import WORKLOADS  # noqa: E402

# Runtime bookkeeping events in the trace, not HLO ops.
NOT_OPS = ("ThunkExecutor", "$", "SlinkyThreadPool", "PjitFunction")
MATMUL = re.compile(r"^(ynn_fusion|xnn_fusion|dot|onednn|custom-call.*gemm)")


def hlo_ops(text: str) -> dict[str, tuple[str, str]]:
    """HLO op name -> (result shape, op_name metadata) for every instruction that has metadata."""
    pattern = re.compile(r'^\s*(?:ROOT )?%(\S+) = (\S+) [^\n]*?op_name="([^"]*)"', re.M)
    return {m.group(1): (m.group(2), m.group(3)) for m in pattern.finditer(text)}


def source(op_name: str) -> str:
    """The innermost module or function of an `op_name` path: `.../decoder_1/feed_forward/inner/
    dot_general` -> `feed_forward/inner`; transformation wrappers and layer indices dropped."""
    wrappers = ("jit(", "jvp(", "transpose(", "while", "body", "closed_call", "checkpoint")
    parts = [p for p in op_name.split("/") if p and not p.startswith(wrappers) and "->" not in p]
    parts = [re.sub(r"_\d+$", "", p.split(".")[-1]) for p in parts[:-1]]  # drop the primitive
    return "/".join(parts[-2:]) if parts else "?"


def traced_ops(run, runs: int = 1) -> tuple[collections.Counter, collections.Counter, float]:
    """Trace `runs` calls of `run()`: milliseconds and calls per run of each HLO op, and the wall
    seconds per run."""
    with tempfile.TemporaryDirectory(prefix="tfm-profile-") as directory:
        jax.profiler.start_trace(directory)
        start = time.perf_counter()
        for _ in range(runs):
            run()
        wall = (time.perf_counter() - start) / runs
        jax.profiler.stop_trace()
        (trace,) = glob.glob(f"{directory}/**/*.trace.json.gz", recursive=True)
        with gzip.open(trace) as f:
            events = json.load(f)["traceEvents"]
    durations, counts = collections.Counter(), collections.Counter()
    for event in events:
        if event.get("ph") == "X" and "dur" in event and not event["name"].startswith(NOT_OPS):
            durations[event["name"]] += event["dur"] / 1e3 / runs
            counts[event["name"]] += 1 / runs
    return durations, counts, wall


def profile(workload: str, runs: int) -> tuple[dict, dict, float]:
    w = WORKLOADS[workload]
    system = (tfm_system.Trainer if w.kind == "train" else tfm_system.Decoder)(w, None)
    system.run()
    system.run()
    text = system.compiled_text()
    durations, counts, wall = traced_ops(system.run, runs)
    return {"durations": durations, "counts": counts}, hlo_ops(text), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="train_small")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    trace, ops, wall = profile(args.workload, args.runs)
    durations, counts = trace["durations"], trace["counts"]
    categories = collections.Counter()
    top = []
    for name, ms in durations.most_common():
        shape, op_name = ops.get(name, ("?", "?"))
        kind = "matmul" if MATMUL.match(name) else "other"
        categories[f"{kind}: {source(op_name)}"] += ms
        if len(top) < args.top:
            top.append(
                dict(
                    op=name,
                    ms_per_run=round(ms, 2),
                    per_run=round(counts[name], 1),
                    shape=shape,
                    source=op_name[-120:],
                )
            )
    report = dict(
        benchmark="profile_ops",
        workload=args.workload,
        runs=args.runs,
        wall_ms_per_run=round(wall * 1e3, 1),
        op_ms_per_run=round(sum(durations.values()), 1),
        ops_per_run=round(sum(counts.values())),
        matmul_ms_per_run=round(sum(v for k, v in categories.items() if k[:6] == "matmul"), 1),
        categories={k: round(v, 1) for k, v in categories.most_common(args.top)},
        top_ops=top,
    )
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
