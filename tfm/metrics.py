"""BLEU two ways (section 6.1) and perplexity.

- sacreBLEU on detokenized text, with its signature (the comparable modern figure).
- The paper's tokenized BLEU: text tokenized (sacreBLEU's 13a tokenizer, standing in for Moses'
  tokenizer.perl), hyphenated compounds split as "##AT##-##AT##" as tensor2tensor's
  get_ende_bleu.sh does for En-De, then BLEU on the tokens. Higher than sacreBLEU on the same
  output (fairseq: 29.3 vs 28.6).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import sacrebleu
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

_COMPOUND = re.compile(r"(?<=\S)-(?=\S)")
_tokenize_13a = Tokenizer13a()


def sacre_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
    """Detokenized corpus BLEU with sacreBLEU's default settings: score and signature."""
    _check_lengths(hypotheses, references)
    metric = sacrebleu.metrics.BLEU()
    result = metric.corpus_score(list(hypotheses), [list(references)])
    return dict(score=result.score, signature=str(metric.get_signature()), text=str(result))


def split_compounds(text: str) -> str:
    """a-b -> a ##AT##-##AT## b for every hyphen between two non-space characters (one pass;
    the inserted markers are not split again)."""
    return _COMPOUND.sub(" ##AT##-##AT## ", text)


def tokenized_bleu(
    hypotheses: Sequence[str], references: Sequence[str], compound_split: bool = True
) -> dict:
    """The paper's way: tokenize, split compounds (En-De), BLEU on tokens."""
    _check_lengths(hypotheses, references)

    def prepare(text: str) -> str:
        tokens = _tokenize_13a(text.strip())
        return split_compounds(tokens) if compound_split else tokens

    result = sacrebleu.metrics.BLEU(tokenize="none", force=True).corpus_score(
        [prepare(h) for h in hypotheses], [[prepare(r) for r in references]]
    )
    return dict(score=result.score, compound_split=compound_split, text=str(result))


def perplexity(nll_sum: float, tokens: float) -> float:
    """exp(mean negative log-likelihood per token)."""
    return math.exp(nll_sum / max(tokens, 1.0))


def _check_lengths(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses but {len(references)} references; "
            "they must be line-aligned"
        )
