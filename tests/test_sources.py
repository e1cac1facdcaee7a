import pathlib
import subprocess
import sys

import pytest

from tests.mo_files import write_mo
from tfm.data import corpus as corpora
from tfm.data import gettext_catalogs, sources
from tfm.data.corpus import CorpusError

HOST_CATALOGS = pathlib.Path("/usr/share/locale/de/LC_MESSAGES")


def _write(path: pathlib.Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def test_text_pair_reads_aligned_lines_with_bom_crlf_and_skips_empty(tmp_path):
    src = _write(
        tmp_path / "a.en", "\ufeffHello world\r\n\r\nGood morning\r\nOnly source\n".encode()
    )
    tgt = _write(tmp_path / "a.de", b"Hallo Welt\r\nLeer\r\nGuten Morgen\r\n\n")
    corpus = corpora.read_text_pair(src, tgt)
    pairs = [p for split in corpus.splits.values() for p in split]
    assert sorted(pairs) == [("Good morning", "Guten Morgen"), ("Hello world", "Hallo Welt")]
    assert corpus.filtered["empty_side"] == 2


def test_text_pair_line_count_mismatch_names_both_files(tmp_path):
    src = _write(tmp_path / "a.en", b"one\ntwo\nthree\n")
    tgt = _write(tmp_path / "a.de", b"eins\nzwei\n")
    with pytest.raises(CorpusError) as error:
        corpora.read_text_pair(src, tgt)
    message = str(error.value)
    assert src in message and tgt in message and "3" in message and "2" in message


def test_invalid_utf8_names_file_and_line_or_is_replaced(tmp_path):
    src = _write(tmp_path / "a.en", b"fine\nbad \xff byte\n")
    tgt = _write(tmp_path / "a.de", b"gut\nschlecht\n")
    with pytest.raises(CorpusError, match=r"a\.en, line 2: invalid UTF-8"):
        corpora.read_text_pair(src, tgt)
    corpus = corpora.read_text_pair(src, tgt, encoding_errors="replace")
    pairs = [p for split in corpus.splits.values() for p in split]
    assert ("bad \ufffd byte", "schlecht") in pairs


def test_tsv_reads_pairs_and_rejects_bad_lines(tmp_path):
    good = _write(tmp_path / "c.tsv", b"a b\tA B\n\nc\tC\n")
    corpus = corpora.read_tsv(good)
    assert sorted(p for s in corpus.splits.values() for p in s) == [("a b", "A B"), ("c", "C")]
    assert corpus.filtered["empty_line"] == 1
    bad = _write(tmp_path / "d.tsv", b"a\tA\nno tab here\n")
    with pytest.raises(CorpusError, match=r"d\.tsv, line 2: expected"):
        corpora.read_tsv(bad)
    with pytest.raises(CorpusError, match="no such file"):
        corpora.read_tsv(str(tmp_path / "missing.tsv"))


def test_split_by_hash_is_deterministic_and_about_two_percent():
    texts = [f"sentence number {i}" for i in range(20000)]
    splits = [corpora.split_of(t) for t in texts]
    assert splits == [corpora.split_of(t) for t in texts]
    for held_out in ("validation", "test"):
        assert 0.015 < splits.count(held_out) / len(texts) < 0.025


def test_parse_spec_defaults_and_errors():
    assert sources.parse_spec("tfds:wmt14_translate/de-en").source_language == "en"
    assert sources.parse_spec("tfds:wmt14_translate/de-en").target_language == "de"
    assert sources.parse_spec("tfds:wmt14_translate/fr-en").target_language == "fr"
    reverse = sources.parse_spec("tfds:wmt14_translate/de-en", "de", "en")
    assert (reverse.source_language, reverse.target_language) == ("de", "en")
    assert sources.parse_spec("gettext:en-de").target_language == "de"
    for bad in ("wmt14", "gettext:de-en", "text:only_one_file", "ftp:x"):
        with pytest.raises(ValueError, match="dataset spec"):
            sources.parse_spec(bad)


MESSAGES = [
    ("Open file", "Datei öffnen"),
    ("menu\x04Quit", "Beenden"),  # message context
    ("%d file\x00%d files", "%d Datei\x00%d Dateien"),  # plural forms
    ("First line\nSecond line", "Erste Zeile\nZweite Zeile"),  # multi-line, aligned
    ("Usage: %s [OPTION]\n", "Aufruf: %s [OPTION]\n"),
    ("Untranslated", ""),  # empty translation
    ("Open file ", "Datei öffnen (Duplikat)"),  # duplicate after whitespace normalisation
]


def test_read_mo_both_byte_orders_and_entries(tmp_path):
    for big_endian in (False, True):
        path = tmp_path / f"x{big_endian}.mo"
        write_mo(path, MESSAGES, big_endian=big_endian)
        entries = {e.msgid: e for e in gettext_catalogs.read_mo(path)}
        assert entries["Quit"].context == "menu"
        assert entries["%d file"].msgid_plural == "%d files"
        assert entries["%d file"].msgstrs == ("%d Datei", "%d Dateien")


def test_read_mo_rejects_garbage_with_the_file_name(tmp_path):
    path = tmp_path / "broken.mo"
    path.write_bytes(b"not a catalog at all, really")
    with pytest.raises(gettext_catalogs.CatalogError, match="broken.mo"):
        gettext_catalogs.read_mo(path)


def test_catalog_pairs_handle_plurals_contexts_multiline_and_empties(tmp_path):
    write_mo(tmp_path / "de" / "LC_MESSAGES" / "app.mo", MESSAGES)
    (tmp_path / "de" / "LC_MESSAGES" / "zz-truncated.mo").write_bytes(
        b"\xde\x12\x04\x95" + b"\0" * 8
    )
    corpus = gettext_catalogs.read_catalogs("de", tmp_path)
    pairs = dict(corpus.pairs)
    assert pairs["Open file"] == "Datei öffnen"  # first wins, duplicate counted
    assert pairs["Quit"] == "Beenden"
    assert pairs["%d file"] == "%d Datei" and pairs["%d files"] == "%d Dateien"
    assert pairs["First line"] == "Erste Zeile" and pairs["Second line"] == "Zweite Zeile"
    assert pairs["Usage: %s [OPTION]"] == "Aufruf: %s [OPTION]"
    assert "Untranslated" not in pairs
    assert corpus.filtered["untranslated"] == 1
    assert corpus.filtered["duplicate_source"] == 1
    assert corpus.filtered["unreadable_file"] == 1


def test_missing_catalogs_say_how_to_use_another_source(tmp_path):
    with pytest.raises(FileNotFoundError, match="Use another source"):
        gettext_catalogs.read_catalogs("de", tmp_path)


def test_gettext_tfds_builder_prepares_without_tensorflow(tmp_path):
    locale = tmp_path / "locale"
    many = [(f"Message number {i}", f"Nachricht Nummer {i}") for i in range(300)]
    write_mo(locale / "de" / "LC_MESSAGES" / "app.mo", MESSAGES + many)
    corpus = sources.load_corpus(
        sources.parse_spec("gettext:en-de"), tmp_path / "data", locale_dir=locale
    )
    all_pairs = [p for split in corpus.splits.values() for p in split]
    assert ("Quit", "Beenden") in all_pairs
    assert len(all_pairs) == len(set(all_pairs)) == 307
    for split, pairs in corpus.splits.items():
        assert all(corpora.split_of(s) == split for s, _ in pairs)
    assert corpus.filtered["untranslated"] == 1
    assert (tmp_path / "data" / "gettext_translations" / "en-de").is_dir()
    # prepared already: read back from the data dir, with the same filter counts
    again = sources.load_corpus(
        sources.parse_spec("gettext:en-de"), tmp_path / "data", locale_dir=locale
    )
    assert again.splits == corpus.splits and again.filtered == corpus.filtered
    # reading the prepared dataset back needs no TensorFlow: checked in a fresh process, whatever
    # other tests imported into this one
    code = (
        "import sys\n"
        "from tfm.data import sources\n"
        "spec = sources.parse_spec('gettext:en-de')\n"
        "sources.load_corpus(spec, sys.argv[1], locale_dir=sys.argv[2])\n"
        "print('tensorflow' in sys.modules)"
    )
    fresh = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "data"), str(locale)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=pathlib.Path(__file__).resolve().parents[1],
    )
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    assert fresh.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.skipif(not HOST_CATALOGS.is_dir(), reason="no German catalogs on this machine")
def test_host_catalogs_give_tens_of_thousands_of_pairs():
    catalogs = gettext_catalogs.read_catalogs("de")
    corpus = corpora.split_pairs(catalogs.pairs, catalogs.filtered)
    sizes = {split: len(pairs) for split, pairs in corpus.splits.items()}
    assert sizes["train"] > 20000 and sizes["validation"] > 300 and sizes["test"] > 300
    assert corpus.filtered["duplicate_source"] > 0


def test_wmt_through_tfds_mock_data():
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=7):
        corpus = sources.load_corpus(sources.parse_spec("tfds:wmt14_translate/de-en"))
    assert {split: len(p) for split, p in corpus.splits.items()} == dict(
        train=7, validation=7, test=7
    )
    source, target = corpus.splits["train"][0]
    assert isinstance(source, str) and isinstance(target, str)


def test_unprepared_tfds_dataset_says_how_to_prepare(tmp_path):
    with pytest.raises(CorpusError, match="python -m tfm.data.prepare"):
        sources.load_corpus(sources.parse_spec("tfds:wmt14_translate/de-en"), tmp_path)
    # a name TFDS does not know: still one line (TFDS's own message lists every dataset)
    with pytest.raises(CorpusError) as error:
        sources.load_corpus(sources.parse_spec("tfds:no_such_dataset_xyz/de-en"), tmp_path)
    assert "\n" not in str(error.value) and "no_such_dataset_xyz" in str(error.value)
