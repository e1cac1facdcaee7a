"""tfm.cpu_host.host_memory: a process restarted with glibc's huge-page malloc faults in a train
step's scratch buffer in 2 MiB pages instead of 4 KiB ones (counted by the kernel: minor page
faults), without holding more memory than glibc's defaults; memory freed into the heap can be handed
back to the system."""

import mmap
import os
import statistics
import subprocess
import sys
import textwrap

import pytest

from tests.subprocess_json import ROOT, last_json_line
from tfm.cpu_host import host_memory

PROGRAM = textwrap.dedent(
    """
    import json, os, resource, sys
    from tfm.cpu_host import host_memory
    if sys.argv[1] == "huge_pages":
        host_memory.restart_with_huge_page_malloc()
    import functools
    import jax, jax.numpy as jnp, numpy as np
    from tfm import ModelConfig, Transformer, training

    # a large vocabulary: the [2048, 16000] logits and their gradient make ~400 MB of scratch
    config = ModelConfig(vocab_size=16000, num_layers=1, d_model=32, d_ff=64, num_heads=4,
                         d_k=8, d_v=8, dropout_rate=0.0)
    model = Transformer(config)
    optimizer = training.make_optimizer(training.TrainConfig(), config.d_model)
    ids = np.random.default_rng(0).integers(4, config.vocab_size, (32, 64))
    batch = {k: jnp.asarray(ids, jnp.int32) for k in ("src", "tgt_in", "tgt_out")}
    state = training.init_train_state(model, optimizer, jax.random.key(0), batch)
    step = jax.jit(functools.partial(training.train_step, model=model, optimizer=optimizer,
                                     smoothing=0.1), donate_argnums=0)
    temp = step.lower(state, batch).compile().memory_analysis().temp_size_in_bytes
    faults = []
    for _ in range(8):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(dict(pid=os.getpid(), tunables=os.environ.get("GLIBC_TUNABLES"),
                          temp_pages=temp / 4096, faults=faults[2:], peak_mb=peak_kb / 1024)))
    """
)


def _run(mode: str, environment: dict[str, str]) -> dict:
    process = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, mode],
        stdout=subprocess.PIPE,
        text=True,
        env=environment,
        cwd=ROOT,
    )
    out, _ = process.communicate(timeout=300)
    assert process.returncode == 0
    result = last_json_line(out)
    result["started_pid"] = process.pid
    return result


def _anonymous_huge_pages_kb() -> int:
    with open("/proc/self/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0


def _kernel_gives_huge_pages_on_request() -> bool:
    """Whether a 64 MiB anonymous mapping advised MADV_HUGEPAGE is backed by huge pages once
    touched (the kernel may have none free), independently of glibc."""
    size = 64 << 20
    before = _anonymous_huge_pages_kb()
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(mmap.MADV_HUGEPAGE)
        for offset in range(0, size, 4096):
            region[offset] = 1
        return _anonymous_huge_pages_kb() - before >= (size >> 10) // 2
    finally:
        region.close()


def test_the_tunable_is_added_to_the_environment_without_dropping_others():
    add = host_memory.environment_with_huge_page_malloc
    assert add({})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    merged = add({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "HOME": "/h"})
    assert merged == {
        "GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1",
        "HOME": "/h",
    }
    chosen = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}
    assert add(chosen) == chosen  # a value the user chose is theirs


def test_the_transparent_huge_page_mode_is_the_bracketed_word(tmp_path):
    enabled = tmp_path / "enabled"
    enabled.write_text("always [madvise] never\n")
    assert host_memory.transparent_huge_pages_mode(str(enabled)) == "madvise"
    assert host_memory.transparent_huge_pages_mode(str(tmp_path / "missing")) is None


@pytest.mark.skipif(
    not host_memory.huge_page_malloc_can_help(),
    reason="needs glibc >= 2.35 and transparent huge pages on request (THP 'madvise')",
)
def test_a_restarted_train_step_faults_its_scratch_in_huge_pages_and_holds_no_more_memory():
    if not _kernel_gives_huge_pages_on_request():
        pytest.skip("the kernel has no huge pages to give right now")
    environment = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    default = _run("default", environment)
    if statistics.median(default["faults"]) < 0.5 * default["temp_pages"]:
        pytest.skip("this C library already reuses XLA's scratch buffer; nothing to change")
    huge = _run("huge_pages", environment)
    assert huge["pid"] == huge["started_pid"]  # restarted in place: same process, same pid
    assert huge["tunables"] == "glibc.malloc.hugetlb=1"
    assert huge["temp_pages"] > 10_000  # large enough to have been mmapped
    # every page of the scratch in 2 MiB pages would be ~1/512 of the faults; the kernel may
    # back only part of it with huge pages when few are free (a median of 5.9% was seen), so
    # the bound asks for 4x fewer faults than 4 KiB pages, which glibc's defaults never give
    assert statistics.median(huge["faults"]) < 0.25 * huge["temp_pages"], (default, huge)
    assert huge["peak_mb"] < 1.1 * default["peak_mb"] + 50, (default, huge)


def _resident_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(host_memory.glibc_version() is None, reason="malloc_trim is glibc's")
def test_freed_heap_memory_goes_back_to_the_system():
    import ctypes

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    # 160 MB in 64 KiB blocks (below malloc's mmap threshold: they live in the heap), touched;
    # the last block stays allocated so that freeing the others cannot shrink the heap's top
    blocks = [libc.malloc(64 << 10) for _ in range(2560)]
    assert all(blocks)
    for block in blocks:
        ctypes.memset(block, 1, 64 << 10)
    for block in blocks[:-1]:
        libc.free(block)
    held = _resident_mb()
    returned = host_memory.return_freed_memory()
    released = held - _resident_mb()
    libc.free(blocks[-1])
    assert returned
    assert released > 100, f"resident memory fell by {released:.0f} MB only"


ASKING = textwrap.dedent(
    """
    import json, os, sys
    if sys.argv[1] == "notebook":
        sys.modules["IPython"] = type(sys)("IPython")  # as inside a Jupyter kernel's %run
    from tfm.cpu_host import host_memory
    host_memory.restart_if_asked("--huge_page_malloc", sys.argv[2:])
    with open("/proc/self/environ", "rb") as environ:  # what this process started with
        started = [v.decode() for v in environ.read().split(b"\\0") if v]
    print(json.dumps(dict(
        pid=os.getpid(),
        started_with=[v for v in started if v.startswith("GLIBC_TUNABLES=")],
        children_get=os.environ.get("GLIBC_TUNABLES"),
    )))
    """
)


@pytest.mark.skipif(
    not host_memory.huge_page_malloc_can_help(),
    reason="needs glibc >= 2.35 and transparent huge pages on request (THP 'madvise')",
)
@pytest.mark.parametrize(
    ("mode", "argv", "ask", "restarts"),
    [
        ("script", [], None, False),  # not asked: no surprise
        ("script", ["--huge_page_malloc"], None, True),
        ("script", [], "1", True),
        ("notebook", ["--huge_page_malloc"], "1", False),  # never inside a kernel
    ],
)
def test_the_command_lines_restart_only_when_asked(mode, argv, ask, restarts):
    environment = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    environment.pop(host_memory.ASK_VARIABLE, None)
    if ask:
        environment[host_memory.ASK_VARIABLE] = ask
    process = subprocess.run(
        [sys.executable, "-c", ASKING, mode, *argv],
        capture_output=True,
        text=True,
        env=environment,
        cwd=ROOT,
        timeout=120,
    )
    assert process.returncode == 0, process.stderr
    result = last_json_line(process.stdout)
    expected = ["GLIBC_TUNABLES=glibc.malloc.hugetlb=1"] if restarts else []
    assert result["started_with"] == expected  # what glibc's malloc read
    assert result["children_get"] is None  # the tunable does not leak into child processes
    if mode == "notebook":
        assert "not restarting" in process.stderr
