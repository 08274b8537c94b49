"""For a learner: the papers' figures and tables, the ImageNet checks, a real model learning on a CPU (smollm2_cpu,
with runs, the train.py runs it trains and reuses), plotting and inspecting a run; run each with python -m
experiments.NAME. (The results ledger and the referee studies are the maintainers' lab/.)"""
import contextlib
import csv
import math
import statistics


def pyplot(skipped, log=print):
    """matplotlib.pyplot on the Agg backend, or None (after one line saying what was `skipped`) when matplotlib is
    not installed: the figures are optional, the numbers are always written."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log(f"matplotlib is not installed: skipped {skipped} (pip install matplotlib)")
        return None
    return plt


def save_figure(plt, fig, path, title):
    """Title the figure, lay it out, write it to `path` (PNG, 80 dpi) and close it. -> True (the figure exists)."""
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    write_figure(fig, path, dpi=80)
    plt.close(fig)
    return True


@contextlib.contextmanager
def output_file(path, mode="w"):
    """A file object for a script's output at path (harness.checkpoint.replaced_file: written beside and renamed
    over it, never through a link, hard link or FIFO there). A refusal or a failed write ends the script in one
    line naming path (exit 1); whatever was at path stays as it was."""
    from harness.files import RunError, replaced_file, write_failed
    try:
        with replaced_file(path, mode) as f:
            yield f
    except RunError as error:
        raise SystemExit(f"error: {error}") from None
    except OSError as error:
        raise SystemExit(f"error: {write_failed(path, error, otherwise='', elsewhere='')}") from None


def write_figure(fig, path, dpi):
    """fig as a PNG at path (output_file)."""
    with output_file(path, "wb") as f:
        fig.savefig(f, dpi=dpi, format="png")


def write_csv(path, rows):
    """Write `rows` (dicts with the same keys) as a CSV file with a header (output_file)."""
    with output_file(path) as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def mean_sd_se(values):
    """(mean, sample std, standard error = std / sqrt(n)); std and SE are None for fewer than two values."""
    mean = statistics.mean(values)
    if len(values) < 2:
        return mean, None, None
    sd = statistics.stdev(values)
    return mean, sd, sd / math.sqrt(len(values))
