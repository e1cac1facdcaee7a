"""Data: corpora (sources), the shared SentencePiece vocabulary (tokenizer) and the batching
pipeline (pipeline)."""
