"""BLEU two ways (section 6.1) and perplexity.

- sacreBLEU on detokenized text, with its signature (the comparable modern figure).
- BLEU the paper's way, as tensor2tensor's `get_ende_bleu.sh` computes it: hypotheses and
  references tokenized by Moses' `tokenizer.perl -l LANG` (through `sacremoses`, its maintained
  Python port, plus the one rule where the two differ), hyphenated compounds split by the perl
  substitution `s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g` (German), then `multi-bleu.perl`'s corpus
  BLEU on the tokens. On the main job's test output this reproduces the real perl pipeline token
  for token (tests/fixtures/moses-bleu). It is higher than sacreBLEU on the same output.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence

import sacrebleu
from sacremoses import MosesTokenizer

_COMPOUND = re.compile(r"(\S)-(\S)")
_SPLITTABLE_LAST_WORD = re.compile(r"\S*[^.\s]\S*\.")


def sacre_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
    """Detokenized corpus BLEU with sacreBLEU's default settings: score and signature."""
    _check_lengths(hypotheses, references)
    metric = sacrebleu.metrics.BLEU()
    result = metric.corpus_score(list(hypotheses), [list(references)])
    return dict(score=result.score, signature=str(metric.get_signature()), text=str(result))


@functools.lru_cache(maxsize=8)
def _moses(language: str) -> MosesTokenizer:
    return MosesTokenizer(lang=language)


def moses_tokenize(text: str, language: str) -> str:
    """`tokenizer.perl -l LANG` (default escaping: &apos; &quot; &amp; ...). tokenizer.perl
    splits the period off a sentence's last word even after a non-breaking prefix ("% s." ->
    "% s ."); sacremoses keeps the older rule, so that one step is done here."""
    words = _moses(language).tokenize(text.strip(), return_str=True, escape=True).split(" ")
    if words and _SPLITTABLE_LAST_WORD.fullmatch(words[-1]):
        words[-1] = words[-1][:-1] + " ."
    return " ".join(words)


def split_compounds(text: str) -> str:
    """perl's `s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g`: left to right, a match consumes the
    characters on both sides of its hyphen, so "a-b-c-d" -> "a ##AT##-##AT## b-c ##AT##-##AT## d"
    exactly as get_ende_bleu.sh produces it."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", text)


def tokenized_bleu(
    hypotheses: Sequence[str],
    references: Sequence[str],
    language: str = "de",
    compound_split: bool | None = None,
) -> dict:
    """BLEU the paper's way: Moses-tokenize, split compounds (default: for German), then corpus
    BLEU on tokens (multi-bleu.perl: case-sensitive, no smoothing)."""
    _check_lengths(hypotheses, references)
    compound_split = language == "de" if compound_split is None else compound_split

    def prepare(text: str) -> str:
        tokens = moses_tokenize(text, language)
        return split_compounds(tokens) if compound_split else tokens

    result = sacrebleu.metrics.BLEU(tokenize="none", force=True).corpus_score(
        [prepare(h) for h in hypotheses], [[prepare(r) for r in references]]
    )
    return dict(
        score=result.score,
        compound_split=compound_split,
        tokenizer=f"moses tokenizer.perl -l {language} (sacremoses)",
        text=str(result),
    )


def perplexity(nll_sum: float, tokens: float) -> float:
    """exp(mean negative log-likelihood per token)."""
    return math.exp(nll_sum / max(tokens, 1.0))


def _check_lengths(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses but {len(references)} references; "
            "they must be line-aligned"
        )
