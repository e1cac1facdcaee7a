"""Export a trained workdir to the libraries translation models are deployed with:
`python -m tfm.export ct2 WORKDIR OUT` (CTranslate2) and `python -m tfm.export hf WORKDIR OUT`
(Hugging Face `MarianMTModel` + tokenizer). Neither torch nor CTranslate2 is imported by `import
tfm`; install them with `pip install -e '.[export]'`."""
