"""PyTorch's `nn.Transformer` (post-LN, ReLU, batch-first) with a shared embedding and the
sinusoidal table, trained with `torch.optim.Adam` and decoded greedily WITHOUT a cache (the
decoder re-runs over the whole prefix each step, as `nn.Transformer` offers no incremental
decoding)."""

from __future__ import annotations

import math
import time

import numpy as np
import torch
from torch import nn

from peers import weights as neutral
from peers.workloads import (
    ADAM,
    BOS_ID,
    DROPOUT,
    LABEL_SMOOTHING,
    LAYER_NORM_EPSILON,
    PAD_ID,
    Workload,
    decoding_source,
    learning_rate,
    sinusoidal_table,
    training_batch,
)

NAME = "torch"


class TorchTransformer(nn.Module):
    def __init__(self, w: Workload, dropout: float):
        super().__init__()
        s = w.shape
        self.d_model = s.d_model
        self.embedding = nn.Embedding(s.vocab_size, s.d_model)
        self.register_buffer("positions", torch.from_numpy(sinusoidal_table(512, s.d_model)))
        self.dropout = nn.Dropout(dropout)
        layer = dict(
            d_model=s.d_model,
            nhead=s.num_heads,
            dim_feedforward=s.d_ff,
            dropout=dropout,
            activation="relu",
            layer_norm_eps=LAYER_NORM_EPSILON,
            batch_first=True,
            norm_first=False,
        )
        # Post-LN stacks need no final LayerNorm (tfm and the paper have none).
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(**layer), s.num_layers, enable_nested_tensor=False
        )
        self.decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(**layer), s.num_layers)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embedding(ids) * math.sqrt(self.d_model) + self.positions[: ids.shape[1]]
        return self.dropout(x)

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.embed(src), src_key_padding_mask=src == PAD_ID)

    def decode(self, memory: torch.Tensor, src: torch.Tensor, tgt_in: torch.Tensor):
        length = tgt_in.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(length, dtype=torch.bool)
        y = self.decoder(
            self.embed(tgt_in),
            memory,
            tgt_mask=causal,
            tgt_is_causal=True,
            memory_key_padding_mask=src == PAD_ID,
        )
        return y @ self.embedding.weight.T

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(src), src, tgt_in)


def load_weights(model: TorchTransformer, weights: neutral.Weights) -> None:
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))
    zeros = lambda n: torch.zeros(n)
    with torch.no_grad():
        model.embedding.weight.copy_(t(weights["embedding"]))

        def attention(module: nn.MultiheadAttention, prefix: str) -> None:
            qkv = np.concatenate([weights[f"{prefix}.{p}"].T for p in "qkv"], axis=0)
            module.in_proj_weight.copy_(t(qkv))
            module.in_proj_bias.copy_(zeros(qkv.shape[0]))
            module.out_proj.weight.copy_(t(weights[f"{prefix}.o"].T))
            module.out_proj.bias.zero_()

        def norm(module: nn.LayerNorm, prefix: str) -> None:
            module.weight.copy_(t(weights[f"{prefix}.scale"]))
            module.bias.copy_(t(weights[f"{prefix}.bias"]))

        def ffn(layer, prefix: str) -> None:
            layer.linear1.weight.copy_(t(weights[f"{prefix}.w1"].T))
            layer.linear1.bias.copy_(t(weights[f"{prefix}.b1"]))
            layer.linear2.weight.copy_(t(weights[f"{prefix}.w2"].T))
            layer.linear2.bias.copy_(t(weights[f"{prefix}.b2"]))

        for i, layer in enumerate(model.encoder.layers):
            attention(layer.self_attn, f"encoder.{i}.self")
            norm(layer.norm1, f"encoder.{i}.self_norm")
            ffn(layer, f"encoder.{i}.ffn")
            norm(layer.norm2, f"encoder.{i}.ffn_norm")
        for i, layer in enumerate(model.decoder.layers):
            attention(layer.self_attn, f"decoder.{i}.self")
            norm(layer.norm1, f"decoder.{i}.self_norm")
            attention(layer.multihead_attn, f"decoder.{i}.cross")
            norm(layer.norm2, f"decoder.{i}.cross_norm")
            ffn(layer, f"decoder.{i}.ffn")
            norm(layer.norm3, f"decoder.{i}.ffn_norm")


def smoothed_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The same per-token mean as tfm: (1 - eps) NLL + eps * mean over the vocabulary of -log p,
    over non-pad targets (`cross_entropy` with `label_smoothing` computes exactly this)."""
    return nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        targets.reshape(-1).long(),
        ignore_index=PAD_ID,
        label_smoothing=LABEL_SMOOTHING,
    )


def matmul_ceiling(n: int = 2048, repeats: int = 5) -> float:
    a = torch.ones(n, n)
    a @ a
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


class TorchTraining:
    """One optimizer step per `run()` on a fixed batch: forward, label-smoothed loss, backward,
    Adam with the Eq. 3 schedule. `forward(src, tgt_in)` returns `[batch, tgt_len, vocab]`."""

    def __init__(self, w: Workload, model: nn.Module, forward):
        self.model = model
        batch = {k: torch.from_numpy(v).long() for k, v in training_batch(w).items()}
        self.loss = lambda: smoothed_loss(forward(batch["src"], batch["tgt_in"]), batch["tgt_out"])
        model.eval()
        with torch.no_grad():
            self.initial_loss = float(self.loss())
        model.train()
        self.optimizer = torch.optim.Adam(
            model.parameters(), lr=1.0, betas=(ADAM["b1"], ADAM["b2"]), eps=ADAM["eps"]
        )
        # LambdaLR calls the lambda with 0 for the first update; Eq. 3 counts from step 1.
        self.schedule = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: learning_rate(step + 1, w.shape.d_model)
        )

    def run(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.loss().backward()
        self.optimizer.step()
        self.schedule.step()


def Trainer(w: Workload, weights_path: str) -> TorchTraining:
    torch.manual_seed(0)
    model = TorchTransformer(w, DROPOUT)
    load_weights(model, neutral.load(weights_path))
    return TorchTraining(w, model, model)


class Decoder:
    """Greedy search without a cache: encode once, then re-run the decoder on the whole prefix."""

    def __init__(self, w: Workload, weights_path: str):
        if w.kind != "greedy":
            raise ValueError("nn.Transformer has no beam search")
        self.model = TorchTransformer(w, 0.0).eval()
        load_weights(self.model, neutral.load(weights_path))
        self.src = torch.from_numpy(decoding_source(w)).long()
        self.new_tokens = w.tgt_len

    @torch.inference_mode()
    def run(self) -> np.ndarray:
        memory = self.model.encode(self.src)
        tokens = torch.full((self.src.shape[0], 1), BOS_ID, dtype=torch.long)
        for _ in range(self.new_tokens):
            logits = self.model.decode(memory, self.src, tokens)[:, -1]
            tokens = torch.cat([tokens, logits.argmax(-1, keepdim=True)], dim=1)
        return tokens[:, 1:].numpy()
