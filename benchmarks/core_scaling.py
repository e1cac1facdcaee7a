"""How tfm's decoding uses the cores: one process on all of them (XLA splits each op across its
intra-op threads) against one process per core, each pinned to its core with the whole batch,
all at once (no op is split; the cores run independent programs). Prints one JSON object:
tokens/s of each, the aggregate of the pinned processes, and their ratio.

    python benchmarks/core_scaling.py [--workload beam4_small] [--runs 8]

Round sixteen (benchmarks/README.md): on a 2-core AMD EPYC the pinned processes together decoded
~1.4x the tokens/s of one process on both cores. Linux only (`os.sched_setaffinity`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from peers.workloads import WORKLOADS  # noqa: E402  (numpy only: the worker imports jax later)
from worker_output import last_json_line  # noqa: E402

DECODING_WORKLOADS = sorted(name for name, w in WORKLOADS.items() if w.kind != "train")


def _decode(workload: str, runs: int) -> dict:
    """Time `runs` decodes of the workload's batch in this process (as compare.py's tfm)."""
    import numpy as np
    from peers import tfm_system

    w = WORKLOADS[workload]
    decoder = tfm_system.Decoder(w, weights_path="")
    ids = decoder.run()  # compiles
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        decoder.run()
        seconds.append(time.perf_counter() - start)
    median = statistics.median(seconds)
    return dict(
        cores=sorted(os.sched_getaffinity(0)),
        median_seconds=round(median, 4),
        tokens_per_second=round(w.tokens_per_run / median, 1),
        # every process decodes the same batch: equal ids say the pinned ones did the same work
        ids_sha256=hashlib.sha256(np.ascontiguousarray(ids, np.int32).tobytes()).hexdigest()[:16],
    )


def _worker_command(workload: str, runs: int) -> list[str]:
    return [sys.executable, __file__, "--worker", "--workload", workload, "--runs", str(runs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", default="beam4_small", choices=DECODING_WORKLOADS)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_decode(args.workload, args.runs)))
        return
    cores = sorted(os.sched_getaffinity(0))
    command = _worker_command(args.workload, args.runs)
    shared = last_json_line(
        subprocess.run(command, capture_output=True, text=True, check=True).stdout
    )
    pinned = [
        subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=lambda core=core: os.sched_setaffinity(0, {core}),
        )
        for core in cores
    ]
    per_core = [last_json_line(p.communicate()[0]) for p in pinned]
    together = sum(r["tokens_per_second"] for r in per_core)
    print(
        json.dumps(
            dict(
                benchmark="core_scaling",
                workload=args.workload,
                date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                one_process_all_cores=shared,
                one_process_per_core=per_core,
                per_core_together_tokens_per_second=round(together, 1),
                same_ids=len({r["ids_sha256"] for r in [shared, *per_core]}) == 1,
                ratio_per_core_over_all_cores=round(together / shared["tokens_per_second"], 3),
            )
        )
    )


if __name__ == "__main__":
    main()
