#!/usr/bin/env python3
"""torch.matmul baseline for bench_gemm: the same float32 shapes and thread count.

bench_gemm runs this script when `import torch` works and reads one line per shape:
    RESULT <m> <n> <k> <ta> <wall_ms> <cpu_ms>
(medians after warm-up; ta = 1 when A is used transposed). Nothing here installs PyTorch.
"""
import argparse
import statistics
import time

import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("shapes", nargs="+", help="m,n,k,ta")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for spec in args.shapes:
        m, n, k, ta = (int(v) for v in spec.split(","))
        a = torch.rand(k, m) - 0.5 if ta else torch.rand(m, k) - 0.5
        b = torch.rand(k, n) - 0.5
        lhs = a.t() if ta else a
        for _ in range(2):
            torch.matmul(lhs, b)
        walls, cpus = [], []
        for _ in range(args.reps):
            w0, c0 = time.perf_counter(), time.process_time()
            torch.matmul(lhs, b)
            walls.append((time.perf_counter() - w0) * 1e3)
            cpus.append((time.process_time() - c0) * 1e3)
        print(f"RESULT {m} {n} {k} {ta} {statistics.median(walls):.6f} {statistics.median(cpus):.6f}",
              flush=True)


if __name__ == "__main__":
    main()
