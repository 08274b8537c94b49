"""Plot a train.py metrics.jsonl: reward, pass rate, clip fractions, KL, entropy, length vs step.

Eval rows are markers with their standard errors; each panel's keys are PANELS' (first match wins;
case, '-' vs '_' and a 'train/' or 'eval/' prefix ignored). Several runs overlay; a run still going
is drawn (its half-written last line left out). Prints a summary of every series. docs/runs.md.

Run:  python -m experiments.plot_metrics runs/default [other runs ...] [--output PNG] [--smooth 5]
"""
import argparse
import json
import math
import os

from experiments import pyplot
from harness.files import RunError, replaced_file, what_is, write_failed
from harness.metrics import MAX_METRICS_LINE, bounded_lines, open_for_reading

# panel title -> list of series; a series is (label, training-row aliases, eval-row aliases)
PANELS = [
    ("reward", [("reward", ("reward_mean", "reward", "mean_reward"), ("reward", "reward_mean"))]),
    ("pass rate", [("pass rate", ("pass_rate", "pass@1"), ("pass@1", "pass_rate", "accuracy"))]),
    ("clip fraction", [("low (ratio < 1-eps_low)", ("clip_frac_low",), ()),
                       ("high (ratio > 1+eps_high)", ("clip_frac_high",), ()),
                       ("dual clip", ("dual_clip_frac",), ())]),
    ("KL to reference (k3)", [("kl", ("kl", "kl_mean"), ())]),
    ("entropy (nats/token)", [("entropy", ("entropy",), ())]),
    ("response length (tokens)", [("length", ("response_length", "completion_length", "length"),
                                   ("length", "response_length"))]),
]


def normalize_key(key):
    key = key.lower().replace("-", "_")
    for prefix in ("train/", "eval/"):
        if key.startswith(prefix):
            key = key[len(prefix):]
    return key


def metrics_file(path):
    return os.path.join(path, "metrics.jsonl") if os.path.isdir(path) else path


def read_metrics(path):
    """metrics.jsonl (or a run folder) -> (train_rows, eval_rows); a bad line raises ValueError
    naming file:line, but for a last line without its newline (being written): left out."""
    path = metrics_file(path)
    if not os.path.isfile(path):
        kind = what_is(os.path.realpath(path))
        raise ValueError(f"{path} is {kind}, not a metrics file" if kind else f"metrics file not found: {path}")
    train_rows, eval_rows = [], []
    with open_for_reading(path) as f:
        for line_number, line in bounded_lines(f):  # blank lines skipped, a line of over 1 MiB never read whole
            if not isinstance(line, bytes):  # metrics.TOO_LONG or TOO_LONG_UNENDED
                raise ValueError(f"{path}:{line_number}: a line longer than {MAX_METRICS_LINE} bytes")
            try:
                row = json.loads(line)
            except ValueError as error:
                if not line.endswith(b"\n"):
                    break  # being written now
                raise ValueError(f"{path}:{line_number}: not valid JSON ({getattr(error, 'msg', error)})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{line_number}: expected a JSON object, got {type(row).__name__}")
            (eval_rows if row.get("eval") is True else train_rows).append(row)
    if not train_rows and not eval_rows:
        raise ValueError(f"{path}: no metric rows")
    return train_rows, eval_rows


def extract_series(rows, aliases):
    available = {}
    for row in rows:
        for key in row:
            available.setdefault(normalize_key(key), key)
    for alias in aliases:
        key = available.get(normalize_key(alias))
        if key is None:
            continue
        steps, values = [], []
        for index, row in enumerate(rows):
            value = row.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                steps.append(row.get("step", index))
                values.append(float(value))
        if values:
            return key, steps, values
    return None, [], []


def standard_errors(rows, key):
    """The <key>_se of every row that has a finite <key> (as extract_series keeps them), or None if any lacks it."""
    errors = [row.get(f"{key}_se") for row in rows
              if isinstance(row.get(key), (int, float)) and not isinstance(row.get(key), bool)
              and math.isfinite(row[key])]
    return errors if errors and all(isinstance(e, (int, float)) for e in errors) else None


def moving_average(values, window):
    return [sum(values[max(0, i - window + 1):i + 1]) / min(i + 1, window)
            for i in range(len(values))]


def collect(paths, extra_keys=()):
    runs = [(os.path.basename(os.path.dirname(os.path.abspath(metrics_file(p)))) or p, *read_metrics(p))
            for p in paths]
    panels = PANELS + [(key, [(key, (key,), (key,))]) for key in extra_keys]
    result = []
    for title, series_specs in panels:
        found = []
        for run_label, train_rows, eval_rows in runs:
            for label, train_aliases, eval_aliases in series_specs:
                for is_eval, rows, aliases in ((False, train_rows, train_aliases), (True, eval_rows, eval_aliases)):
                    key, steps, values = extract_series(rows, aliases)
                    if key is not None:
                        found.append((run_label, label, is_eval, key, steps, values,
                                      standard_errors(rows, key) if is_eval else None))
        result.append((title, found))
    return result


def print_summary(panels):
    print("| panel | run | series | key | first | last | min | max | n |")
    print("|---|---|---|---|---|---|---|---|---|")
    for title, found in panels:
        if not found:
            print(f"| {title} | - | (no matching keys) | | | | | | |")
        for run_label, label, is_eval, key, steps, values, _ in found:
            name = ("eval " if is_eval else "") + label
            print(f"| {title} | {run_label} | {name} | {key} | {values[0]:.4g} | {values[-1]:.4g} | "
                  f"{min(values):.4g} | {max(values):.4g} | {len(values)} |")


def plot(panels, path, smooth=1, multiple_runs=False):
    plt = pyplot("the PNG; the summary above has the numbers")
    if plt is None:
        return False
    columns = 3
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.6 * rows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (title, found) in zip(axes.flat, panels):
        run_labels = list(dict.fromkeys(entry[0] for entry in found))
        series_labels = list(dict.fromkeys(entry[1] for entry in found))
        for run_label, label, is_eval, key, steps, values, errors in found:
            color_index = run_labels.index(run_label) if multiple_runs else series_labels.index(label)
            name = (f"{run_label}: " if multiple_runs else "") + ("eval " if is_eval else "") + label
            if is_eval:  # with train.py's standard errors over the held-out prompts as bars
                ax.errorbar(steps, values, yerr=errors, fmt="o--", markersize=4, capsize=2,
                            color=colors[color_index % len(colors)], label=name + (" (+- SE)" if errors else ""))
            else:
                ax.plot(steps, moving_average(values, smooth), color=colors[color_index % len(colors)],
                        alpha=0.9, label=name)
        if not found:
            ax.text(0.5, 0.5, "not in metrics", ha="center", va="center", transform=ax.transAxes, color="gray")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(found) > 1:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    try:
        with replaced_file(path, "wb") as f:  # a link at path is replaced by the picture, never written through
            fig.savefig(f, dpi=110, format="png")
    finally:
        plt.close(fig)
    return True


def default_output(paths):
    if len(paths) > 1:
        return os.path.abspath("metrics.png")
    return os.path.join(os.path.dirname(os.path.abspath(metrics_file(paths[0]))), "metrics.png")


def main(argv=None):
    parser = argparse.ArgumentParser(description="Plot train.py metrics.jsonl files (reward, pass rate, clip, KL, ...).")
    parser.add_argument("metrics", nargs="+", help="run folders or metrics.jsonl files")
    parser.add_argument("--output", default=None, help="PNG path (default: docstring)")
    parser.add_argument("--extra", default="", help="comma list of further keys to plot, e.g. zero_var_share,grad_norm")
    parser.add_argument("--smooth", type=int, default=1, help="moving-average window for training rows")
    parser.add_argument("--panels", default="", help="panels to draw (titles' starts)")
    args = parser.parse_args(argv)
    if args.smooth < 1:
        parser.error("--smooth must be >= 1")
    extra = [key.strip() for key in args.extra.split(",") if key.strip()]
    try:
        panels = collect(args.metrics, extra)
    except (ValueError, RunError) as error:
        parser.exit(2, f"error: {error}\n")
    wanted = [name.strip().lower() for name in args.panels.split(",") if name.strip()]
    if wanted:
        unknown = [name for name in wanted if not any(title.lower().startswith(name) for title, _ in panels)]
        if unknown:
            parser.error(f"--panels: no panel title starts with {', '.join(unknown)}; the panels are "
                         + ", ".join(title for title, _ in panels))
        panels = [(title, found) for title, found in panels if any(title.lower().startswith(n) for n in wanted)]
    print_summary(panels)
    output = args.output or default_output(args.metrics)
    try:
        drawn = plot(panels, output, args.smooth, multiple_runs=len(args.metrics) > 1)
    except (RunError, OSError) as error:
        message = write_failed(output, error, otherwise="", elsewhere="name another --output") \
            if isinstance(error, OSError) else error
        parser.exit(1, f"error: {message}\n")
    if drawn:
        print(f"wrote {output}")
    return panels


if __name__ == "__main__":
    main()
