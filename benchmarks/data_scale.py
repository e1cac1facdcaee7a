"""Data at scale: prepare a WMT-like corpus of N pairs and serve it, in bounded memory.

Generates the corpus (`benchmarks/wmt_like.py`, seeded; kept under --workdir for reuse), then
1. prepares it from scratch with `python -m tfm.data.prepare` (vocabulary + id cache) on every
   core, sampling the resident memory of the whole process tree (main + workers) every 0.2 s;
2. rebuilds only the id cache (the vocabulary kept) on all cores and again pinned to one core
   with one worker: the multi-core speed-up of reading + encoding;
3. starts a training-side reader (prepare finds every cache, then `BatchPipeline` over the train
   split at --batch_tokens) and reports its memory (peak, and private vs shared file pages)
   and batch assembly speed over --batches batches twice: first as the pages of the id cache
   are faulted in, then in steady state.
Prints one JSON object.

    python benchmarks/data_scale.py --pairs 1000000 --workdir /tmp/data_scale
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import wmt_like  # noqa: E402


def _children(pid: int) -> list[int]:
    found = []
    for task in pathlib.Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(c) for c in task.read_text().split()]
        except OSError:
            continue
    return found


def _tree_rss_kb(root: int) -> tuple[int, int]:
    """(sum of VmRSS over the process tree, VmRSS of the root), in kB."""
    total = own = 0
    stack = [root]
    while stack:
        pid = stack.pop()
        try:
            status = pathlib.Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        lines = status.splitlines()
        rss = next((int(line.split()[1]) for line in lines if line.startswith("VmRSS")), 0)
        total += rss
        own = rss if pid == root else own
        stack += _children(pid)
    return total, own


def _run_sampled(command: list[str], cores: list[int] | None = None) -> dict:
    """Run `command`, sampling its process tree's memory; wall time, peaks and its stdout."""

    def pin():
        if cores is not None:
            os.sched_setaffinity(0, cores)

    start = time.perf_counter()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=pin, cwd=ROOT
    )
    peak_tree = peak_main = 0
    while process.poll() is None:
        tree, own = _tree_rss_kb(process.pid)
        peak_tree, peak_main = max(peak_tree, tree), max(peak_main, own)
        time.sleep(0.2)
    stdout, stderr = process.communicate()
    seconds = time.perf_counter() - start
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{stderr[-3000:]}")
    return dict(
        seconds=round(seconds, 1),
        peak_rss_mb_all_processes=round(peak_tree / 1024),
        peak_rss_mb_main_process=round(peak_main / 1024),
        stdout=stdout,
    )


def _prepare_command(spec: str, data_dir: pathlib.Path, vocab_size: int, workers: int) -> list:
    return [
        sys.executable, "-m", "tfm.data.prepare", spec, "--data_dir", str(data_dir),
        "--vocab_size", str(vocab_size), "--workers", str(workers),
    ]  # fmt: skip


READER = """
import json, sys, time
import numpy as np

def status():
    fields = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) // 1024
    return fields

from tfm.data import batching, pipeline
from tfm.data.prepare import prepare
from tfm.tokens import PAD_ID
baseline = status()
spec, data_dir, vocab_size, batch_tokens, batches = sys.argv[1:6]
start = time.perf_counter()
data = prepare(spec, data_dir, int(vocab_size))
prepare_seconds = time.perf_counter() - start
assert set(data.caches.values()) == {"reused"}, data.caches
config = batching.BatchConfig(batch_tokens=int(batch_tokens), max_seq_len=256)
start = time.perf_counter()
pipe = pipeline.BatchPipeline(data.ids["train"], config)
iterator = pipe.iterator()
next(iterator)
plan_seconds = time.perf_counter() - start
speeds = []
for _ in range(2):  # the first pass faults the cache's pages in; the second is steady state
    real = 0
    start = time.perf_counter()
    for _ in range(int(batches)):
        batch = next(iterator)
        real += int((batch["tgt_out"] != PAD_ID).sum())
    speeds.append(round(real / (time.perf_counter() - start)))
print(json.dumps(dict(
    baseline_mb=baseline, end_mb=status(), check_seconds=round(prepare_seconds, 1),
    plan_seconds=round(plan_seconds, 2), batches=int(batches), batches_per_epoch=len(pipe.plan(0)),
    target_tokens_per_second_first_batches=speeds[0], target_tokens_per_second=speeds[1],
)))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, required=True)
    parser.add_argument("--workdir", default="/tmp/tfm-data-scale")
    parser.add_argument("--vocab_size", type=int, default=32000)
    parser.add_argument("--batch_tokens", type=int, default=25000)
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--skip_one_core", action="store_true", help="skip step 2's 1-core run")
    parser.add_argument("--skip_ids_only", action="store_true", help="skip step 2 altogether")
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    workdir = pathlib.Path(args.workdir)
    corpus_dir = workdir / f"corpus-{args.pairs}"
    if not (corpus_dir / "done").is_file():
        start = time.perf_counter()
        wmt_like.write_corpus(args.pairs, corpus_dir)
        (corpus_dir / "done").write_text(f"{time.perf_counter() - start:.1f}")
    spec = f"text:{corpus_dir / 'src.txt'},{corpus_dir / 'tgt.txt'}"
    data_dir = workdir / f"data-{args.pairs}"
    shutil.rmtree(data_dir, ignore_errors=True)

    cold = _run_sampled(_prepare_command(spec, data_dir, args.vocab_size, len(cores)))
    summary = json.loads(cold.pop("stdout"))
    ids_dir = data_dir / "ids"
    cache_bytes = sum(p.stat().st_size for p in ids_dir.rglob("*.npy"))
    runs = {}
    for name, run_cores in (("all_cores", cores), ("one_core", cores[:1])):
        if args.skip_ids_only or (name == "one_core" and args.skip_one_core):
            continue
        shutil.rmtree(ids_dir)
        command = _prepare_command(spec, data_dir, args.vocab_size, len(run_cores))
        runs[name] = _run_sampled(command, run_cores)
        runs[name].pop("stdout")
    reader = _run_sampled(
        [sys.executable, "-c", READER, spec, str(data_dir), str(args.vocab_size),
         str(args.batch_tokens), str(args.batches)]
    )  # fmt: skip
    reader_report = json.loads(reader.pop("stdout"))
    train_pairs = summary["pairs"]["train"]
    report = dict(
        benchmark="data_scale",
        pairs=args.pairs,
        pairs_by_split=summary["pairs"],
        vocab_size=summary["vocab_size"],
        cores=len(cores),
        machine=platform.processor() or platform.machine(),
        corpus_bytes=sum((corpus_dir / f).stat().st_size for f in ("src.txt", "tgt.txt")),
        id_cache_bytes=cache_bytes,
        id_cache_bytes_per_pair=round(cache_bytes / args.pairs, 1),
        prepare_from_scratch=dict(cold, pairs_per_second=round(args.pairs / cold["seconds"])),
        prepare_ids_only={
            name: dict(run, pairs_per_second=round(args.pairs / run["seconds"]))
            for name, run in runs.items()
        },
        reader=dict(
            reader_report,
            peak_rss_mb=reader_report["end_mb"]["VmHWM"],
            peak_rss_mb_per_million_train_pairs=round(
                reader_report["end_mb"]["VmHWM"] / (train_pairs / 1e6), 1
            ),
            private_rss_mb_above_imports=reader_report["end_mb"]["RssAnon"]
            - reader_report["baseline_mb"]["RssAnon"],
            seconds_including_start=reader["seconds"],
        ),
        notes=(
            "peak_rss_mb_all_processes sums VmRSS over the process tree (shared library pages "
            "counted once per process: an upper bound); reader RssFile is the id cache's "
            "page-cache pages, shared by every process on the host"
        ),
    )
    if "one_core" in runs:
        report["speedup_all_cores_vs_one"] = round(
            runs["one_core"]["seconds"] / runs["all_cores"]["seconds"], 2
        )
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
