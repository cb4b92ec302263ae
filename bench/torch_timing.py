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


def allocator_peak_above_start(step):
    """The most bytes PyTorch's CPU allocator holds during one call of `step` beyond what it
    held when the call began: the running sum of torch.profiler's allocation events (frees
    of blocks allocated before the call are not reported, so free them before it)."""
    import json
    import tempfile

    import torch
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        step()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name) as trace:
            events = json.load(trace)["traceEvents"]
    held = peak = 0
    for ev in sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"]):
        if ev["args"].get("Device Type", 0) == 0:  # the CPU's
            held += ev["args"]["Bytes"]
            peak = max(peak, held)
    return peak
