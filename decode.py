"""Translate with a trained model, score BLEU, and draw attention maps.

    python decode.py --workdir DIR [--input FILE] [--output FILE] [--reference FILE]
                     [--step N | --average N] [--beam_size 4] [--alpha 0.6]
    python decode.py --workdir DIR --plot_attention OUT.png "A sentence to translate."

Input is one sentence per line (stdin by default); translations are written in input order.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys


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
    parser.add_argument("--beam_size", type=int, default=4, help="1 = greedy")
    parser.add_argument("--alpha", type=float, default=0.6, help="length penalty exponent")
    parser.add_argument(
        "--extra_length", type=int, default=50, help="maximum output length = source length + this"
    )
    parser.add_argument("--batch_tokens", type=int, default=4096)
    parser.add_argument(
        "--overlong",
        choices=("truncate", "error"),
        default="truncate",
        help="lines longer than the model's max_len: truncate with a warning or stop",
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
    from tfm import inference

    try:
        loaded = inference.load(
            args.workdir, step=args.step, average=None if args.step is not None else args.average
        )
    except (inference.LoadError, FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"loaded {loaded.description}", file=sys.stderr)
    if args.plot_attention:
        if not args.sentence:
            print("error: --plot_attention needs a SENTENCE argument", file=sys.stderr)
            return 2
        translation = inference.plot_attention(
            loaded, args.sentence, args.plot_attention, beam_size=args.beam_size, alpha=args.alpha
        )
        print(translation)
        print(f"attention maps written to {args.plot_attention}", file=sys.stderr)
        return 0

    from tqdm import tqdm

    from tfm import metrics
    from tfm.translate import OverlongInputError, TranslateConfig, translate

    source = sys.stdin if args.input == "-" else open(args.input, encoding="utf-8")  # noqa: SIM115
    with source:
        lines = [line.rstrip("\r\n") for line in source]
    config = TranslateConfig(
        beam_size=args.beam_size,
        alpha=args.alpha,
        extra_length=args.extra_length,
        batch_tokens=args.batch_tokens,
        max_source_len=loaded.model.config.max_len,
        overlong=args.overlong,
    )
    try:
        with tqdm(total=len(lines), unit="sent", file=sys.stderr, disable=args.input == "-") as bar:
            translations = translate(
                loaded.model, loaded.params, loaded.tokenizer, lines, config, progress=bar.update
            )
    except OverlongInputError as error:
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
            sacre = metrics.sacre_bleu(translations, references)
            compound = loaded.card.get("target_language") == "de"
            tokenized = metrics.tokenized_bleu(translations, references, compound_split=compound)
        except ValueError as error:
            print(f"error: {args.reference}: {error}", file=sys.stderr)
            return 2
        print(
            json.dumps(
                dict(
                    sacrebleu=round(sacre["score"], 2),
                    signature=sacre["signature"],
                    tokenized_bleu=round(tokenized["score"], 2),
                    compound_split=compound,
                )
            ),
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
