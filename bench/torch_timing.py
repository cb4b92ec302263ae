"""Timing shared by the PyTorch sides of the benchmarks (bench_*_torch.py)."""
import statistics
import time


def median_ms(fn, warmup, reps):
    """(wall, process CPU) medians of `reps` calls of fn after `warmup` calls, in ms."""
    for _ in range(warmup):
        fn()
    walls, cpus = [], []
    for _ in range(reps):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append((time.perf_counter() - w0) * 1e3)
        cpus.append((time.process_time() - c0) * 1e3)
    return statistics.median(walls), statistics.median(cpus)
