"""PyTorch partner of tests/test_trainapi_parity.cpp: computes with torch what the test
computed with kiln, and prints one line per named result:

    NAME v0 v1 ...

Usage: trainapi_torch.py MODE IN.safetensors SPEC_JSON

MODE losses: IN holds the loss inputs (see losses()); SPEC is unused.
MODE optim: IN holds p.<i>, t.<i>, w.<i> (float64); SPEC is {"optimizer": name, "groups":
  [[param indices, options], ...], "defaults": {constructor options}, "steps": n}. Each
  step minimises sum(w * (p - t)^2) over every parameter; prints the parameters after
  every step.
MODE sched: IN is unused; SPEC is {"scheduler": name, "lrs": [per-group lr],
  "optimizer": name, "options": {...}, "kwargs": {...}, "steps": n, "metrics": [...]} and
  prints every group's lr (and momentum or betas[0] when the group has one) after
  construction and after every step.
IN is read by safetensors_torch_load.py, so torch is the only package needed. Exits non-zero with a traceback on any error.
"""
import json
import sys

import torch
import torch.nn.functional as F

from safetensors_torch_load import load


def emit(name, t):
    values = torch.as_tensor(t, dtype=torch.float64).reshape(-1).tolist()
    print(name + " " + " ".join(repr(float(v)) for v in values), flush=True)


def value_and_grad(fn, x):
    """fn(x) and the gradient of its sum with respect to x."""
    x = x.clone().requires_grad_()
    y = fn(x)
    (g,) = torch.autograd.grad(y.sum(), x)
    return y.detach(), g


def losses(t):
    reductions = ["none", "mean", "sum"]
    for log_target in (False, True):
        target = t["kl_tl"] if log_target else t["kl_t"]
        for red in reductions + ["batchmean"]:
            y, g = value_and_grad(
                lambda x: F.kl_div(x, target, reduction=red, log_target=log_target), t["kl_in"])
            emit(f"kl_{red}_{int(log_target)}", y)
            emit(f"kl_{red}_{int(log_target)}_grad", g)
    for delta in (0.5, 1.0, 2.0):
        for red in reductions:
            y, g = value_and_grad(
                lambda x: F.huber_loss(x, t["h_y"], reduction=red, delta=delta), t["h_x"])
            emit(f"huber_{red}_{delta}", y)
            emit(f"huber_{red}_{delta}_grad", g)
    for weighted in (False, True):
        w = t["b_w"] if weighted else None
        for red in reductions:
            emit(f"bce_{red}_{int(weighted)}",
                 F.binary_cross_entropy(t["b_x"], t["b_y"], weight=w, reduction=red))
            _, g = value_and_grad(
                lambda x: F.binary_cross_entropy(x, t["b_y"], weight=w, reduction=red), t["b_xi"])
            emit(f"bce_{red}_{int(weighted)}_grad", g)


OPTIMIZERS = {"RMSprop": torch.optim.RMSprop, "Adagrad": torch.optim.Adagrad,
              "SGD": torch.optim.SGD, "Adam": torch.optim.Adam}


def optim(t, spec):
    n = len([k for k in t if k.startswith("p.")])
    params = [t[f"p.{i}"].clone().requires_grad_() for i in range(n)]
    groups = [{"params": [params[i] for i in idx], **opts} for idx, opts in spec["groups"]]
    # Adagrad fills its state at construction from the constructor's
    # initial_accumulator_value, not the group's: such options go in "defaults".
    opt = OPTIMIZERS[spec["optimizer"]](groups, foreach=False, **spec.get("defaults", {}))
    for step in range(spec["steps"]):
        opt.zero_grad()
        loss = sum((t[f"w.{i}"] * (params[i] - t[f"t.{i}"]) ** 2).sum() for i in range(n))
        loss.backward()
        opt.step()
        for i in range(n):
            emit(f"step{step}.p{i}", params[i].detach())


def sched(spec):
    from torch.optim import lr_scheduler as S

    params = [torch.zeros(1, requires_grad=True) for _ in spec["lrs"]]
    groups = [{"params": [p], "lr": lr} for p, lr in zip(params, spec["lrs"])]
    opt = OPTIMIZERS[spec["optimizer"]](groups, **spec.get("options", {}))
    kwargs = dict(spec.get("kwargs", {}))
    name = spec["scheduler"]
    if name == "LambdaLR":
        # The C++ test uses the same closed form.
        kwargs["lr_lambda"] = lambda e: 0.5 ** (e // 3) + 0.01 * e
    scheduler = getattr(S, name)(opt, **kwargs)

    def report(step):
        for g, group in enumerate(opt.param_groups):
            emit(f"step{step}.lr{g}", group["lr"])
            if "betas" in group:
                emit(f"step{step}.m{g}", group["betas"][0])
            elif group.get("momentum", 0) != 0:
                emit(f"step{step}.m{g}", group["momentum"])

    report(0)
    metrics = spec.get("metrics", [])
    for step in range(1, spec["steps"] + 1):
        opt.step()
        if name == "ReduceLROnPlateau":
            scheduler.step(metrics[step - 1])
        else:
            scheduler.step()
        report(step)


def main(argv):
    mode, path, spec = argv[1], argv[2], json.loads(argv[3])
    torch.manual_seed(0)
    torch.set_num_threads(1)  # deterministic and quick; the sizes are tiny
    torch.set_default_dtype(torch.float64)
    if mode == "losses":
        losses(load(path))
    elif mode == "optim":
        optim(load(path), spec)
    elif mode == "sched":
        sched(spec)
    else:
        raise SystemExit(f"unknown mode {mode}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
