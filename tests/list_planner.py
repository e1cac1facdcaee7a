"""The epoch planner as it was before plans became flat arrays (lists of rows of positions):
the reference that `EpochPlan` must reproduce batch for batch, so a run resumed across the
change, or compared with an older one, sees the same batches."""

import numpy as np

from tfm.data.batching import bucket_lengths


def plan_epoch(examples, config, epoch, buckets=None):
    buckets = buckets or bucket_lengths(examples, config)
    rng = np.random.default_rng([config.seed, epoch])
    order = (
        rng.permutation(len(examples.indices))
        if config.shuffle
        else np.arange(len(examples.indices))
    )
    if config.pack:
        batches = _plan_packed(order, examples, config)
    else:
        batches = _plan_bucketed(order, examples, config, buckets)
    if config.shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def _plan_bucketed(order, examples, config, buckets):
    lengths = np.maximum(examples.src_lengths, examples.tgt_lengths)
    buckets = np.asarray(buckets)
    bucket_of = np.searchsorted(buckets, lengths)
    batches = []
    for b, length in enumerate(buckets):
        members = order[bucket_of[order] == b]
        rows = config.rows_for(int(length))
        for start in range(0, len(members), rows):
            chunk = members[start : start + rows].tolist()
            batches.append([[i] for i in chunk] + [[] for _ in range(rows - len(chunk))])
    return batches


def _plan_packed(order, examples, config):
    rows_per_batch = config.rows_for(config.max_seq_len)
    rows, used, open_rows = [], [], []
    for i in order.tolist():
        s, t = int(examples.src_lengths[i]), int(examples.tgt_lengths[i])
        for r in open_rows:
            if used[r][0] + s <= config.max_seq_len and used[r][1] + t <= config.max_seq_len:
                rows[r].append(i)
                used[r] = (used[r][0] + s, used[r][1] + t)
                break
        else:
            rows.append([i])
            used.append((s, t))
            open_rows.append(len(rows) - 1)
            if len(open_rows) > 64:
                open_rows.pop(0)
    batches = [rows[k : k + rows_per_batch] for k in range(0, len(rows), rows_per_batch)]
    if batches:
        batches[-1] = batches[-1] + [[] for _ in range(rows_per_batch - len(batches[-1]))]
    return batches
