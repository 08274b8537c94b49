"""The clip's and the KL's activity of one run, from its metrics.jsonl (lab.referee_clipping, reproduce's clipping
cells). The runs an experiment script trains and reuses: experiments/runs.py."""
from harness.metrics import read_metrics

ACTIVITY = ("clip_frac_low", "clip_frac_high", "ratio_mean", "ratio_max", "kl")


def activity(metrics_path):
    """The training rows' clip/ratio/KL series of one run -> {key: [(step, value)]} (missing keys: none)."""
    rows = [r for r in read_metrics(metrics_path) if not r.get("eval")]
    return {key: [(r["step"], r[key]) for r in rows if key in r] for key in ACTIVITY}


def ratio_is_one(series):
    """Every step's token-mean ratio and maximum ratio are 1 (then every ratio is 1: none above, mean 1)."""
    return bool(series["ratio_mean"]) and all(v == 1.0 for _, v in series["ratio_mean"] + series["ratio_max"])
