"""Where beam search over a real file spends its time: a `jax.profiler` trace of one length
bucket of a trained workdir's split streamed through `tfm.inference.slots` (as
`tfm.inference.translate` runs it), summed per compiled HLO op as `profile_ops.py` does. Prints one
JSON object: wall time, steps, op time per step and the top ops.

    python benchmarks/profile_stream.py --workdir workdirs/default --data_dir data [--bucket 16]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", default="workdirs/default")
    parser.add_argument("--data_dir", default="data")
    parser.add_argument("--split", default="test")
    parser.add_argument("--bucket", type=int, default=16, help="padded source length")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()

    import jax
    import numpy as np
    from profile_ops import MATMUL, hlo_ops, traced_ops

    from tfm.data.prepare import prepare
    from tfm.inference import decoding, slots, translate
    from tfm.job.workdir import load, scored_average
    from tfm.tokens import EOS_ID

    loaded = load(args.workdir, average=scored_average(args.workdir))
    data = prepare(loaded.card.dataset, args.data_dir, loaded.model.config.vocab_size)
    config = translate.TranslateConfig()
    model, params = loaded.model, jax.device_put(loaded.params)
    sources = [source for source, _ in data.texts(args.split)]
    encoded = translate.encode_sources(loaded.tokenizer, sources, config)
    (part,) = [p for p in translate._plan(encoded, config) if p.length == args.bucket]
    settings = translate._stream_settings(
        config, part.rows, part.length, decoding.longest_output(loaded.model)
    )
    stream = [np.asarray([*encoded[i], EOS_ID], np.int32) for i in part.sentences]

    def run():
        return slots.search_stream(model, params, stream, settings)

    run()
    text = slots.lowered(model, params, settings).compile().as_text()
    durations, counts, wall = traced_ops(run)
    ops = hlo_ops(text)
    # one log-softmax of the logits per step, however many steps the loop body unrolls
    logits_max = [n for n, (_, src) in ops.items() if "log_softmax" in src and "reduce_max" in src]
    steps = round(sum(counts[name] for name in logits_max))
    top = []
    for name, ms in durations.most_common(args.top + 1):
        if name.startswith("np.asarray"):  # the host waiting for the device, not an op
            continue
        shape, op_name = ops.get(name, ("?", "?"))
        top.append(
            dict(
                op=name,
                ms_per_step=round(ms / steps, 3),
                matmul=bool(MATMUL.match(name)),
                shape=shape,
                source=op_name[-100:],
            )
        )
    op_ms = sum(ms for name, ms in durations.items() if not name.startswith("np.asarray"))
    print(
        json.dumps(
            dict(
                benchmark="profile_stream",
                bucket=args.bucket,
                slots=part.rows,
                sentences=len(part.sentences),
                steps=steps,
                wall_ms_per_step=round(wall * 1e3 / steps, 2),
                op_ms_per_step=round(op_ms / steps, 2),
                top_ops=top,
            ),
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
