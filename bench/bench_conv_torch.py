#!/usr/bin/env python3
"""torch.nn.functional.conv2d baseline for bench_conv: the same shapes and thread count.

bench_conv runs this script when `import torch` works and reads one line per shape and mode:
    RESULT <index> <backward> <wall_ms> <cpu_ms>
(medians after warm-up of wall and process CPU milliseconds; backward = 1 for the step
y = conv2d(x, w, b), y.backward(dy), which materializes dx, dw and db), plus one line
    INFO <what runs PyTorch's CPU convolution>
Shapes are given as N,C,H,W,O,k,stride,pad. Nothing here installs PyTorch.
"""
import argparse

import torch
import torch.nn.functional as F

from torch_timing import median_ms  # bench/, the directory of this script


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("shapes", nargs="+", help="N,C,H,W,O,k,stride,pad")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"INFO torch {torch.__version__}, mkldnn (oneDNN) "
          f"{'on' if torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled else 'off'}",
          flush=True)
    for index, spec in enumerate(args.shapes):
        n, c, h, w, o, k, stride, pad = (int(v) for v in spec.split(","))
        x = torch.rand(n, c, h, w) - 0.5
        weight = (torch.rand(o, c, k, k) - 0.5) * 0.2
        bias = torch.rand(o) - 0.5
        # The same rule as bench_conv's reps_for: fewer repetitions for large products.
        oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        gflop = 2.0 * n * o * oh * ow * c * k * k * 1e-9
        dy = torch.rand(n, o, oh, ow) - 0.5

        def forward():
            with torch.no_grad():
                F.conv2d(x, weight, bias, stride, pad)

        xg, wg, bg = (t.clone().requires_grad_() for t in (x, weight, bias))

        def step():
            for t in (xg, wg, bg):
                t.grad = None
            y = F.conv2d(xg, wg, bg, stride, pad)
            y.backward(dy)

        for backward, fn in ((0, forward), (1, step)):
            work = gflop * (3 if backward else 1)
            reps = max(3, args.reps // 2) if work > 6 else args.reps
            wall, cpu = median_ms(fn, 1, reps)
            print(f"RESULT {index} {backward} {wall:.6f} {cpu:.6f}", flush=True)


if __name__ == "__main__":
    main()
