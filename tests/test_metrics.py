"""BLEU the paper's way against the real Moses perl pipeline's output (tests/fixtures/moses-bleu:
tokenizer.perl -l de, the compound-split substitution, multi-bleu.perl)."""

import pathlib
import re

import pytest

from tfm import metrics

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "moses-bleu"


def _lines(name: str) -> list[str]:
    return (FIXTURES / name).read_text(encoding="utf-8").split("\n")[:-1]


@pytest.mark.parametrize("name", ["tricky", "ref", "hyp"])
def test_tokens_equal_tokenizer_perl_and_the_compound_split_line_for_line(name):
    expected = _lines(f"{name}.tok.atat.de")
    got = [metrics.split_compounds(metrics.moses_tokenize(t, "de")) for t in _lines(f"{name}.de")]
    assert len(got) == len(expected)
    differ = [(i, g, e) for i, (g, e) in enumerate(zip(got, expected, strict=True)) if g != e]
    assert differ == []


def test_bleu_equals_multi_bleu_perl():
    perl = float(re.search(r"BLEU = ([\d.]+)", (FIXTURES / "multi-bleu.txt").read_text())[1])
    assert perl == 40.44
    ours = metrics.tokenized_bleu(_lines("hyp.de"), _lines("ref.de"), "de")
    assert ours["score"] == pytest.approx(perl, abs=0.05)
    assert ours["compound_split"]


def test_compound_split_is_the_perl_substitution():
    # a match consumes the characters beside its hyphen, so the middle segment stays joined
    assert metrics.split_compounds("a-b-c-d") == "a ##AT##-##AT## b-c ##AT##-##AT## d"
    assert metrics.split_compounds("E-Mail - gut") == "E ##AT##-##AT## Mail - gut"
