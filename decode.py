"""The command line of translation (`tfm.inference.translate`) from a workdir that train.py wrote:
translate files or stdin, score BLEU, and draw attention maps.

    python decode.py --workdir DIR [--input FILE] [--output FILE] [--reference FILE]
                     [--step N | --average N] [--beam_size 4] [--alpha 0.6]
    python decode.py --workdir DIR --plot_attention OUT.png "A sentence to translate."

Input is one sentence per line, split on LF only (stdin by default); translations are written
in input order as they are done, to an output opened before any work.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import math
import pathlib
import sys

if __name__ == "__main__":  # first thing, and only when asked: see tfm/cpu_host/host_memory.py
    from tfm.cpu_host import host_memory

    host_memory.restart_if_asked("--huge_page_malloc")

from tfm.data.corpus import decode_lines  # noqa: E402
from tfm.inference.translate import TranslateConfig  # noqa: E402

DEFAULTS = TranslateConfig()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workdir", required=True, help="the directory train.py wrote")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, help="restore this checkpoint step")
    which.add_argument(
        "--average",
        type=int,
        default=5,
        help="average the last N checkpoints (section 6.1; default 5; 1 = latest)",
    )
    parser.add_argument("--input", default="-", help="source sentences, one per line ('-' = stdin)")
    parser.add_argument("--output", default="-", help="translations ('-' = stdout)")
    parser.add_argument(
        "--reference", help="reference translations: print sacreBLEU and the paper's tokenized BLEU"
    )
    parser.add_argument("--beam_size", type=int, default=DEFAULTS.beam_size, help="1 = greedy")
    parser.add_argument(
        "--alpha", type=float, default=DEFAULTS.alpha, help="length penalty exponent"
    )
    parser.add_argument(
        "--extra_length",
        type=int,
        default=DEFAULTS.extra_length,
        help="maximum output length = source length + this",
    )
    parser.add_argument(
        "--batch_tokens",
        type=int,
        default=None,
        help="padded source tokens x beams per batch (default: 1024 on CPU, 4096 on GPU/TPU)",
    )
    parser.add_argument(
        "--streams",
        type=int,
        default=None,
        help="searches run side by side: beam search's streams per length bucket, greedy "
        "search's batches of a bucket (default: 2 on a CPU of 2 or more cores, 1 on GPU/TPU); "
        "translations do not depend on it",
    )
    parser.add_argument(
        "--overlong",
        choices=("truncate", "error"),
        default=DEFAULTS.overlong,
        help="lines longer than the model's max_positions: truncate with a warning or stop",
    )
    parser.add_argument(
        "--plot_attention",
        metavar="OUT.png",
        help="draw attention heatmaps for SENTENCE into OUT.png",
    )
    parser.add_argument(
        "--encoding_errors",
        choices=("strict", "replace"),
        default="strict",
        help="invalid UTF-8 in the input: stop naming the line, or replace it and count",
    )
    parser.add_argument(
        "--compilation_cache_dir",
        default=None,
        help="persistent JAX compilation cache, so a second run compiles nothing (default: "
        "$TFM_COMPILATION_CACHE or ~/.cache/tfm/jax; '' = off)",
    )
    parser.add_argument(
        "--kernels",
        choices=("auto", "reference", "xla_cpu"),
        default="auto",
        help="the operations a backend kit may replace (tfm.implementation): the XLA:CPU kit on "
        "the CPU and Flax's and JAX's own ops elsewhere (auto), or one of them everywhere; "
        "translations do not depend on it",
    )
    parser.add_argument(
        "--huge_page_malloc",
        action="store_true",
        help="restart once with glibc's malloc asking for transparent huge pages (faster XLA:CPU "
        "programs with large scratch buffers; Linux, glibc >= 2.35; also TFM_HUGE_PAGE_MALLOC=1)",
    )
    parser.add_argument("sentence", nargs="?", help="the sentence for --plot_attention")
    return parser


def read_lines(data: bytes, where: str, encoding_errors: str) -> tuple[list[str], int]:
    """One sentence per line (`tfm.data.corpus.decode_lines`: LF only, so a lone CR stays inside
    its line); invalid UTF-8 raises ValueError naming the line, or is replaced. Returns the lines
    and how many had bytes replaced."""
    counts: collections.Counter = collections.Counter()
    lines = decode_lines(
        data, where, encoding_errors, counts, remedy="pass --encoding_errors replace"
    )
    return lines, counts["lines_with_invalid_utf8_replaced"]


def _check_numbers(args) -> None:
    """Every numeric option, before anything is loaded."""
    checks = [
        ("--beam_size", args.beam_size, args.beam_size >= 1, "at least 1"),
        ("--extra_length", args.extra_length, args.extra_length >= 0, "at least 0"),
        (
            "--batch_tokens",
            args.batch_tokens,
            args.batch_tokens is None or args.batch_tokens >= 1,
            "at least 1",
        ),
        ("--streams", args.streams, args.streams is None or args.streams >= 1, "at least 1"),
        ("--alpha", args.alpha, math.isfinite(args.alpha) and args.alpha >= 0, "a number >= 0"),
        ("--average", args.average, args.average is None or args.average >= 1, "at least 1"),
        ("--step", args.step, args.step is None or args.step >= 0, "at least 0"),
    ]
    for flag, value, ok, expected in checks:
        if not ok:
            raise ValueError(f"{flag} must be {expected}, got {value}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        _check_numbers(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.plot_attention and not args.sentence:
        print("error: --plot_attention needs a SENTENCE argument", file=sys.stderr)
        return 2
    try:
        if args.plot_attention:
            lines, replaced = [], 0
        elif args.input == "-":
            lines, replaced = read_lines(sys.stdin.buffer.read(), "stdin", args.encoding_errors)
        else:
            data = pathlib.Path(args.input).read_bytes()
            lines, replaced = read_lines(data, args.input, args.encoding_errors)
        references = _references(args, len(lines))
        # opened before any work, so an unwritable path fails now, not after translating
        output = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8")  # noqa: SIM115
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if replaced:
        print(
            f"{args.input}: {replaced} lines had invalid UTF-8 replaced by U+FFFD", file=sys.stderr
        )
    with output if output is not sys.stdout else contextlib.nullcontext():
        return _translate(args, lines, references, output)


def _references(args, sentences: int) -> list[str] | None:
    """--reference's lines, read and counted before any work: a file that cannot be scored
    fails now, not after translating."""
    if not args.reference or args.plot_attention:
        return None
    references, _ = read_lines(pathlib.Path(args.reference).read_bytes(), args.reference, "strict")
    if len(references) != sentences:
        raise ValueError(
            f"{args.reference}: {len(references)} references but {sentences} input lines; "
            "they must be line-aligned"
        )
    return references


def _translate(args, lines: list[str], references: list[str] | None, output) -> int:
    from tfm import compilation_cache, viz
    from tfm.inference import attention_maps, translate
    from tfm.job import workdir

    cache = compilation_cache.default_directory()
    compilation_cache.enable(
        cache if args.compilation_cache_dir is None else args.compilation_cache_dir
    )

    try:
        loaded = workdir.load(
            args.workdir,
            step=args.step,
            average=None if args.step is not None else args.average,
            kernels=args.kernels,
        )
        config = TranslateConfig(
            beam_size=args.beam_size,
            alpha=args.alpha,
            extra_length=args.extra_length,
            batch_tokens=args.batch_tokens,
            streams=args.streams,
            max_source_len=translate.max_source_len_for(loaded.model.config),
            overlong=args.overlong,
        )
    except (workdir.LoadError, FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"loaded {loaded.description}", file=sys.stderr)
    if args.plot_attention:
        attended = attention_maps.translate_with_attention(
            loaded.model, loaded.params, loaded.tokenizer, args.sentence, config
        )
        viz.plot_attention(
            attended.maps, attended.source_pieces, attended.target_pieces, args.plot_attention
        )
        print(attended.translation, file=output)
        print(f"attention maps written to {args.plot_attention}", file=sys.stderr)
        return 0

    from tqdm import tqdm

    translations = []
    try:
        with tqdm(total=len(lines), unit="sent", file=sys.stderr, disable=args.input == "-") as bar:
            for line in translate.translate_in_order(
                loaded.model, loaded.params, loaded.tokenizer, lines, config, progress=bar.update
            ):
                output.write(line + "\n")
                output.flush()  # a reader (a pipe, `tail -f`) sees each line as it is done
                translations.append(line)
    except translate.OverlongInputError as error:
        print(f"error: {args.input}: {error}", file=sys.stderr)
        return 2
    if references is not None:
        scores = translate.score(translations, references, loaded.card.target_language)
        print(
            json.dumps(
                dict(
                    sacrebleu=round(scores["sacrebleu"]["score"], 2),
                    signature=scores["sacrebleu"]["signature"],
                    tokenized_bleu=round(scores["tokenized_bleu"]["score"], 2),
                    compound_split=scores["tokenized_bleu"]["compound_split"],
                    translated=loaded.description,
                    config=dataclasses.asdict(config),
                )
            ),
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
