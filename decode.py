"""The command line of translation (`tfm.translate`) from a workdir that train.py wrote:
translate files or stdin, score BLEU, and draw attention maps.

    python decode.py --workdir DIR [--input FILE] [--output FILE] [--reference FILE]
                     [--step N | --average N] [--beam_size 4] [--alpha 0.6]
    python decode.py --workdir DIR --plot_attention OUT.png "A sentence to translate."

Input is one sentence per line (stdin by default); translations are written in input order.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys

from tfm.translate import TranslateConfig

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
    parser.add_argument("--batch_tokens", type=int, default=DEFAULTS.batch_tokens)
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
    parser.add_argument("sentence", nargs="?", help="the sentence for --plot_attention")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.plot_attention and not args.sentence:
        print("error: --plot_attention needs a SENTENCE argument", file=sys.stderr)
        return 2
    from tfm import translate, viz, workdir

    try:
        loaded = workdir.load(
            args.workdir, step=args.step, average=None if args.step is not None else args.average
        )
        config = TranslateConfig(
            beam_size=args.beam_size,
            alpha=args.alpha,
            extra_length=args.extra_length,
            batch_tokens=args.batch_tokens,
            max_source_len=loaded.model.config.max_positions,
            overlong=args.overlong,
        )
    except (workdir.LoadError, FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"loaded {loaded.description}", file=sys.stderr)
    if args.plot_attention:
        attended = translate.translate_with_attention(
            loaded.model, loaded.params, loaded.tokenizer, args.sentence, config
        )
        viz.plot_attention(
            attended.maps, attended.source_pieces, attended.target_pieces, args.plot_attention
        )
        print(attended.translation)
        print(f"attention maps written to {args.plot_attention}", file=sys.stderr)
        return 0

    from tqdm import tqdm

    source = sys.stdin if args.input == "-" else open(args.input, encoding="utf-8")  # noqa: SIM115
    with source:
        lines = [line.rstrip("\r\n") for line in source]
    try:
        with tqdm(total=len(lines), unit="sent", file=sys.stderr, disable=args.input == "-") as bar:
            translations = translate.translate(
                loaded.model, loaded.params, loaded.tokenizer, lines, config, progress=bar.update
            )
    except translate.OverlongInputError as error:
        print(f"error: {args.input}: {error}", file=sys.stderr)
        return 2
    text = "\n".join(translations) + ("\n" if translations else "")
    if args.output == "-":
        sys.stdout.write(text)
    else:
        pathlib.Path(args.output).write_text(text, encoding="utf-8")
    if args.reference:
        references = pathlib.Path(args.reference).read_text(encoding="utf-8").splitlines()
        try:
            scores = translate.score(translations, references, loaded.card.target_language)
        except ValueError as error:
            print(f"error: {args.reference}: {error}", file=sys.stderr)
            return 2
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
