"""For a learner: the papers' figures and tables, the ImageNet checks, plotting and inspecting a run; run each with
python -m experiments.NAME. (The results ledger and the referee studies are the maintainers' lab/.)"""
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
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True


def write_csv(path, rows):
    """Write `rows` (dicts with the same keys) as a CSV file with a header."""
    with open(path, "w", newline="") as f:
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
