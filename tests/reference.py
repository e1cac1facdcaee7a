"""Naive NumPy references written straight from the paper's formulas, independent of tfm."""

import math

import numpy as np


def softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def attention(q, k, v, mask=None):
    """Eq. 1 head by head with Python loops over batch and heads.

    q [b, lq, h, dk], k [b, lk, h, dk], v [b, lk, h, dv], mask broadcastable to [b, h, lq, lk].
    Rows with nothing allowed return zeros.
    """
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    b, lq, h, dk = q.shape
    out = np.zeros((b, lq, h, v.shape[-1]))
    full_mask = None if mask is None else np.broadcast_to(np.asarray(mask), (b, h, lq, k.shape[1]))
    for bi in range(b):
        for hi in range(h):
            scores = q[bi, :, hi] @ k[bi, :, hi].T / math.sqrt(dk)
            for i in range(lq):
                allowed = np.ones(k.shape[1], bool) if full_mask is None else full_mask[bi, hi, i]
                if not allowed.any():
                    continue
                row = np.where(allowed, scores[i], -np.inf)
                weights = softmax(row)
                out[bi, i, hi] = weights @ v[bi, :, hi]
    return out


def layer_norm(x, scale, bias, eps=1e-6):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


def rms_norm(x, scale, eps=1e-6):
    """RMSNorm (Zhang & Sennrich, 2019): x / sqrt(mean(x^2) + eps) * scale."""
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * scale


def multi_head(params, x_q, x_kv, mask=None):
    """Section 3.2.2: head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V), Concat(heads) W^O."""
    wq = np.asarray(params["query"]["kernel"], np.float64)  # [d_model, h, d_k]
    wk = np.asarray(params["key"]["kernel"], np.float64)
    wv = np.asarray(params["value"]["kernel"], np.float64)
    wo = np.asarray(params["out"]["kernel"], np.float64)  # [h, d_v, d_model]

    def bias(name: str, shape) -> np.ndarray:  # the projections' biases, where a model has them
        found = params[name].get("bias")
        return np.zeros(shape) if found is None else np.asarray(found, np.float64)

    bq, bk, bv = (bias(n, w.shape[1:]) for n, w in (("query", wq), ("key", wk), ("value", wv)))
    heads = []
    for i in range(wq.shape[1]):
        qi = (x_q @ wq[:, i] + bq[i])[:, :, None]
        ki = (x_kv @ wk[:, i] + bk[i])[:, :, None]
        vi = (x_kv @ wv[:, i] + bv[i])[:, :, None]
        head_mask = None if mask is None else np.asarray(mask)[:, :1]
        heads.append(attention(qi, ki, vi, head_mask)[:, :, 0])
    concat = np.concatenate(heads, axis=-1)  # [b, l, h * d_v]
    return concat @ wo.reshape(-1, wo.shape[-1]) + bias("out", wo.shape[-1:])


def activation(name: str, x: np.ndarray) -> np.ndarray:
    """The FFN's nonlinearity from its definition: max(0, x); GELU x Phi(x) with the normal CDF
    from erf; swish x / (1 + e^-x)."""
    if name == "relu":
        return np.maximum(0, x)
    if name == "gelu":
        erf = np.vectorize(math.erf)
        return x * 0.5 * (1.0 + erf(x / math.sqrt(2.0)))
    if name == "swish":
        return x / (1.0 + np.exp(-x))
    raise ValueError(name)


def feed_forward(params, x, nonlinearity: str = "relu"):
    """Section 3.3: max(0, x W1 + b1) W2 + b2 (or another nonlinearity in place of max(0, .))."""
    p1, p2 = params["inner"], params["outer"]
    hidden = activation(nonlinearity, x @ np.asarray(p1["kernel"]) + np.asarray(p1["bias"]))
    return hidden @ np.asarray(p2["kernel"]) + np.asarray(p2["bias"])


def sinusoids(max_len: int, d_model: int) -> np.ndarray:
    """Section 3.5 element by element."""
    table = np.zeros((max_len, d_model))
    for pos in range(max_len):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            table[pos, 2 * i] = math.sin(angle)
            table[pos, 2 * i + 1] = math.cos(angle)
    return table
