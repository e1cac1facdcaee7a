"""Model FLOPs of the Transformer, the numerator of every MFU figure in benchmarks/ (NumPy-free,
JAX-free, so that peer processes can use it too)."""

from __future__ import annotations


def forward_flops(
    *,
    num_layers: int,
    d_model: int,
    d_ff: int,
    qk_width: int,
    v_width: int,
    vocab_size: int,
    batch: int,
    src_len: int,
    tgt_len: int,
) -> float:
    """Matmul FLOPs (2 per multiply-add) of one teacher-forced forward pass: the Q/K/V/O
    projections, the Q K^T and weights x V products, the FFN and the output layer.
    Embedding lookups, softmax and LayerNorm are not counted. `qk_width` = heads x d_k,
    `v_width` = heads x d_v. Training FLOPs = 3 x this (forward + backward)."""
    hk, hv = qk_width, v_width
    projections = 2 * d_model * (2 * hk + hv) + 2 * hv * d_model  # Q, K, V, O per token
    ffn = 2 * 2 * d_model * d_ff
    encoder = src_len * (projections + ffn) + 2 * src_len * src_len * (hk + hv)
    decoder_self = tgt_len * projections + 2 * tgt_len * tgt_len * (hk + hv)
    cross = (
        tgt_len * 2 * d_model * hk
        + tgt_len * 2 * hv * d_model  # Q, O on the target
        + src_len * 2 * d_model * (hk + hv)  # K, V on the encoder output
        + 2 * tgt_len * src_len * (hk + hv)
    )
    decoder = decoder_self + cross + tgt_len * ffn
    logits = tgt_len * 2 * d_model * vocab_size
    return float(batch * (num_layers * (encoder + decoder) + logits))
