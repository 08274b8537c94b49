"""The train.py runs of an experiment script (smollm2_cpu, lab.compare): the flags a script passes on to every run,
checked, and a run already finished with the same flags and the same code, read back instead of trained again."""
import hashlib
import json
import os
import subprocess

from experiments import output_file
from harness.files import RunError
from harness.flags import parse_args
from harness.metrics import read_metrics

PER_RUN_FLAGS = ("--seed", "--output-dir", "--overwrite", "--resume")  # what a script sets for each of its runs
CODE_FILE = "code.json"  # in a run folder: the commit of the code that trained it (written by these scripts)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def git(*args):
    """git's output in this checkout ('' when git or the repository is missing)."""
    try:
        proc = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""


def code_commit():
    """The commit of the code here: the full hash, with "-dirty-<hash of the diff>" when a tracked Python file
    differs from it (the same uncommitted edit gives the same string); "unknown" outside a git checkout."""
    commit = git("rev-parse", "HEAD")
    if not commit:
        return "unknown"
    diff = git("diff", "HEAD", "--", "*.py")
    return commit + (f"-dirty-{hashlib.sha256(diff.encode()).hexdigest()[:12]}" if diff else "")


def same_code(recorded, current):
    """True when a run trained by the code at `recorded` would train the same way at `current`: the same string
    (commit and uncommitted edit), or two clean commits between which no Python file changed (docs-only commits
    keep a run reusable)."""
    if recorded == current and recorded != "unknown":
        return True
    if "unknown" in (recorded, current) or "-dirty" in recorded or "-dirty" in current:
        return False
    return git("cat-file", "-t", recorded) == "commit" and git("diff", "--name-only", recorded, current, "--",
                                                               "*.py") == ""


def record_code(run_dir):
    """Write the commit that trained the run in run_dir (read back by recorded_code): never through a link, hard
    link or FIFO planted there (experiments.output_file)."""
    with output_file(os.path.join(run_dir, CODE_FILE)) as f:
        json.dump({"commit": code_commit()}, f)


def recorded_code(run_dir):
    """The commit record_code wrote for the run in run_dir; "unknown" when there is none (or it is unreadable)."""
    try:
        with open(os.path.join(run_dir, CODE_FILE)) as f:
            return str(json.load(f)["commit"])
    except (OSError, ValueError, KeyError, TypeError):
        return "unknown"


def train_flags(parser, extra, own=("--seeds", "--output-dir")):
    """The flags a script passes on to every train.py run, checked: one it sets itself for each run (above) is
    refused in one line, so that a typo (--seed for --seeds) cannot silently train every run on one seed into
    folders labelled with others. own: the script's flags that set them."""
    for token in extra:
        name = token.split("=", 1)[0]
        if name in PER_RUN_FLAGS:
            parser.error(f"{name} is set by this script for each of its runs (use its {' / '.join(own)})")
    return extra


def seed_list(parser, text):
    """--seeds "0,1,2" -> [0, 1, 2]; anything but comma-separated integers is the parser's one-line error."""
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds: expected comma-separated integers, got {text!r}")


def finished_run(argv_run):
    """The result train.main would return for `argv_run` when its --output-dir already holds that run finished
    (latest at the run's --steps, its held-out evals at step 0 and at the end, and every flag of argv_run equal in
    its run.json but those that do not change the result: threads, checkpoint keeping), trained by the same code
    (same_code: a run from another commit, or with no record of its commit, is trained again, with a note); else
    None. Lets a comparison grow by seeds without training the old ones again."""
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
    recorded, current = recorded_code(config.output_dir), code_commit()
    if not same_code(recorded, current):
        print(f"not reusing the finished run in {config.output_dir}: trained by code at {recorded[:12]}, this is "
              f"{current[:12]} (a Python file differs, or a commit is unknown); training it again", flush=True)
        return None
    return {"before": evals[0], "after": evals[config.steps], "metrics_path": metrics_path}
