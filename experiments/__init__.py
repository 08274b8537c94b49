"""Scripts that reproduce the papers' figures and tables, and the ImageNet checks (imagenet_toy, imagenet_real);
run each with python -m experiments.NAME."""


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
