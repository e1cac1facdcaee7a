"""Data: from a corpus on disk to batches of token ids.

corpus.py            parallel-corpus records, the hash split, text/tsv readers
gettext_catalogs.py  the host's `.mo` catalogs (the embedded default corpus)
tfds_sources.py      every TFDS builder, reader and preparation (WMT, the gettext dataset)
sources.py           spec strings (`tfds:`, `gettext:`, `text:`, `tsv:`) -> a corpus
tokenizer.py         the shared SentencePiece vocabulary
id_cache.py          the token-id cache: compact, memory-mapped, built in resumable chunks
streaming.py         chunk-by-chunk work on every core (scan, vocabulary text, encoding)
batching.py          the length rule, padded lengths, epoch plans, batch assembly (pure)
pipeline.py          grain serving of the plans: per-process slices, resumable iterator
prepare.py           all of the above once, streamed, and `python -m tfm.data.prepare`
"""
