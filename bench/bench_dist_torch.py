#!/usr/bin/env python3
"""PyTorch baselines for bench_dist: the same models, per-rank batches, optimizer (Adam) and
threads per rank, data-parallel over Gloo on this machine's cores.

    bench_dist_torch.py --ranks N --threads T [--reps R] [--only TEXT]

starts N processes (torch.multiprocessing, Gloo over 127.0.0.1) and runs, for each model:
  zero 0  DistributedDataParallel + torch.optim.Adam (every rank holds all the state)
  zero 1  DistributedDataParallel + torch.distributed.optim.ZeroRedundancyOptimizer(Adam)
PyTorch has no ZeRO stage 2 of its own (that is DeepSpeed's or FSDP's), so it has no row
here. Rank 0 prints one line per model and stage:
    RESULT <model> <zero> <step_ms> <step_cpu_ms> <grad_bytes> <state_bytes>
step_ms / step_cpu_ms: medians of wall and process CPU time of rank 0's timed steps
(zero_grad, forward, backward with DDP's bucketed all-reduce, optimizer step, loss read
back) after warm-up; grad_bytes and state_bytes: the most any rank holds of parameter
gradients (p.grad) and optimizer state (tensors of the optimizer's state, step counters
left out). Nothing here installs PyTorch.
"""
import argparse
import os
import socket
import sys


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, args, port):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_models import TinyGPT
    from torch_timing import median_ms

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.set_num_threads(args.threads)

    def mlp():
        model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                              nn.Linear(1024, 10))
        x = torch.randn(args.mlp_batch, 784)
        y = torch.randint(0, 10, (args.mlp_batch,))
        return model, lambda m: F.cross_entropy(m(x), y)

    def transformer():
        model = TinyGPT()
        x = torch.randint(0, 128, (args.lm_batch, 128))
        y = torch.randint(0, 128, (args.lm_batch, 128))
        return model, lambda m: F.cross_entropy(m(x).reshape(-1, 128), y.reshape(-1))

    def gather_max(value):
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def state_bytes(opt):
        local = opt.optim if isinstance(opt, ZeroRedundancyOptimizer) else opt
        return sum(t.nbytes for s in local.state.values() for k, t in s.items()
                   if torch.is_tensor(t) and k != "step")

    for name, make in (("mlp", mlp), ("transformer", transformer)):
        if args.only and args.only not in name:
            continue
        for zero in (0, 1):
            torch.manual_seed(0)
            model, loss_fn = make()
            ddp = DDP(model)
            if zero == 0:
                opt = torch.optim.Adam(ddp.parameters(), lr=1e-4)
            else:
                opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam,
                                              lr=1e-4)
            grads = [0]

            def step():
                opt.zero_grad()
                loss = loss_fn(ddp)
                loss.backward()
                grads[0] = sum(p.grad.nbytes for p in ddp.parameters() if p.grad is not None)
                opt.step()
                return loss.item()

            ms, cpu = median_ms(step, args.warmup, args.reps)
            grad_max, state_max = gather_max(grads[0]), gather_max(state_bytes(opt))
            if rank == 0:
                print(f"RESULT {name} {zero} {ms:.3f} {cpu:.3f} {grad_max} {state_max}",
                      flush=True)
            dist.barrier()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--mlp-batch", type=int, default=32)
    parser.add_argument("--lm-batch", type=int, default=4)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    import torch.multiprocessing as mp

    mp.spawn(worker, args=(args, free_port()), nprocs=args.ranks, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
