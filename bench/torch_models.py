"""Models the PyTorch peers share (bench_train_torch.py, bench_dist_torch.py). Import it
after setting the environment torch reads at import time."""
import torch
import torch.nn as nn


class TinyGPT(nn.Module):
    """bench_models.h's GPT: token and position embeddings (d_model 256), causal pre-norm
    encoder layers (4 heads, feed-forward 1024, dropout 0.1), Linear(256, vocab)."""

    def __init__(self, vocab=128, d=256, heads=4, layers=2, seq=128):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=4 * d, dropout=0.1,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq))

    def forward(self, tokens):
        t = tokens.shape[1]
        h = self.embed(tokens) + self.pos(torch.arange(t))
        return self.head(self.blocks(h, mask=self.mask[:t, :t], is_causal=True))
