"""PyTorch partner of tests/test_amp_parity.cpp: trains the test's MLP for a few steps under
torch.autocast("cpu", torch.bfloat16) from the initial weights and data kiln saved, and
prints one line per step:

    LOSS <step> <loss>

Usage: amp_parity_torch.py IN.safetensors STEPS LR MOMENTUM. IN holds 0.weight, 0.bias,
2.weight, 2.bias (a Linear-ReLU-Linear nn.Sequential), x (float32 [N, in]) and y (int64
[N]). The file is read by safetensors_torch_load.py, so torch is the only package
needed. Exits non-zero with a traceback on any error.
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from safetensors_torch_load import load


def main(argv):
    path, steps, lr, momentum = argv[1], int(argv[2]), float(argv[3]), float(argv[4])
    torch.manual_seed(0)
    torch.set_num_threads(1)  # deterministic and quick; the sizes are tiny
    t = load(path)
    w0, w2 = t["0.weight"], t["2.weight"]
    model = nn.Sequential(nn.Linear(w0.shape[1], w0.shape[0]), nn.ReLU(),
                          nn.Linear(w2.shape[1], w2.shape[0]))
    model.load_state_dict({k: t[k] for k in ("0.weight", "0.bias", "2.weight", "2.bias")})
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    x, y = t["x"], t["y"]
    for step in range(steps):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        assert loss.dtype == torch.float32, loss.dtype
        loss.backward()
        opt.step()
        print(f"LOSS {step} {loss.item():.9g}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
