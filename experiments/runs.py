"""The train.py runs of an experiment script (compare, smollm2_cpu): the flags a script passes on to every run,
checked, and a run already finished with the same flags, read back instead of trained again."""
import json
import os

from harness.checkpoint import RunError
from harness.metrics import read_metrics
from harness.config import parse_args

PER_RUN_FLAGS = ("--seed", "--output-dir", "--overwrite", "--resume")  # what a script sets for each of its runs


def train_flags(parser, extra, own=("--seeds", "--output-dir")):
    """The flags a script passes on to every train.py run, checked: one it sets itself for each run (above) is
    refused in one line, so that a typo (--seed for --seeds) cannot silently train every run on one seed into
    folders labelled with others. own: the script's flags that set them."""
    for token in extra:
        name = token.split("=", 1)[0]
        if name in PER_RUN_FLAGS:
            parser.error(f"{name} is set by this script for each of its runs (use its {' / '.join(own)})")
    return extra


def finished_run(argv_run):
    """The result train.main would return for `argv_run` when its --output-dir already holds that run finished
    (latest at the run's --steps, its held-out evals at step 0 and at the end, and every flag of argv_run equal in
    its run.json but those that do not change the result: threads, checkpoint keeping); else None. Lets a
    comparison grow by seeds without training the old ones again."""
    config = parse_args(argv_run)
    checkpoint = os.path.join(config.output_dir, "latest")
    metrics_path = os.path.join(config.output_dir, "metrics.jsonl")
    try:
        with open(os.path.join(checkpoint, "run.json")) as f:
            saved = json.load(f)
        evals = {row["step"]: row for row in read_metrics(metrics_path) if row.get("eval")}
    except (OSError, ValueError, RunError):
        return None
    unchanged = all(saved.get(key) == getattr(config, key) for key in config.given - {
        "overwrite", "output_dir", "warm_start_cache", "threads", "keep_checkpoints", "save_every"})  # not the result
    if not unchanged or os.path.basename(os.path.realpath(checkpoint)) != f"checkpoint-{config.steps}" \
            or 0 not in evals or config.steps not in evals:
        return None
    return {"before": evals[0], "after": evals[config.steps], "metrics_path": metrics_path}
