"""Export a train.py workdir for deployment.

    python -m tfm.export ct2 WORKDIR OUT [--step N | --average K] [--quantization int8]
    python -m tfm.export hf  WORKDIR OUT [--step N | --average K]

By default the export holds the parameters the training job scored (the average of the
checkpoints named in WORKDIR/results.json), else the latest checkpoint. OUT must not exist yet;
it is written as OUT.partial and renamed when complete. OUT/tfm_export.json says what it holds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import shutil
import sys

from tfm.export.weights import ExportError, from_tfm_params


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tfm.export",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("target", choices=("ct2", "hf"))
    parser.add_argument("workdir", type=pathlib.Path)
    parser.add_argument("out", type=pathlib.Path)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, help="export this checkpoint")
    which.add_argument("--average", type=int, help="average the last K checkpoints")
    parser.add_argument(
        "--quantization",
        default="float32",
        help="ct2 only: float32, int8, int8_float32, float16 or bfloat16",
    )
    parser.add_argument("--max_positions", type=int, default=1024, help="position table rows")
    args = parser.parse_args(argv)
    from absl import logging

    from tfm.export import ct2, hf
    from tfm.job.workdir import LoadError, load, scored_average

    logging.set_verbosity(logging.ERROR)  # orbax logs every checkpoint file it reads

    try:
        if args.out.exists():
            raise ExportError(f"{args.out} exists; remove it or choose another output directory")
        if args.target == "hf" and args.quantization != "float32":
            raise ExportError("--quantization applies to ct2 only; hf exports float32")
        for flag, value, least in (
            ("--step", args.step, 0),
            ("--average", args.average, 1),
            ("--max_positions", args.max_positions, 1),
        ):
            if value is not None and value < least:
                raise ExportError(f"{flag} must be at least {least}, got {value}")
        average = args.average
        if average is None and args.step is None:
            average = scored_average(args.workdir)
        loaded = load(args.workdir, step=args.step, average=average)
        config = loaded.model.config
        positions = config.max_positions if config.positional == "learned" else args.max_positions
        weights = from_tfm_params(loaded.params, config, positions)
        pieces = loaded.tokenizer.pieces(range(config.vocab_size))
        partial = args.out.with_name(args.out.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        if args.target == "ct2":
            ct2.export(config, weights, pieces, loaded.tokenizer.path, partial, args.quantization)
        else:
            languages = (loaded.card.source_language, loaded.card.target_language)
            hf.export(config, weights, pieces, loaded.tokenizer.path, partial, languages, positions)
        provenance = dict(
            target=args.target,
            parameters=loaded.description,
            quantization=args.quantization,
            model=dataclasses.asdict(config),
            dataset=loaded.card.dataset,
            source_language=loaded.card.source_language,
            target_language=loaded.card.target_language,
            vocabulary_fingerprint=loaded.card.vocabulary_fingerprint,
        )
        (partial / "tfm_export.json").write_text(json.dumps(provenance, indent=1) + "\n")
        partial.rename(args.out)
    except (ExportError, LoadError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {args.target} export of the {loaded.description}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
