"""The PyTorch side of bench_seqlen: bench_seqlen.cpp's encoder (6 post-norm layers, d_model
256, 4 heads, feed-forward 1024, no dropout; token and position embeddings; a Linear to the
vocabulary; cross entropy on every position; AdamW), trained eagerly on one fixed batch.

Prints `RESULT <wall ms> <cpu ms> <peak bytes above the step's start>`: the medians of
`--reps` timed steps after two warm-ups, and the most bytes PyTorch's CPU allocator had
allocated during one more step beyond what it held when the step began (the running sum of
the profiler's allocation events: torch.profiler with profile_memory). Each step begins with
zero_grad(set_to_none=True) with the last step's gradients already freed, so gradients
count in the step, as they do in kiln's."""
import argparse
import sys

from torch_timing import allocator_peak_above_start, median_ms  # bench/


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    vocab, d = 128, 256

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.pos = nn.Embedding(512, d)
            layer = nn.TransformerEncoderLayer(d, 4, dim_feedforward=1024, dropout=0.0,
                                               batch_first=True, norm_first=False)
            self.blocks = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)
            self.head = nn.Linear(d, vocab)

        def forward(self, tokens):
            h = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1]))
            return self.head(self.blocks(h))

    model = Encoder()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    x = torch.randint(0, vocab, (args.batch, args.seq))
    y = torch.randint(0, vocab, (args.batch * args.seq,))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).reshape(-1, vocab), y)
        loss.backward()
        opt.step()
        return loss.item()

    wall, cpu = median_ms(step, 2, args.reps)
    # Gradients are freed before the profiled step, as kiln's steps free theirs at the end:
    # a free of a block allocated before profiling would not be reported.
    opt.zero_grad(set_to_none=True)
    peak = allocator_peak_above_start(step)
    print(f"RESULT {wall:.3f} {cpu:.3f} {peak}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
