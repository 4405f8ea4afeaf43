"""The default model's float weights in benchmarks/gpu_kit.sh's kit: ``half PATH`` rounds a safetensors file's
float32 tensors to float16 (for the trip to a GPU machine), ``float PATH`` turns its float16 tensors back into
float32 (there, by gpu_check.sh). Other tensors (the position ids) are left as they are; the file is rewritten
in place."""

from __future__ import annotations

import sys

import torch
from safetensors.torch import load_file, save_file


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("half", "float"):
        print("usage: python benchmarks/kit_weights.py half|float PATH", file=sys.stderr)
        return 2
    how, path = argv
    src, dst = (torch.float32, torch.float16) if how == "half" else (torch.float16, torch.float32)
    tensors = load_file(path)
    save_file({k: (v.to(dst) if v.dtype == src else v).contiguous() for k, v in tensors.items()}, path,
              metadata={"format": "pt"})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
