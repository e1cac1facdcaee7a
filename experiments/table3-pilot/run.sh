#!/bin/bash
# Table 3 pilot A: the miniature base (N3 d128 h4 ff512) on 2,048-token batches, Eq. 3 peak 2.2e-3
cd /work/main
exec nice -n 5 .venv/bin/python train.py --config configs/table3_mini.py:base --workdir /work/pilot/a \
  --config.batch_tokens=2048 --config.warmup_steps=400 --config.learning_rate_scale=0.5 \
  --config.num_train_steps=6000 --config.eval_every_steps=250 --config.eval_bleu_every_steps=500 \
  --config.checkpoint_every_steps=500 --config.keep_checkpoints=3 --config.log_every_steps=50 \
  --compilation_cache_dir=/work/pilot/jaxcache
