#!/usr/bin/env python3
"""PyTorch baselines on the GPU for bench_cuda: the same workloads, shapes and timing.

bench_cuda runs this script and reads one line per workload:
    RESULT <key> <ms>
Keys: chain, sum, rowsum, softmax (PyTorch eager), copy (a device-to-device copy of the
chain's bytes, for comparing with kiln's copy baseline), gemm_<f32|bf16>_<n> (torch.matmul),
train_mlp (one SGD step of bench_train's MLP, loss read back).

Device times are CUDA events around batches of `--batch` calls, median of `--reps` batches
after warm-up, as bench_cuda times kiln. float32 matmuls keep PyTorch's default (no TF32),
which the line "torch: ..." reports. Without a CUDA device it prints why and exits 0;
`--device cpu` runs the same code on the CPU with host timers (to check the script itself).
"""
import argparse
import statistics
import sys
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--elems", type=int, default=128 << 20)
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--gemm", default="4096,1024")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = parser.parse_args()

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    on_gpu = args.device == "cuda"
    if on_gpu and not torch.cuda.is_available():
        print("bench_cuda_torch.py: torch sees no CUDA device; nothing to measure")
        return 0
    dev = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    name = torch.cuda.get_device_name(0) if on_gpu else "cpu"
    print(f"torch: {torch.__version__}, {name}, "
          f"tf32 matmul={torch.backends.cuda.matmul.allow_tf32}", flush=True)

    def device_ms(fn):
        for _ in range(2 * args.batch):
            fn()
        times = []
        if not on_gpu:
            for _ in range(args.reps):
                t0 = time.perf_counter()
                for _ in range(args.batch):
                    fn()
                times.append((time.perf_counter() - t0) * 1e3 / args.batch)
            return statistics.median(times)
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        for _ in range(args.reps):
            start.record()
            for _ in range(args.batch):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / args.batch)
        return statistics.median(times)

    def report(key, ms):
        print(f"RESULT {key} {ms:.6f}", flush=True)

    torch.manual_seed(0)
    n = args.elems
    a = torch.rand(n, device=dev)
    b = torch.rand(n, device=dev) - 0.5
    c = torch.rand(n, device=dev) - 0.5
    report("chain", device_ms(lambda: torch.relu(a * b + c) * 0.5))
    report("sum", device_ms(lambda: torch.relu(a * b + c).sum()))
    # The chain's bytes (3 reads + 1 write of n floats) as one copy: 2n floats each way.
    src = torch.empty(2 * n, device=dev).fill_(1.0)
    dst = torch.empty_like(src)
    report("copy", device_ms(lambda: dst.copy_(src)))
    del a, b, c, src, dst

    x = torch.rand(args.rows, n // args.rows, device=dev) * 4 - 2
    report("rowsum", device_ms(lambda: x.sum(1)))
    report("softmax", device_ms(lambda: torch.softmax(x, 1)))
    del x

    for dtype, tag in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        for size in (int(s) for s in args.gemm.split(",")):
            ga = torch.randn(size, size, device=dev).to(dtype)
            gb = torch.randn(size, size, device=dev).to(dtype)
            report(f"gemm_{tag}_{size}", device_ms(lambda: torch.matmul(ga, gb)))
            del ga, gb

    model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    xs = torch.randn(128, 784, device=dev)
    ys = torch.randint(0, 10, (128,), device=dev)

    def step():
        opt.zero_grad()
        loss = F.cross_entropy(model(xs), ys)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(3):
        step()
    times = []
    for _ in range(max(args.reps, 20)):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    report("train_mlp", statistics.median(times))
    return 0


if __name__ == "__main__":
    sys.exit(main())
