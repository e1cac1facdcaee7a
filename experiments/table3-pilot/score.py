"""Beam-4 validation scores of the pilot's checkpoints (its own final evaluation was cut off)."""
import json, sys
import jax
from tfm.data.prepare import prepare
from tfm.inference import translate
from tfm.job.workdir import load

def main():
  workdir, data_dir = sys.argv[1], sys.argv[2]
  for step in map(int, sys.argv[3:]):
      loaded = load(workdir, step=step)
      data = prepare(loaded.card.dataset, data_dir, loaded.model.config.vocab_size)
      pairs = data.texts("validation")
      sources = [s for s, _ in pairs]
      references = [r for _, r in pairs]
      config = translate.TranslateConfig(max_source_len=translate.max_source_len_for(loaded.model.config, 50), overlong="truncate")
      hyps = translate.translate(loaded.model, jax.device_put(loaded.params), loaded.tokenizer, sources, config)
      scores = translate.score(hyps, references, data.spec.target_language, sources)
      print(json.dumps(dict(step=step, checkpoint=loaded.description, split="validation", beam_size=4, alpha=0.6,
          **{k: (v["score"] if isinstance(v, dict) and "score" in v else v) for k, v in scores.items()})), flush=True)

if __name__ == "__main__":
    main()
