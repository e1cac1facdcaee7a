import mmap

import jax
import numpy as np
import pytest

from tests.conftest import tiny_model_config
from tfm import Transformer
from tfm.data import batching, id_cache, pipeline, tokenizer
from tfm.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

WORDS = (
    "the file could not be opened because permission was denied for user root "
    "die Datei konnte nicht geöffnet werden weil die Berechtigung verweigert wurde"
).split()


def _corpus(n=600, seed=0):
    rng = np.random.default_rng(seed)
    pairs = []
    for i in range(n):
        length = int(rng.integers(1, 10))
        source = " ".join(rng.choice(WORDS, length)) + f" {i}"
        target = " ".join(rng.choice(WORDS, int(rng.integers(1, 10)))) + f" #{i}"
        pairs.append((source, target))
    return pairs


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("data")
    pairs = _corpus()
    tok = tokenizer.load_or_train(pairs, "unit-test", 400, data_dir)
    ids = tokenizer.tokenize_split(pairs, tok, data_dir / "ids" / "train")
    return pairs, tok, ids, data_dir


def test_special_ids_and_exact_round_trip(trained):
    _, tok, _, _ = trained
    assert 300 < tok.vocab_size <= 400
    for text in ("the file  could not\tbe opened 😀 — ✓", "Größe:  %s ", "x" * 3):
        ids = tok.encode(text)
        assert PAD_ID not in ids and BOS_ID not in ids and EOS_ID not in ids
        assert tok.decode(ids) == text
        assert tok.decode(ids + [EOS_ID, 17, 18]) == text  # stops at EOS
    assert UNK_ID not in tok.encode("unseen ∮ characters")  # byte fallback, never unk


def test_vocabulary_is_cached_not_retrained(trained):
    pairs, tok, _, data_dir = trained
    mtime = tok.path.stat().st_mtime_ns
    again = tokenizer.load_or_train(pairs, "unit-test", 400, data_dir)
    assert again.path == tok.path and again.path.stat().st_mtime_ns == mtime
    other = tokenizer.load_or_train(pairs, "unit-test", 320, data_dir)
    assert other.path != tok.path


def test_corrupt_vocabulary_gets_a_clear_error(tmp_path):
    path = tmp_path / "bad.model"
    path.write_bytes(b"garbage")
    with pytest.raises(ValueError, match="bad.model"):
        tokenizer.Tokenizer(path)
    with pytest.raises(FileNotFoundError, match="prepare"):
        tokenizer.Tokenizer(tmp_path / "missing.model")


def test_id_cache_matches_tokenizer_and_is_reused(trained):
    pairs, tok, ids, data_dir = trained
    for i in (0, 17, 599):
        assert ids.source(i).tolist() == tok.encode(pairs[i][0])
        assert ids.target(i).tolist() == tok.encode(pairs[i][1])

    class Exploding:
        def encode_batch(self, texts):
            raise AssertionError("re-tokenized despite the cache")

    cached = tokenizer.tokenize_split(pairs, Exploding(), data_dir / "ids" / "train")
    np.testing.assert_array_equal(cached.src_ids, ids.src_ids)


def _expected_row(ids, i, max_len):
    source = ids.source(i).tolist()[: max_len - 1] + [EOS_ID]
    target = ids.target(i).tolist()[: max_len - 1]
    return source, [BOS_ID] + target, target + [EOS_ID]


@pytest.mark.parametrize("pack", [False, True])
def test_batches_hold_every_pair_once_correctly_under_budget(trained, pack):
    _, _, ids, _ = trained
    config = batching.BatchConfig(batch_tokens=512, max_seq_len=12, pack=pack, seed=3)
    pipe = pipeline.BatchPipeline(ids, config)
    plan = pipe.plan(0)
    seen = []
    shapes = set()
    for rows in plan:
        batch = pipe.local_batch(rows)
        shapes.add(batch["src"].shape)
        assert batch["src"].size <= config.batch_tokens  # padded tokens per side
        assert batch["tgt_in"].shape == batch["src"].shape
        for r, members in enumerate(rows):
            src_at = tgt_at = 0
            for segment, position in enumerate(members, start=1):
                index = pipe.examples.indices[position]
                seen.append(index)
                source, tgt_in, tgt_out = _expected_row(ids, index, config.max_seq_len)
                got = batch["src"][r, src_at : src_at + len(source)].tolist()
                assert got == source
                assert batch["tgt_in"][r, tgt_at : tgt_at + len(tgt_in)].tolist() == tgt_in
                assert batch["tgt_out"][r, tgt_at : tgt_at + len(tgt_out)].tolist() == tgt_out
                if pack:
                    assert set(batch["src_segments"][r, src_at : src_at + len(source)]) == {segment}
                    assert batch["tgt_positions"][
                        r, tgt_at : tgt_at + len(tgt_in)
                    ].tolist() == list(range(len(tgt_in)))
                src_at += len(source)
                tgt_at += len(tgt_in)
            assert np.all(batch["src"][r, src_at:] == PAD_ID)
            assert np.all(batch["tgt_out"][r, tgt_at:] == PAD_ID)
    overlong = ((ids.src_lengths + 1 > 12) | (ids.tgt_lengths + 1 > 12)).sum()
    assert sorted(seen) == sorted(
        set(range(len(ids)))
        - set(np.nonzero((ids.src_lengths + 1 > 12) | (ids.tgt_lengths + 1 > 12))[0])
    )
    assert pipe.examples.filtered["overlong_dropped"] == overlong > 0
    assert len(shapes) <= 8 and (not pack or len(shapes) == 1)


def test_truncation_cuts_targets_without_eos_and_counts(trained):
    _, _, ids, _ = trained
    config = batching.BatchConfig(batch_tokens=512, max_seq_len=12, overlong="truncate")
    pipe = pipeline.BatchPipeline(ids, config)
    assert pipe.examples.filtered["overlong_truncated"] > 0
    assert len(pipe.examples.indices) == len(ids)
    cut = 0
    for rows in pipe.plan(0):
        batch = pipe.local_batch(rows)
        for r, members in enumerate(rows):
            if not members:
                continue
            target = ids.target(pipe.examples.indices[members[0]]).tolist()
            # a target that fits ends in EOS; a cut one continues to its 12th token, no EOS
            expected = target + [EOS_ID] if len(target) < 12 else target[:12]
            cut += len(target) >= 12
            assert batch["tgt_out"][r, : len(expected)].tolist() == expected
            assert batch["tgt_in"][r, : len(expected)].tolist() == [BOS_ID] + expected[:-1]
            source = ids.source(pipe.examples.indices[members[0]]).tolist()
            assert batch["src"][r, : min(len(source) + 1, 12)].tolist()[-1] == EOS_ID
    assert cut > 0


def _synthetic_split(n=5000, seed=0):
    rng = np.random.default_rng(seed)
    src = [rng.integers(4, 100, int(k)).tolist() for k in rng.lognormal(2.0, 0.6, n).clip(1, 60)]
    tgt = [rng.integers(4, 100, max(1, len(s) + int(rng.integers(-2, 3)))).tolist() for s in src]
    arrays = []
    for side in (src, tgt):
        ids, lengths = id_cache.flatten(side, np.int32)
        arrays += [ids, np.concatenate([[0], np.cumsum(lengths)])]
    return id_cache.TokenizedSplit(*arrays)


def test_bucketed_padding_is_far_lower_than_unbucketed():
    ids = _synthetic_split()
    config = batching.BatchConfig(batch_tokens=2048, max_seq_len=64)
    pipe = pipeline.BatchPipeline(ids, config)
    real = padded = 0
    for rows in pipe.plan(0):
        batch = pipe.local_batch(rows)
        real += (batch["tgt_out"] != PAD_ID).sum()
        padded += batch["tgt_out"].size
    # the same pairs in random batches of 32 rows, each padded to its longest pair
    lengths = np.maximum(pipe.examples.src_lengths, pipe.examples.tgt_lengths)
    lengths = lengths[np.random.default_rng(0).permutation(len(lengths))]
    unbucketed = sum(len(c) * c.max() for c in np.array_split(lengths, len(lengths) // 32))
    bucketed_fraction = 1 - real / padded
    unbucketed_fraction = 1 - pipe.examples.tgt_lengths.sum() / unbucketed
    assert bucketed_fraction < 0.5 * unbucketed_fraction


def test_iterator_state_round_trip_across_epochs(trained):
    _, _, ids, _ = trained
    pipe = pipeline.BatchPipeline(ids, batching.BatchConfig(batch_tokens=1024, max_seq_len=32))
    per_epoch = len(pipe.plan(0))
    iterator = pipe.iterator()
    for _ in range(per_epoch - 2):
        next(iterator)
    state = iterator.get_state()
    expected = [next(iterator) for _ in range(5)]  # crosses into epoch 1
    assert iterator.epoch == 1
    resumed = pipe.iterator(state)
    for want in expected:
        got = next(resumed)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])
    with pytest.raises(ValueError, match="data-iterator state"):
        pipe.iterator({"bogus": 1})


def test_epochs_are_reshuffled_deterministically(trained):
    _, _, ids, _ = trained
    config = batching.BatchConfig(batch_tokens=1024, max_seq_len=32, seed=5)
    a = pipeline.BatchPipeline(ids, config)
    b = pipeline.BatchPipeline(ids, config)
    assert a.plan(0) == b.plan(0)
    assert a.plan(0) != a.plan(1)


@pytest.mark.parametrize("pack", [False, True])
def test_process_shards_are_disjoint_and_cover_the_split(trained, pack):
    _, _, ids, _ = trained
    config = batching.BatchConfig(batch_tokens=1024, max_seq_len=32, row_multiple=2, pack=pack)
    shards = [
        pipeline.BatchPipeline(ids, config, process_index=p, process_count=2) for p in range(2)
    ]
    for rows in shards[0].plan(0):
        local = [shard.local_batch(rows) for shard in shards]
        for p, batch in enumerate(local):  # equal shapes on every process, its own rows
            assert batch["src"].shape == (len(rows) // 2, local[0]["src"].shape[1])
            expected = batching.assemble_batch(
                ids,
                shards[0].examples,
                rows[p * len(rows) // 2 : (p + 1) * len(rows) // 2],
                batch["src"].shape[1],
                pack,
            )
            np.testing.assert_array_equal(batch["tgt_out"], expected["tgt_out"])
    mine = [
        {
            m
            for rows in shards[0].plan(0)
            for row in rows[p * len(rows) // 2 : (p + 1) * len(rows) // 2]
            for m in row
        }
        for p in range(2)
    ]
    assert not mine[0] & mine[1]
    assert mine[0] | mine[1] == set(range(len(shards[0].examples.indices)))


def test_packed_batch_from_the_pipeline_keeps_pairs_apart(trained):
    _, tok, ids, _ = trained
    pipe = pipeline.BatchPipeline(
        ids, batching.BatchConfig(batch_tokens=256, max_seq_len=64, pack=True)
    )
    rows = pipe.plan(0)[0]
    batch = pipe.local_batch(rows)
    row = next(r for r, members in enumerate(rows) if len(members) >= 2)
    model = Transformer(tiny_model_config(tok.vocab_size, num_layers=1))
    params = model.init(jax.random.key(0), batch["src"][:1], batch["tgt_in"][:1])
    packed = model.apply(
        params, **{k: v[row : row + 1] for k, v in batch.items() if k != "tgt_out"}
    )
    tgt_at = 0
    for position in rows[row]:
        index = pipe.examples.indices[position]
        source, tgt_in, _ = _expected_row(ids, index, 64)
        alone = model.apply(params, np.array([source]), np.array([tgt_in]))
        np.testing.assert_allclose(packed[0, tgt_at : tgt_at + len(tgt_in)], alone[0], atol=1e-5)
        tgt_at += len(tgt_in)


@pytest.mark.parametrize("pack", [False, True])
def test_the_id_cache_is_compact_memory_mapped_and_serves_the_same_batches(trained, pack):
    _, _, ids, _ = trained
    for array in (ids.src_ids, ids.tgt_offsets):  # a view of a read-only file mapping
        assert isinstance(array.base.obj, mmap.mmap) and not array.flags.writeable
    assert ids.src_ids.dtype == ids.tgt_ids.dtype == np.uint16  # a 400-piece vocabulary
    in_memory = id_cache.TokenizedSplit(
        np.array(ids.src_ids, np.int32),
        np.array(ids.src_offsets),
        np.array(ids.tgt_ids, np.int32),
        np.array(ids.tgt_offsets),
    )
    config = batching.BatchConfig(batch_tokens=512, max_seq_len=12, pack=pack, seed=3)
    mapped, plain = pipeline.BatchPipeline(ids, config), pipeline.BatchPipeline(in_memory, config)
    assert mapped.plan(1) == plain.plan(1)
    for rows in mapped.plan(1)[:20]:
        a, b = mapped.local_batch(rows), plain.local_batch(rows)
        assert sorted(a) == sorted(b)
        for key in a:
            assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key


def test_id_dtype_is_the_smallest_that_holds_the_vocabulary():
    assert id_cache.id_dtype(65_536) == np.uint16
    assert id_cache.id_dtype(65_537) == np.uint32


def test_a_half_written_id_cache_is_never_used(trained, tmp_path):
    pairs, tok, ids, _ = trained
    path = tmp_path / "ids" / "train"
    expected = np.array(tokenizer.tokenize_split(pairs, tok, path, key="k").src_ids)
    (path / "meta.json").unlink()  # as if the writer died before marking it complete
    (path / "src_ids.npy").write_bytes(b"truncated")
    rebuilt = tokenizer.tokenize_split(pairs, tok, path, key="k")
    np.testing.assert_array_equal(rebuilt.src_ids, expected)
    assert not list(tmp_path.glob("ids/*.partial"))
