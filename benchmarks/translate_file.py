"""A real file, end to end: translate a trained workdir's test split (text in, text out,
tokenization and batching included) with beam 4 through tfm (`tfm.inference.translate`, as
decode.py runs it) and through its CTranslate2 (float32, int8) and Hugging Face exports
(`tfm.export`), in interleaved rounds, and print JSON: sentences/s (median over rounds, and tfm's
first run with compilation counted separately) and each system's test-split sacreBLEU.

    pip install -e '.[export]'
    python benchmarks/translate_file.py --workdir workdirs/default [--rounds 3] [--out FILE]

tfm's first run, compilation included, is timed twice, each in a fresh process as a `decode.py`
run: with an empty persistent compilation cache (`tfm.compilation_cache`), then with the cache
that run left, as a second `decode.py` run finds it.

Beam search is not the same search in every system: tfm ranks hypotheses by GNMT's length
penalty (alpha 0.6), CTranslate2 and Hugging Face by log P / |Y| (their default), so their BLEU
may differ slightly; greedy outputs are identical (tests/test_export.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any, NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from worker_output import last_json_line  # noqa: E402

BEAM = 4


class LoadedForTranslation(NamedTuple):
    loaded: Any  # a tfm.job.workdir.Loaded, as decode.py loads it (imported lazily, after jax)
    translate: Callable[[list[str]], list[str]]  # lines -> translations, as decode.py runs it
    checkpoints_averaged: int  # those the workdir's final evaluation averaged
    pairs: list[tuple[str, str]]  # the split's (source, reference) pairs


def _tfm(workdir: str, data_dir: str, split: str, limit: int) -> LoadedForTranslation:
    """The workdir's model and its split, checked to be the data the workdir was trained on."""
    import jax

    from tfm.data.prepare import prepare
    from tfm.inference import translate
    from tfm.job.workdir import load, scored_average

    average = scored_average(workdir)
    loaded = load(workdir, average=average)
    data = prepare(loaded.card.dataset, data_dir, loaded.model.config.vocab_size)
    # the split's text is what must match (each system tokenizes it with its own copy of the
    # workdir's vocabulary); cards from before fingerprints have none to compare
    trained_on = loaded.card.dataset_fingerprint
    if trained_on and trained_on != data.dataset_fingerprint:
        raise SystemExit(
            f"{data_dir} holds other {loaded.card.dataset} data than {workdir} was trained on"
        )
    pairs = data.texts(split)[: limit or None]
    params = jax.device_put(loaded.params)
    config = translate.TranslateConfig(beam_size=BEAM)

    def tfm_translate(lines):
        return translate.translate(loaded.model, params, loaded.tokenizer, lines, config)

    return LoadedForTranslation(loaded, tfm_translate, average, pairs)


def _systems(workdir: str, tfm_translate, average: int, exported: str, threads: int, hf_batch: int):
    """name -> function(list of source lines) -> list of translations."""
    import ctranslate2
    import sentencepiece as spm
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from tfm.export.__main__ import main as export

    for target in ("ct2", "hf"):
        averaged = ["--average", str(average)]
        if export([target, workdir, os.path.join(exported, target), *averaged]) != 0:
            raise SystemExit(f"exporting {workdir} to {target} failed")
    sp = spm.SentencePieceProcessor(model_file=os.path.join(exported, "ct2", "sentencepiece.model"))

    def ct2_system(compute_type):
        translator = ctranslate2.Translator(
            os.path.join(exported, "ct2"),
            device="cpu",
            compute_type=compute_type,
            inter_threads=1,
            intra_threads=threads,
        )

        def run(lines):
            pieces = [sp.encode(line, out_type=str) for line in lines]
            results = translator.translate_batch(
                pieces,
                beam_size=BEAM,
                max_batch_size=32,
                batch_type="examples",
                max_decoding_length=256,
            )
            return [sp.decode(r.hypotheses[0]) for r in results]

        return run

    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(exported, "hf"))
    model = AutoModelForSeq2SeqLM.from_pretrained(os.path.join(exported, "hf")).eval()

    @torch.inference_mode()
    def hf_translate(lines):
        # sorted by length so that batches pad little, as tfm and CTranslate2 do
        order = sorted(range(len(lines)), key=lambda i: len(lines[i]))
        texts = [None] * len(lines)
        for start in range(0, len(order), hf_batch):
            chunk = order[start : start + hf_batch]
            batch = tokenizer([lines[i] for i in chunk], return_tensors="pt", padding=True)
            # 256 new tokens; max_length counts the start token (max_new_tokens would conflict
            # with the export's max_length, and Transformers would warn on every call)
            generated = model.generate(**batch, num_beams=BEAM, max_length=257)
            for i, text in zip(
                chunk, tokenizer.batch_decode(generated, skip_special_tokens=True), strict=True
            ):
                texts[i] = text
        return texts

    return {
        "tfm": tfm_translate,
        "ct2_float32": ct2_system("float32"),
        "ct2_int8": ct2_system("int8"),
        "hf_generate": hf_translate,
    }


def _first_run(workdir: str, data_dir: str, split: str, limit: int, cache: str) -> None:
    """In a fresh process: load, enable the persistent compilation cache at `cache`, and print
    the seconds of the first `tfm.inference.translate` of the split (JSON on the last line)."""
    from tfm import compilation_cache

    compilation_cache.enable(cache)
    tfm = _tfm(workdir, data_dir, split, limit)
    start = time.perf_counter()
    tfm.translate([source for source, _ in tfm.pairs])
    print(json.dumps(dict(seconds=time.perf_counter() - start)))


def _first_runs(args) -> dict[str, float]:
    """tfm's first run in a fresh process, with an empty compilation cache and then with the
    one that run wrote."""
    import subprocess

    seconds = {}
    with tempfile.TemporaryDirectory(prefix="tfm-jax-cache-") as cache:
        for name in ("empty_cache", "cache_from_a_previous_run"):
            command = [
                sys.executable, __file__, "--first_run_in", cache, "--workdir", args.workdir,
                "--data_dir", args.data_dir, "--split", args.split, "--limit", str(args.limit),
            ]  # fmt: skip
            done = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True)
            seconds[name] = last_json_line(done.stdout)["seconds"]
            print(f"tfm first run, {name}: {seconds[name]:.1f} s", file=sys.stderr)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--workdir", default="workdirs/default")
    parser.add_argument("--data_dir", default="data")
    parser.add_argument("--split", default="test")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--limit", type=int, default=0, help="first N sentences only (0 = all)")
    parser.add_argument("--hf_batch", type=int, default=32)
    parser.add_argument("--out")
    parser.add_argument("--first_run_in", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.first_run_in:
        _first_run(args.workdir, args.data_dir, args.split, args.limit, args.first_run_in)
        return
    first_runs = _first_runs(args)
    from tfm.inference.translate import score

    threads = len(os.sched_getaffinity(0))
    tfm = _tfm(args.workdir, args.data_dir, args.split, args.limit)
    sources, references = [s for s, _ in tfm.pairs], [t for _, t in tfm.pairs]
    with tempfile.TemporaryDirectory(prefix="tfm-export-") as exported:
        systems = _systems(
            args.workdir,
            tfm.translate,
            tfm.checkpoints_averaged,
            exported,
            threads,
            args.hf_batch,
        )
        seconds: dict[str, list[float]] = {name: [] for name in systems}
        outputs: dict[str, list[str]] = {"tfm": systems["tfm"](sources)}  # compiles, untimed
        names = list(systems)
        for round_index in range(args.rounds):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                start = time.perf_counter()
                outputs[name] = systems[name](sources)
                seconds[name].append(time.perf_counter() - start)
                print(f"round {round_index + 1} {name}: {seconds[name][-1]:.1f} s", file=sys.stderr)
    target_language = tfm.loaded.card.target_language
    result = dict(
        date=datetime.datetime.now().isoformat(timespec="seconds"),
        machine=dict(
            platform=platform.platform(),
            cores=threads,
            GLIBC_TUNABLES=os.environ.get("GLIBC_TUNABLES"),
        ),
        workdir=args.workdir,
        parameters=tfm.loaded.description,
        split=args.split,
        sentences=len(sources),
        beam_size=BEAM,
        rounds=args.rounds,
        note="sentences/s: median over rounds, text in and text out; sacreBLEU on the split",
        # a fresh process each, as decode.py: an empty persistent compilation cache, then the
        # cache that first process wrote
        tfm_first_run_seconds_with_compilation=first_runs["empty_cache"],
        tfm_first_run_seconds_with_cache_from_a_previous_run=first_runs[
            "cache_from_a_previous_run"
        ],
        systems={
            name: dict(
                seconds=times,
                median_seconds=statistics.median(times),
                sentences_per_second=len(sources) / statistics.median(times),
                sacrebleu=score(outputs[name], references, target_language)["sacrebleu"]["score"],
                identical_to_tfm=sum(
                    a == b for a, b in zip(outputs[name], outputs["tfm"], strict=True)
                )
                / len(sources),
            )
            for name, times in seconds.items()
        },
    )
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text + "\n")


if __name__ == "__main__":
    from tfm.cpu_host import host_memory

    host_memory.restart_with_huge_page_malloc()  # as decode.py runs: tfm/host_memory.py
    main()
