"""The memory plan: what a run holds at its peak, estimated from the model's config alone (no weights loaded).

    plan = memory_plan(shape, config)   # shape: ModelShape.from_config(a transformers config, or QWEN25[...])
    print(plan_text(plan))              # --dry-run prints it; --memory-budget 24GB adds what fits (fitting_settings)

Placeholder: filled in below.
"""
import re

UNITS = {"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30,
         "TIB": 2**40, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_size(text):
    """"24GB" -> 24e9 bytes, "24GiB" or "24G" -> 24 * 2**30, "512MB" -> 512e6; None when it is not a size."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", str(text).upper())
    if not match or match.group(2) not in UNITS or float(match.group(1)) <= 0:
        return None
    return float(match.group(1)) * UNITS[match.group(2)]
