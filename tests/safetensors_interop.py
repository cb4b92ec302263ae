"""Interop partner of tests/test_safetensors.cpp: reads and writes safetensors files with
the reference implementation (the `safetensors` package), through numpy or torch.

    safetensors_interop.py roundtrip numpy|torch IN OUT   load IN, save it again as OUT
    safetensors_interop.py write numpy|torch OUT          save the fixed tensors below

Exits 0 on success; any error is a non-zero exit with a traceback.
"""
import sys


def fixed_numpy():
    import numpy as np

    return {
        "f32": np.arange(12, dtype=np.float32).reshape(3, 4) * np.float32(0.5) - np.float32(2),
        "f64": np.array(3.25, dtype=np.float64),
        "f16": np.array([1.5, -0.0, np.inf, -65504.0], dtype=np.float16),
        "i64": np.arange(5, dtype=np.int64) * -3,
        "i32": np.zeros((0, 2), dtype=np.int32),
        "i16": np.array([-32768, 32767], dtype=np.int16),
        "i8": np.array([[-128, 5], [7, 127]], dtype=np.int8),
        "u8": np.arange(4, dtype=np.uint8) * np.uint8(60),
        "flag": np.array([True, False, True]),
    }


def main(argv):
    mode, framework = argv[1], argv[2]
    if framework == "numpy":
        from safetensors.numpy import load_file, save_file

        fixed = fixed_numpy
    elif framework == "torch":
        import torch
        from safetensors.torch import load_file, save_file

        def fixed():
            out = {k: torch.from_numpy(v.copy()) for k, v in fixed_numpy().items()}
            out["bf16"] = torch.tensor([1.0, -2.5, 3.0e38], dtype=torch.bfloat16)
            return out
    else:
        raise SystemExit("unknown framework " + framework)

    if mode == "roundtrip":
        from safetensors import safe_open

        src, dst = argv[3], argv[4]
        with safe_open(src, framework="np" if framework == "numpy" else "pt") as f:
            metadata = f.metadata()
        save_file(load_file(src), dst, metadata=metadata)
    elif mode == "write":
        save_file(fixed(), argv[3], metadata={"source": "safetensors_interop.py"})
    else:
        raise SystemExit("unknown mode " + mode)


if __name__ == "__main__":
    main(sys.argv)
