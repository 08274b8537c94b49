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
