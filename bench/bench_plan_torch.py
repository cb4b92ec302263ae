"""The PyTorch side of bench_plan (issue 27 section 4): bench_plan's three training steps
(the 32-layer MLP with SGD, the character LSTM with Adam, the 6-layer Transformer with
AdamW; the same shapes, one fixed batch) under PyTorch's activation checkpointing methods,
each measured the same way as kiln's rows:

- time: the median wall and process CPU time of `--reps` steps after two warm-ups;
- memory: the most bytes PyTorch's CPU allocator held during one more step beyond what it
  held when the step began (the running sum of torch.profiler's allocation events). The
  optimizer steps inside the backward pass and frees each gradient after its update
  (optimizer-in-backward), as kiln frees each gradient after its update.

Methods: `none` (plain eager); the MLP `seq<k>` (torch.utils.checkpoint.checkpoint_sequential
in k segments); the LSTM `chunks<k>` (the sequence cut into k chunks, each checkpointed with
the state carried: nn.LSTM is one op, so this is how PyTorch checkpoints it); the
Transformer `layer` (every layer checkpointed), `every<k>` (k layers per checkpoint) and
`selective` (every layer checkpointed with matrix products saved and the rest recomputed:
create_selective_checkpoint_contexts). Prints `RESULT <model> <method> <wall ms> <cpu ms>
<peak bytes above the step's start>` per method."""
import argparse
import functools
import sys

from torch_timing import allocator_peak_above_start, median_ms  # bench/


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--model", choices=["mlp", "lstm", "transformer"], required=True)
    args = parser.parse_args()
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.checkpoint import (CheckpointPolicy, checkpoint, checkpoint_sequential,
                                        create_selective_checkpoint_contexts)
    from torch_models import TinyGPT  # bench/, the directory of this script

    torch.set_num_threads(args.threads)

    def measure(model, make_opt, loss_fn):
        # The optimizer steps inside the backward pass, one parameter at a time, and frees
        # each gradient at once (PyTorch's optimizer-in-backward recipe, with
        # register_post_accumulate_grad_hook): kiln frees each gradient after its update too,
        # so neither side's peak is all the gradients at once.
        opts = {p: make_opt([p]) for p in model.parameters()}

        def update(p):
            opts[p].step()
            p.grad = None

        for p in model.parameters():
            p.register_post_accumulate_grad_hook(update)

        def step():
            loss = loss_fn()
            loss.backward()
            return loss.item()

        wall, cpu = median_ms(step, 2, args.reps)
        return wall, cpu, allocator_peak_above_start(step)

    def report(method, result):
        print(f"RESULT {args.model} {method} {result[0]:.3f} {result[1]:.3f} {result[2]}",
              flush=True)

    if args.model == "mlp":
        for method, segments in [("none", 0), ("seq2", 2), ("seq4", 4), ("seq8", 8),
                                 ("seq16", 16), ("seq32", 32)]:
            torch.manual_seed(42)
            layers = []
            for _ in range(32):
                layers += [nn.Linear(1024, 1024), nn.ReLU()]
            model = nn.Sequential(*layers, nn.Linear(1024, 10))
            opt = lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9)
            x, y = torch.randn(256, 1024), torch.randint(0, 10, (256,))

            def loss_fn(model=model, segments=segments, x=x, y=y):
                out = (model(x) if segments == 0 else
                       checkpoint_sequential(model, segments, x, use_reentrant=False))
                return F.cross_entropy(out, y)

            report(method, measure(model, opt, loss_fn))
    elif args.model == "lstm":
        class CharLSTM(nn.Module):
            def __init__(self, chunks):
                super().__init__()
                self.embed = nn.Embedding(128, 128)
                self.lstm = nn.LSTM(128, 256, batch_first=True)
                self.head = nn.Linear(256, 128)
                self.chunks = chunks

            def forward(self, tokens):
                e = self.embed(tokens)
                if self.chunks == 0:
                    return self.head(self.lstm(e)[0])
                b = tokens.shape[0]
                h = torch.zeros(1, b, 256)
                c = torch.zeros(1, b, 256)
                outs = []
                for piece in e.chunk(self.chunks, dim=1):
                    out, (h, c) = checkpoint(lambda p, h, c: self.lstm(p, (h, c)), piece, h, c,
                                             use_reentrant=False)
                    outs.append(out)
                return self.head(torch.cat(outs, 1))

        for method, chunks in [("none", 0), ("chunks2", 2), ("chunks4", 4), ("chunks8", 8),
                               ("chunks16", 16), ("chunks32", 32)]:
            torch.manual_seed(42)
            model = CharLSTM(chunks)
            opt = lambda ps: torch.optim.Adam(ps, lr=1e-3)
            x, y = torch.randint(0, 128, (32, 256)), torch.randint(0, 128, (32 * 256,))
            report(method, measure(model, opt, lambda model=model, x=x, y=y: F.cross_entropy(
                model(x).reshape(-1, 128), y)))
    else:
        saved_ops = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
                     torch.ops.aten.bmm.default, torch.ops.aten.baddbmm.default,
                     torch.ops.aten.linear.default,
                     torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
                     torch.ops.aten._scaled_dot_product_efficient_attention.default}

        def policy(ctx, op, *a, **k):
            return (CheckpointPolicy.MUST_SAVE if op in saved_ops
                    else CheckpointPolicy.PREFER_RECOMPUTE)

        def forward(model, tokens, group, selective):
            t = tokens.shape[1]
            h = model.embed(tokens) + model.pos(torch.arange(t))
            mask = model.mask[:t, :t]
            layers = list(model.blocks.layers)

            def run(h, first, last):
                for layer in layers[first:last]:
                    h = layer(h, src_mask=mask, is_causal=True)
                return h

            for first in range(0, len(layers), max(group, 1)):
                last = min(first + max(group, 1), len(layers))
                if group == 0:
                    h = run(h, first, last)
                elif selective:
                    h = checkpoint(run, h, first, last, use_reentrant=False,
                                   context_fn=functools.partial(
                                       create_selective_checkpoint_contexts, policy))
                else:
                    h = checkpoint(run, h, first, last, use_reentrant=False)
            return model.head(h)

        for method, group, selective in [("none", 0, False), ("selective", 1, True),
                                         ("every3", 3, False), ("every2", 2, False),
                                         ("layer", 1, False)]:
            torch.manual_seed(42)
            model = TinyGPT(layers=6, seq=512)
            opt = lambda ps: torch.optim.AdamW(ps, lr=3e-4, weight_decay=0.01)
            x, y = torch.randint(0, 128, (16, 256)), torch.randint(0, 128, (16 * 256,))
            report(method, measure(model, opt, lambda model=model, x=x, y=y, g=group,
                                   s=selective: F.cross_entropy(
                                       forward(model, x, g, s).reshape(-1, 128), y)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
