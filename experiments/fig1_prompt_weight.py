"""Fig. 1 (SoftmaxGRPO paper): each estimator's prompt weight omega(p), from the exact formulas.

For binary rewards with pass probability p, the expected unclipped on-policy update of one prompt,
(1/M) sum_i A_i grad log pi(y_i), equals omega(p) * grad p (Eq. 4, DESIGN.md §3). omega says how
much of the gradient budget a prompt of pass rate p receives. Curves (M = 8 by default):

  softmax_tau*  SoftmaxGRPO, softmax_grpo.prompt_weight(p, M, tau), tau in {0.1, 0.3, 1.0}
  maxrl         softmax_grpo.maxrl_weight(p, M) = (1 - (1-p)^(M-1)) / p   (the tau -> 0 limit)
  grpo          softmax_grpo.grpo_prompt_weight(p, M), symmetric about p = 1/2
  reinforce     the constant 1, derived here.

REINFORCE's weight: with z_i = grad log pi(y_i), E[z_i] = 0 and E[R_i z_i] = grad p, so (1/M) sum_i
(R_i - b_i) z_i has expectation grad p whenever the baseline b_i does not depend on y_i: omega = 1
exactly. (A baseline that includes R_i gives (M-1)/M for the group mean, 1 - 1/(G M) for our
`reinforce`'s batch mean: the same flat line, scaled.) What matters is the shape: flat for
REINFORCE, ~1/p for MaxRL and small tau, U-shaped for GRPO.

Run:  python -m experiments.fig1_prompt_weight [--group-size 8] [--taus 0.1,0.3,1.0] [--output-dir runs/fig1]
Writes <output-dir>/fig1_prompt_weight.csv (p, reinforce, grpo, maxrl, softmax_tau0.1, ...) and
<output-dir>/fig1_prompt_weight.png (log y axis) when matplotlib is installed.
"""

import argparse
import csv
import os

import numpy as np

from experiments import output_file, pyplot, write_figure
from softmax_grpo import grpo_prompt_weight, maxrl_weight, prompt_weight


def softmax_column(tau):
    """CSV column name of the SoftmaxGRPO curve at temperature tau, e.g. 'softmax_tau0.1'."""
    return f"softmax_tau{tau:g}"


def prompt_weight_curves(p, M, taus):
    """p: [P] array in [0, 1] -> dict column name -> [P] array of omega(p) (insertion order = CSV order)."""
    curves = {"p": p, "reinforce": np.ones_like(p), "grpo": grpo_prompt_weight(p, M), "maxrl": maxrl_weight(p, M)}
    for tau in taus:
        curves[softmax_column(tau)] = prompt_weight(p, M, tau)
    return curves


def write_csv(path, curves):
    names = list(curves)
    with output_file(path) as f:
        writer = csv.writer(f)
        writer.writerow(names)
        for row in zip(*(curves[name] for name in names)):
            writer.writerow([f"{value:.10g}" for value in row])


def plot(path, curves, M):
    plt = pyplot("the PNG; the CSV has the curves")
    if plt is None:
        return False
    import matplotlib.ticker
    fig, ax = plt.subplots(figsize=(6, 4.5))
    p = curves["p"]
    styles = {"reinforce": dict(color="gray", linestyle=":"), "grpo": dict(color="tab:orange"),
              "maxrl": dict(color="black", linestyle="--", zorder=5)}  # maxrl on top: tau=0.1 nearly equals it
    softmax_colors = iter(plt.cm.viridis(np.linspace(0.1, 0.8, sum(n.startswith("softmax") for n in curves))))
    for name, omega in curves.items():
        if name != "p":
            label = name.replace("softmax_tau", "SoftmaxGRPO, tau=") if name.startswith("softmax") else name
            style = styles[name] if name in styles else dict(color=next(softmax_colors))
            ax.plot(p, omega, label=label, **style)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("pass rate p")
    ax.set_ylabel("prompt weight omega(p)  (update = omega * grad p)")
    ax.set_title(f"Fig. 1: prompt weight vs pass rate, M = {M}")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    write_figure(fig, path, dpi=120)
    plt.close(fig)
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(description="Fig. 1: prompt-weight curves omega(p) for M rollouts per prompt.")
    parser.add_argument("--group-size", type=int, default=8, help="M, completions per prompt")
    parser.add_argument("--taus", default="0.1,0.3,1.0", help="comma list of SoftmaxGRPO temperatures")
    parser.add_argument("--points", type=int, default=201, help="grid points on [0, 1]")
    parser.add_argument("--output-dir", default="runs/fig1")
    args = parser.parse_args(argv)
    if args.group_size < 2:
        parser.error("--group-size must be >= 2")
    if args.points < 2:
        parser.error("--points must be >= 2")
    try:
        taus = [float(t) for t in args.taus.split(",") if t.strip()]
    except ValueError:
        parser.error(f"--taus: expected comma-separated numbers, got '{args.taus}'")
    if not taus or not all(np.isfinite(t) and t > 0 for t in taus):
        parser.error("--taus: every tau must be finite and > 0")

    p = np.linspace(0.0, 1.0, args.points)
    curves = prompt_weight_curves(p, args.group_size, taus)
    os.makedirs(args.output_dir, exist_ok=True)
    csv_path = os.path.join(args.output_dir, "fig1_prompt_weight.csv")
    write_csv(csv_path, curves)
    print(f"omega(p) at M = {args.group_size} (the update of a prompt is omega(p) * grad p):")
    probes = np.array([0.01, 0.1, 0.5, 0.9, 0.99])
    probe_curves = prompt_weight_curves(probes, args.group_size, taus)
    print("| curve | " + " | ".join(f"p={x:g}" for x in probes) + " |")
    print("|---" * (len(probes) + 1) + "|")
    for name, omega in probe_curves.items():
        if name != "p":
            print(f"| {name} | " + " | ".join(f"{w:.3g}" for w in omega) + " |")
    print(f"wrote {csv_path}")
    png_path = os.path.join(args.output_dir, "fig1_prompt_weight.png")
    if plot(png_path, curves, args.group_size):
        print(f"wrote {png_path}")
    return curves


if __name__ == "__main__":
    main()
