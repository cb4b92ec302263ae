#!/usr/bin/env python3
"""PyTorch baselines for bench_fused: the same workloads, shapes and thread count.

bench_fused runs this script when `import torch` works and reads one line per workload:
    RESULT <name> <eager_ms> <eager_cpu_ms> <compile_ms> <compile_cpu_ms>
(medians after warm-up of wall and process CPU milliseconds; the compile pair is -1 when
torch.compile fails, and a line "NOTE <name> <reason>" says why). Names are bench_fused's
workload names with every non-alphanumeric run replaced by '_'.
Nothing here installs PyTorch.
"""
import argparse
import sys

from torch_timing import median_ms  # bench/, the directory of this script


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    def relu_sum(a, b, c):
        return torch.relu(a * b + c).sum()

    def chain6(a, b, c):
        return ((((a * b + c) * 0.5) - a) * b) + c

    def softmax_rows(x):
        return torch.softmax(x, dim=1)

    workloads = []
    for n, tag in ((4 << 20, "4M"), (16 << 20, "16M")):
        a = torch.rand(n)
        b = torch.rand(n) - 0.5
        c = torch.rand(n) - 0.5
        workloads.append((f"relu_a_b_c_sum_{tag}", relu_sum, (a, b, c)))
        workloads.append((f"6_op_chain_{tag}", chain6, (a, b, c)))
    x = torch.rand(4096, 4096) - 0.5
    workloads.append(("row_softmax_4096x4096", softmax_rows, (x,)))
    pieces = [torch.rand(1, 512, 512) - 0.5 for _ in range(16)]
    workloads.append(
        ("concat_of_16_pieces_16x512x512", lambda *p: torch.cat(p, 0) * 2.0, tuple(pieces))
    )

    with torch.no_grad():
        for name, fn, inputs in workloads:
            eager = median_ms(lambda: fn(*inputs), 3, args.reps)
            try:
                compiled_fn = torch.compile(fn)
                compiled = median_ms(lambda: compiled_fn(*inputs), 3, args.reps)
            except Exception as exc:  # no C++ toolchain for inductor, unsupported version...
                reason = " ".join(str(exc).split())[:160] or type(exc).__name__
                print(f"NOTE {name} torch.compile failed: {reason}", flush=True)
                compiled = (-1.0, -1.0)
            print(f"RESULT {name} {eager[0]:.6f} {eager[1]:.6f} {compiled[0]:.6f} "
                  f"{compiled[1]:.6f}", flush=True)


if __name__ == "__main__":
    main()
