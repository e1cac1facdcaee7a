"""tfm against the libraries a researcher would pick instead, side by side, in one run.

Systems: tfm (cached greedy / beam search, jitted train step), tfm's own no-cache greedy loop,
PyTorch `nn.Transformer` (training; greedy without a cache), Hugging Face `MarianMTModel`
(training; `generate` greedy and beam) and CTranslate2 float32 (greedy and beam). Every system is
built from ONE set of random weights (tfm's initialisation, no downloads), runs the workloads of
`peers/workloads.py` in its own worker process, and the driver interleaves the systems round by
round (rotating the order) so that drifts of the machine hit all of them alike. Figures are
medians over every timed run. The JSON also holds:

  * the float32 matmul ceiling (best 2048^3 matmul through XLA and through torch) and, for each
    training figure, MFU = 3 x forward matmul FLOPs per step (`workloads.forward_flops`) /
    seconds per step / the higher ceiling;
  * each system's initial label-smoothed loss on the training batch without dropout (equal
    weights, so these must agree), and how often each decoder's output equals tfm's;
  * the ratios tfm / peer and the performance goals (goals.py) with whether each is met;
  * each system's peak resident memory per workload (its worker process, from set-up through
    the first run, the libraries it imported included).

    pip install -e '.[bench]'      # torch==2.13.0 (CPU), transformers, ctranslate2
    python benchmarks/compare.py [--workloads ...] [--rounds 5] [--out results.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from goals import judged as judged_goals  # noqa: E402
from peers.workloads import WORKLOADS, Workload, agreement, forward_flops  # noqa: E402

from tfm.cpu_host import host_memory  # noqa: E402

# system -> (worker process, module, constructor options)
SYSTEMS = {
    "tfm": ("tfm", "peers.tfm_system", {}),
    "tfm_uncached": ("tfm", "peers.tfm_system", {"cached": False}),
    "torch": ("torch", "peers.torch_system", {}),
    "hf": ("hf", "peers.hf_system", {}),
    "ct2": ("ct2", "peers.ct2_system", {}),
}
RUNS = {  # which systems run each kind of workload
    "train": ["tfm", "torch", "hf"],
    "greedy": ["tfm", "tfm_uncached", "torch", "hf", "ct2"],
    "beam": ["tfm", "hf", "ct2"],
}
LIBRARY_VERSIONS = {
    "tfm": ["jax", "jaxlib", "flax", "optax"],
    "torch": ["torch"],
    "hf": ["torch", "transformers"],
    "ct2": ["ctranslate2"],
}
INSTALL_HINT = "install the peers with: pip install -e '.[bench]'"


# --------------------------------------------------------------------------------------------
# Worker side: one process per library, JSON lines on stdin / a private copy of stdout.


def _reset_peak_memory() -> None:
    """Restart the kernel's peak-RSS count (VmHWM) of this process (Linux; else a no-op)."""
    try:
        with open("/proc/self/clear_refs", "w") as file:
            file.write("5")
    except OSError:
        pass


def _peak_rss_mb() -> float | None:
    """Peak resident memory since the last `_reset_peak_memory`, in MB (None off Linux)."""
    try:
        with open("/proc/self/status") as file:
            for line in file:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def _worker(kind: str) -> None:
    import importlib
    from importlib import metadata

    reply_stream = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything a library prints goes to stderr, never into the replies
    instances: dict[str, object] = {}

    def reply(**fields) -> None:
        reply_stream.write(json.dumps(fields) + "\n")

    def set_up(request: dict) -> dict:
        # a function, so that no local name keeps an instance alive after its "drop": the
        # next set-up's peak memory must not include the previous workload's instance
        _, module_name, options = SYSTEMS[request["system"]]
        module = importlib.import_module(module_name)
        w = WORKLOADS[request["workload"]]
        _reset_peak_memory()
        start = time.perf_counter()
        factory = module.Trainer if w.kind == "train" else module.Decoder
        instance = factory(w, request["weights"], **options)
        instance.run()  # compile / warm up, untimed
        instances[request["key"]] = instance
        return dict(
            setup_seconds=time.perf_counter() - start,
            initial_loss=getattr(instance, "initial_loss", None),
            peak_rss_mb=_peak_rss_mb(),
        )

    def timed_runs(request: dict) -> dict:
        instance = instances[request["key"]]
        seconds, output = [], None
        for _ in range(request["untimed"]):
            instance.run()
        for _ in range(request["times"]):
            start = time.perf_counter()
            output = instance.run()
            seconds.append(time.perf_counter() - start)
        return dict(seconds=seconds, output=None if output is None else output.tolist())

    versions = {}
    for package in LIBRARY_VERSIONS[kind]:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    try:
        for _, module, _ in (v for v in SYSTEMS.values() if v[0] == kind):
            importlib.import_module(module)
    except ImportError as error:
        reply(ok=False, error=f"{kind}: {error}; {INSTALL_HINT}")
        return
    reply(ok=True, versions=versions)

    for line in sys.stdin:
        request = json.loads(line)
        try:
            op = request["op"]
            if op == "quit":
                return
            if op == "ceiling":
                module = importlib.import_module(SYSTEMS[request["system"]][1])
                reply(ok=True, flops=module.matmul_ceiling())
            elif op == "export":
                module = importlib.import_module(SYSTEMS["tfm"][1])
                module.export_weights(WORKLOADS[request["workload"]], request["path"])
                reply(ok=True)
            elif op == "setup":
                reply(ok=True, **set_up(request))
            elif op == "run":
                reply(ok=True, **timed_runs(request))
            elif op == "drop":
                instances.pop(request["key"], None)
                import gc

                gc.collect()
                reply(ok=True)
            else:
                reply(ok=False, error=f"unknown op {op!r}")
        except Exception:  # report to the driver, which stops the run with the traceback
            reply(ok=False, error=traceback.format_exc())


# --------------------------------------------------------------------------------------------
# Driver side.


class Worker:
    def __init__(self, kind: str):
        self.kind = kind
        self.process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", kind],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        hello = self._read()
        self.versions = hello["versions"]

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.kind} worker exited (see its messages above)")
        message = json.loads(line)
        if not message.get("ok"):
            raise RuntimeError(f"{self.kind} worker: {message.get('error')}")
        return message

    def ask(self, **request) -> dict:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.process.stdin.flush()
                self.process.wait(timeout=30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.process.kill()


def _log(message: str) -> None:
    print(f"[compare {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def measure_workload(
    w: Workload, systems: list[str], workers: dict[str, Worker], weights: str, args
) -> dict:
    """Set every system up on the same weights, then time them round by round."""
    keys = {s: f"{w.name}/{s}" for s in systems}
    setup = {}
    for s in systems:
        _log(f"{w.name}: setting up {s}")
        setup[s] = workers[SYSTEMS[s][0]].ask(
            op="setup", key=keys[s], system=s, workload=w.name, weights=weights
        )
    times = {s: [] for s in systems}
    outputs = {}
    runs_per_round = args.train_runs if w.kind == "train" else args.decode_runs
    for round_index in range(args.rounds):
        shift = round_index % len(systems)
        for s in systems[shift:] + systems[:shift]:
            answer = workers[SYSTEMS[s][0]].ask(
                op="run", key=keys[s], untimed=args.round_warmup_runs, times=runs_per_round
            )
            times[s].extend(answer["seconds"])
            if answer["output"] is not None:
                outputs[s] = answer["output"]
        _log(
            f"{w.name}: round {round_index + 1}/{args.rounds} "
            + ", ".join(f"{s} {statistics.median(times[s]):.3f}s" for s in systems)
        )
    for s in systems:
        workers[SYSTEMS[s][0]].ask(op="drop", key=keys[s])

    result = {
        "shape": vars(w.shape) | {"head_dim": w.shape.head_dim},
        "batch": w.batch,
        "src_len": w.src_len,
        ("tgt_len" if w.kind == "train" else "new_tokens"): w.tgt_len,
        "systems": {},
    }
    if w.kind == "beam":
        result["beam_size"] = w.beam_size
    for s in systems:
        seconds = statistics.median(times[s])
        entry = {
            "median_seconds": round(seconds, 4),
            "tokens_per_second": round(w.tokens_per_run / seconds, 1),
            "runs": len(times[s]),
            "min_seconds": round(min(times[s]), 4),
            "max_seconds": round(max(times[s]), 4),
            "setup_seconds": round(setup[s]["setup_seconds"], 2),
            # the worker process's peak from this system's set-up through its first (untimed)
            # run, imported libraries included
            "peak_rss_mb": setup[s].get("peak_rss_mb"),
        }
        if w.kind == "train":
            flops = 3 * forward_flops(w.shape, w.batch, w.src_len, w.tgt_len)
            entry["achieved_gflops"] = round(flops / seconds / 1e9, 1)
            entry["mfu"] = round(flops / seconds / args.ceiling, 4)
            entry["initial_loss"] = round(setup[s]["initial_loss"], 5)
        result["systems"][s] = entry
    tfm_seconds = statistics.median(times["tfm"])
    result["ratios_tfm_over"] = {
        s: round(statistics.median(times[s]) / tfm_seconds, 3) for s in systems if s != "tfm"
    }
    if w.kind == "train":
        reference = setup["tfm"]["initial_loss"]
        result["initial_loss_max_abs_difference"] = max(
            abs(setup[s]["initial_loss"] - reference) for s in systems
        )
    else:
        result["agreement_with_tfm"] = {
            s: agreement(outputs["tfm"], outputs[s]) for s in systems if s != "tfm"
        }
    return result


def _real_file(workdir: str, data_dir: str) -> dict:
    """translate_file.py in its own process, before the other workloads (nothing else runs)."""
    _log(f"real file: translating the test split of {workdir}")
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "translate_file.py")
        command = [sys.executable, script, "--workdir", workdir, "--data_dir", data_dir]
        subprocess.run([*command, "--out", out.name], check=True, stdout=subprocess.DEVNULL)
        with open(out.name) as written:
            return json.load(written)


def _cpu() -> dict:
    """The CPU's model name and the vector ISAs that decide which matmul kernels the libraries
    pick (Linux /proc/cpuinfo; empty elsewhere): ratios between systems moved between hosts."""
    try:
        with open("/proc/cpuinfo") as file:
            first_cpu = file.read().split("\n\n")[0]
    except OSError:
        return {}
    fields = {}
    for line in first_cpu.splitlines():
        name, _, value = line.partition(":")
        fields[name.strip()] = value.strip()
    flags = fields.get("flags", "").split()
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
    return {
        "model_name": fields.get("model name", ""),
        "family_model_stepping": [fields.get(k) for k in ("cpu family", "model", "stepping")],
        "vector_isa": [flag for flag in wanted if flag in flags],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument(
        "--workloads", nargs="+", choices=sorted(WORKLOADS), default=list(WORKLOADS)
    )
    parser.add_argument("--systems", nargs="+", choices=sorted(SYSTEMS), default=list(SYSTEMS))
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--train_runs", type=int, default=2, help="training steps per round")
    parser.add_argument("--decode_runs", type=int, default=2, help="decodes per round")
    parser.add_argument(
        "--round_warmup_runs",
        type=int,
        default=1,
        help="untimed runs each system makes at the start of every round, so that its timed "
        "runs follow a run as in a training loop, not an idle pause (benchmarks/README.md: "
        "on a VM that hands freed memory back to its host, the first run after a pause pays "
        "to fault its buffers in again); 0 times the first run of each round too",
    )
    parser.add_argument(
        "--real_file",
        metavar="WORKDIR",
        help="also translate this trained workdir's test split with beam 4, text in and out "
        "(translate_file.py: tfm vs its CTranslate2 float32/int8 and Hugging Face exports)",
    )
    parser.add_argument("--real_file_data_dir", default="data", help="its prepared data")
    parser.add_argument(
        "--malloc_huge_pages",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run every worker with glibc.malloc.hugetlb=1, as train.py and decode.py run "
        "with --huge_page_malloc (tfm/cpu_host/host_memory.py); --no-malloc_huge_pages: "
        "glibc's defaults for every worker",
    )
    parser.add_argument("--out", help="also write the JSON to this file")
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker)
        return
    if "tfm" not in args.systems:
        parser.error("--systems must include tfm (every ratio is against it)")
    if args.malloc_huge_pages:  # every worker and translate_file.py inherit it alike
        os.environ.update(host_memory.environment_with_huge_page_malloc(os.environ))

    # first, before any worker starts: a wrong workdir or data dir fails in seconds
    real_file = _real_file(args.real_file, args.real_file_data_dir) if args.real_file else None
    kinds = sorted({SYSTEMS[s][0] for s in args.systems})
    workers: dict[str, Worker] = {}
    try:
        for kind in kinds:
            _log(f"starting the {kind} worker")
            workers[kind] = Worker(kind)
        ceilings = {"xla": workers["tfm"].ask(op="ceiling", system="tfm")["flops"]}
        if "torch" in workers:
            ceilings["torch"] = workers["torch"].ask(op="ceiling", system="torch")["flops"]
        args.ceiling = max(ceilings.values())
        results = {}
        with tempfile.TemporaryDirectory(prefix="tfm-compare-") as scratch:
            for name in args.workloads:
                w = WORKLOADS[name]
                weights = os.path.join(scratch, f"{name}.npz")
                workers["tfm"].ask(op="export", workload=name, path=weights)
                systems = [s for s in RUNS[w.kind] if s in args.systems]
                results[name] = measure_workload(w, systems, workers, weights, args)
    finally:
        for worker in workers.values():
            worker.close()

    if real_file is not None:
        results["real_file_beam4"] = real_file
    goals = judged_goals(results, real_file)
    versions = {}
    for worker in workers.values():
        versions.update(worker.versions)
    report = {
        "benchmark": "compare",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu": _cpu(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "transparent_huge_pages": host_memory.transparent_huge_pages_mode(),
            "GLIBC_TUNABLES (every worker)": os.environ.get("GLIBC_TUNABLES"),
        },
        "versions": versions,
        "dtype": "float32",
        "matmul_ceiling_gflops": {k: round(v / 1e9, 1) for k, v in ceilings.items()},
        "flop_formula": (
            "training FLOPs per step = 3 x forward matmul FLOPs (2 per multiply-add: Q/K/V/O "
            "projections, QK^T and weights x V, FFN, output layer; no embeddings, softmax or "
            "LayerNorm); MFU = that / seconds per step / the higher matmul ceiling"
        ),
        "timing": (
            f"{args.rounds} interleaved rounds, {args.train_runs} training steps or "
            f"{args.decode_runs} decodes per system per round, each system's timed runs "
            f"preceded by {args.round_warmup_runs} untimed run(s) in every round (and one "
            "untimed warm-up run after set-up); median over all timed runs; ratios = peer "
            "seconds / tfm seconds"
        ),
        "workloads": results,
        "goals": goals,
    }
    text = json.dumps(report, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
