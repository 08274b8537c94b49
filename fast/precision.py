"""The compute precision of a forward: bf16 autocast over fp32 weights, or none (--dtype)."""
import contextlib

import torch


def precision(device, dtype):
    """The compute context of a forward: bf16 autocast over fp32 weights ("bf16"), or nothing
    ("fp32")."""
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16) if dtype == "bf16" \
        else contextlib.nullcontext()
