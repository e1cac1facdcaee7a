"""Beam-4 validation scores of the pilot's checkpoints (its own final evaluation was cut off).

python experiments/table3-pilot/score.py WORKDIR DATA_DIR STEP [STEP ...]
"""

import json
import sys

import jax

from tfm.data.prepare import prepare
from tfm.inference import translate
from tfm.job.workdir import load


def main() -> None:
    workdir, data_dir = sys.argv[1], sys.argv[2]
    for step in map(int, sys.argv[3:]):
        loaded = load(workdir, step=step)
        data = prepare(loaded.card.dataset, data_dir, loaded.model.config.vocab_size)
        pairs = data.texts("validation")
        sources = [s for s, _ in pairs]
        references = [r for _, r in pairs]
        longest = translate.max_source_len_for(loaded.model.config)
        config = translate.TranslateConfig(max_source_len=longest, overlong="truncate")
        params = jax.device_put(loaded.params)
        hypotheses = translate.translate(loaded.model, params, loaded.tokenizer, sources, config)
        scores = translate.score(hypotheses, references, data.spec.target_language, sources)
        figures = {k: v["score"] if isinstance(v, dict) else v for k, v in scores.items()}
        record = dict(
            step=step,
            checkpoint=loaded.description,
            split="validation",
            beam_size=4,
            alpha=0.6,
            **figures,
        )
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
