"""0. The environment: Python, torch, CUDA, cuDNN, the device, TF32 flags, threads, which packages import."""

from __future__ import annotations

import contextlib
import importlib
import os
import platform
import sys

import torch

from .common import REPO, _f


def run(suite, e: dict) -> None:
    e["python"] = sys.version.split()[0]
    e["platform"] = platform.platform()
    e["torch"] = torch.__version__
    e["torch_cuda"] = torch.version.cuda
    e["cuda_available"] = torch.cuda.is_available()
    e["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    e["threads"] = torch.get_num_threads()
    e["cpu_count"] = os.cpu_count()
    e["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    e["tf32_cudnn"] = torch.backends.cudnn.allow_tf32
    e["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    if suite.device.type == "cuda":
        p = torch.cuda.get_device_properties(suite.device)
        e["device_name"] = p.name
        e["capability"] = f"{p.major}.{p.minor}"
        e["device_memory_gib"] = p.total_memory / 2**30
        e["multiprocessors"] = p.multi_processor_count
    else:
        e["device_name"] = platform.processor() or platform.machine()
    imports = {}
    for name in ("lightning", "jsonargparse", "wandb", "torchvision", "sklearn", "numpy", "lfed"):
        try:
            mod = importlib.import_module(name)
            imports[name] = getattr(mod, "__version__", "imported")
        except Exception as err:  # noqa: BLE001
            imports[name] = f"not importable: {type(err).__name__}: {err}"
    e["imports"] = imports
    import lfed

    e["lfed_file"] = lfed.__file__
    with contextlib.suppress(Exception):
        import subprocess

        e["git_commit"] = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                                         timeout=10).stdout.strip() or None
    if suite.device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but torch.cuda.is_available() is False")


def markdown(e: dict) -> list[str]:
    """This section's part of gpu_suite.md."""
    L: list[str] = []
    L += ["## Environment", "", "| | |", "| --- | --- |"]
    for k in ("device_name", "capability", "device_memory_gib", "python", "torch", "torch_cuda", "cudnn", "threads", "cpu_count",
              "tf32_matmul", "tf32_cudnn", "float32_matmul_precision", "platform"):
        if k in e:
            L.append(f"| {k} | {_f(e[k])} |")
    for k, v in e.get("imports", {}).items():
        L.append(f"| import {k} | {v} |")
    L.append("")
    return L
