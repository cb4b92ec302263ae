"""The PyTorch side of tests/torch_parity.h: runs one layer or functional op on the inputs
and state kiln wrote, and writes what PyTorch computes for kiln to compare.

usage: layers_parity_torch.py CASES.json

CASES.json is a list of cases, each with "data" (a safetensors file: inputs "in.<i>" and
the module's state "state.<name>" before the call), "gouts" (upstream gradients "gout.<i>"),
"module" (a Python expression building the torch module, or "" for a functional case),
"grad_inputs" (how many leading inputs are differentiated; -1: every floating one), "call"
(an expression over m, x, torch, nn and F giving a tensor or a nested tuple of tensors),
"train" (the module's mode) and "result" (where to write "out.<i>", "grad.in.<i>",
"grad.param.<name>" and "state.<name>" after the call). The module's state is loaded
strictly, so a parameter name or shape that differs from PyTorch's fails here; the torch
module's parameter order is written as metadata "params". A failing case is reported on
stdout and the others still run.
"""
import json
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file


def flatten(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if value is None:
        return []
    out = []
    for v in value:
        out.extend(flatten(v))
    return out


def run(case):
    data = load_file(case["data"])
    data.update(load_file(case["gouts"]))
    torch.manual_seed(0)
    x = []
    i = 0
    while f"in.{i}" in data:
        t = data[f"in.{i}"]
        if t.is_floating_point() and (case["grad_inputs"] < 0 or i < case["grad_inputs"]):
            t.requires_grad_()
        x.append(t)
        i += 1
    m = None
    keys = []
    if case["module"]:
        m = eval(case["module"], {"torch": torch, "nn": nn, "F": F})
        m = m.double()
        keys = [name for name, _ in m.named_parameters()]
        state = {k[len("state."):]: v for k, v in data.items() if k.startswith("state.")}
        m.load_state_dict(state, strict=True)
        m.train(case["train"])
    outs = flatten(eval(case["call"], {"torch": torch, "nn": nn, "F": F, "m": m, "x": x}))
    loss = None
    for j, o in enumerate(outs):
        g = data.get(f"gout.{j}")
        if g is None or not o.requires_grad:
            continue
        term = (o * g).sum()
        loss = term if loss is None else loss + term
    result = {}
    for j, o in enumerate(outs):
        result[f"out.{j}"] = o.detach().contiguous()
    params = list(m.named_parameters()) if m is not None else []
    if loss is not None:
        leaves = [t for t in x if t.requires_grad] + [p for _, p in params]
        grads = torch.autograd.grad(loss, leaves, allow_unused=True)
        k = 0
        for j, t in enumerate(x):
            if t.requires_grad:
                if grads[k] is not None:
                    result[f"grad.in.{j}"] = grads[k].contiguous()
                k += 1
        for (name, _), g in zip(params, grads[k:]):
            if g is not None:
                result[f"grad.param.{name}"] = g.contiguous()
    if m is not None:
        for name, v in m.state_dict().items():
            result[f"state.{name}"] = v.detach().clone().contiguous()
    save_file(result, case["result"], metadata={"params": ",".join(keys)})


def main():
    for case in json.load(open(sys.argv[1])):
        try:
            run(case)
        except Exception as e:  # reported per case; the others still run
            print(f"CASE {case['result']} FAILED: {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    main()
