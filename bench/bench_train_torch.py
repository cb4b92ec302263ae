#!/usr/bin/env python3
"""PyTorch baselines for bench_train (and bench_plan's Transformer rows in fp32/bf16/fp16,
plan_transformer_6x256_h4_s256_b16): the same models, shapes, optimizers and threads, run
eagerly or (--compile) with the model under torch.compile (inductor's C++ kernels; the
optimizer step stays eager, as in the usual `model = torch.compile(model)`), in float32 or
(--amp bf16|fp16) with forward and loss under torch.autocast("cpu", dtype), fp16 with a
torch.amp.GradScaler("cpu").

bench_train runs this script when `import torch` works and reads one line per workload:
    RESULT <name> <step_ms> <step_cpu_ms> <peak_bytes> <saved_bytes> <saved_all_bytes>
or, when the step fails (torch.compile without a working C++ toolchain, say):
    NOTE <name> <reason>
step_ms / step_cpu_ms are the medians of wall and process CPU time of timed training steps
(forward, backward, optimizer step, loss read back) after warm-up; with --compile the
warm-up includes compiling. peak_bytes is the growth of the process's peak resident set size
(ru_maxrss) over the run, which covers parameters, optimizer state, activations and
allocator caching: PyTorch's CPU allocator keeps no statistics of its own. saved_bytes are
the activations autograd keeps for backward in one more (untimed) eager step: the tensors
saved through torch.autograd.graph.saved_tensors_hooks, each storage counted once, leaving
out parameters, the batch and half-precision copies of either (autocast's weight casts),
as bench_train counts kiln's; saved_all_bytes counts those too (-1 for both under
--compile). Nothing here installs PyTorch.
"""
import argparse
import os
import resource
import sys

from torch_timing import median_ms  # bench/, the directory of this script


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--only", default="")
    parser.add_argument("--compile", action="store_true",
                        help="run the model under torch.compile instead of eagerly")
    parser.add_argument("--amp", choices=["off", "bf16", "fp16"], default="off",
                        help="forward and loss under torch.autocast(\"cpu\", dtype)")
    args = parser.parse_args()

    # Inductor's compile workers would compete with the benchmark on a small shared machine.
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch_models import TinyGPT  # bench/, the directory of this script

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    def maybe_compile(model):
        return torch.compile(model) if args.compile else model

    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    # float16 scales the loss, as kiln's examples and bench_train do; bfloat16 needs none.
    scaler = torch.amp.GradScaler("cpu", enabled=amp_dtype == torch.float16)

    def autocast():
        return torch.autocast("cpu", dtype=amp_dtype or torch.bfloat16,
                              enabled=amp_dtype is not None)

    def train(opt, loss_fn):
        # One step: zero_grad, forward and loss (under autocast when --amp), backward, update.
        opt.zero_grad()
        with autocast():
            loss = loss_fn()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.item()

    def mlp():
        model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                              nn.Linear(1024, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        model = maybe_compile(model)
        x = torch.randn(128, 784)
        y = torch.randint(0, 10, (128,))

        def step():
            return train(opt, lambda: F.cross_entropy(model(x), y))

        return step, model, (x, y)

    def lm_step(model, opt, vocab, batch, seq):
        # One language-model step on fixed random tokens, as bench_train does.
        x = torch.randint(0, vocab, (batch, seq))
        y = torch.randint(0, vocab, (batch, seq))

        def step():
            return train(opt, lambda: F.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1)))

        return step, model, (x, y)

    class CharLSTM(nn.Module):
        def __init__(self, vocab=128, embed=128, hidden=256):
            super().__init__()
            self.embed = nn.Embedding(vocab, embed)
            self.lstm = nn.LSTM(embed, hidden, batch_first=True)
            self.head = nn.Linear(hidden, vocab)

        def forward(self, tokens):
            out, _ = self.lstm(self.embed(tokens))
            return self.head(out)

    def lstm():
        model = CharLSTM()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        return lm_step(maybe_compile(model), opt, 128, 32, 64)

    def transformer():
        model = TinyGPT()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
        return lm_step(maybe_compile(model), opt, 128, 16, 128)

    # Ops that copy, cast or re-view one tensor: a saved tensor made of a leaf by these alone
    # (autocast's bfloat16 weight, seen transposed by the product) is no activation.
    copies = {"ToCopyBackward0", "TBackward0", "TransposeBackward0", "ViewBackward0",
              "UnsafeViewBackward0", "PermuteBackward0", "ExpandBackward0", "AccumulateGrad"}

    def of_leaf(fn):
        if fn is None:
            return True
        if type(fn).__name__ not in copies:
            return False
        return all(of_leaf(n) for n, _ in fn.next_functions)

    def saved_bytes(step, model, batch):
        # Bytes autograd saves for backward in one step, each storage once: (activations,
        # everything). Parameters, the batch and copies of them (a tensor that needs no
        # gradient, or whose history is casts and views of a parameter) are not activations.
        leaves = {p.untyped_storage().data_ptr() for p in model.parameters()}
        leaves |= {t.untyped_storage().data_ptr() for t in batch}
        activations, everything = {}, {}

        def pack(t):
            ptr = t.untyped_storage().data_ptr()
            everything[ptr] = t.untyped_storage().nbytes()
            if ptr not in leaves and t.requires_grad and not of_leaf(t.grad_fn):
                activations[ptr] = everything[ptr]
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            step()
        return sum(activations.values()), sum(everything.values())

    def plan_transformer():
        # bench_plan's Transformer: 6 layers, positions up to 512, 16 sequences of 256.
        model = TinyGPT(layers=6, seq=512)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
        return lm_step(maybe_compile(model), opt, 128, 16, 256)

    class Attention(nn.Module):
        # bench_train's attention rows: q, k, v trained directly through causal SDPA.
        def __init__(self, batch, seq):
            super().__init__()
            self.q, self.k, self.v = (nn.Parameter(torch.randn(batch, 8, seq, 64))
                                      for _ in range(3))

        def forward(self):
            return F.scaled_dot_product_attention(self.q, self.k, self.v, is_causal=True)

    def attention(batch, seq):
        def make():
            model = Attention(batch, seq)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            run = maybe_compile(model)

            def step():
                return train(opt, lambda: run().pow(2).mean())

            return step, model, ()
        return make

    workloads = [("train_mlp_784_1024_1024_10_b128", mlp, 3),
                 ("train_lstm_h256_s64_b32", lstm, 2),
                 ("train_transformer_2x256_h4_s128_b16", transformer, 2),
                 ("plan_transformer_6x256_h4_s256_b16", plan_transformer, 2)]
    # kiln's flash and composed rows both compare with torch's own SDPA.
    for kind in ("flash", "math"):
        workloads += [(f"train_attention_{kind}_s512_h8_d64_b2", attention(2, 512), 2),
                      (f"train_attention_{kind}_s1024_h8_d64_b1", attention(1, 1024), 2)]
    for name, make, warmup in workloads:
        if args.only and args.only not in name:
            continue
        before = peak_rss_bytes()
        try:
            step, model, batch = make()
            ms, cpu = median_ms(step, warmup, args.reps)
            peak = peak_rss_bytes() - before
            saved, saved_all = saved_bytes(step, model, batch) if not args.compile else (-1, -1)
        except Exception as exc:  # inductor without a C++ toolchain, an unsupported op...
            reason = " ".join(str(exc).split())[:160] or type(exc).__name__
            what = "torch.compile" if args.compile else "eager step"
            print(f"NOTE {name} {what} failed: {type(exc).__name__}: {reason}", flush=True)
            continue
        print(f"RESULT {name} {ms:.3f} {cpu:.3f} {peak} {saved} {saved_all}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
