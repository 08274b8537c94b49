"""Statistics over seeds and samples, for the lab's comparisons (compare.py, the referee studies): the unbiased
pass@k estimator, mean +- standard error, and Student's t-intervals for paired differences (no scipy)."""
import functools
import math
import statistics

from experiments import mean_sd_se


def pass_at_k(n, c, k):
    """The unbiased pass@k (Chen et al. 2021): of n samples c pass, 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_ks(M):
    ks = [2 ** i for i in range(M.bit_length()) if 2 ** i <= M]
    return ks + ([M] if ks[-1] != M else [])


def t_cdf(t, df, n=2000):
    """P(T <= t) for Student's t with df degrees of freedom, by Simpson's rule on n panels."""
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    f = [math.exp(log_c - (df + 1) / 2 * math.log1p((t * i / n) ** 2 / df)) for i in range(n + 1)]
    return 0.5 + t / n / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))


@functools.lru_cache(maxsize=None)  # ~0.5 s of pure-Python bisection per call; the scripts ask for a few (q, df)
def t_quantile(q, df):
    """The q-quantile (q in (0.5, 1)) of Student's t with df degrees of freedom, by bisection."""
    if not 0.5 < q < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < q < 1 and df >= 1, got q={q}, df={df}")
    low, high = 0.0, 1.0
    while t_cdf(high, df) < q:
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, df) < q else (low, mid)
    return (low + high) / 2


def paired_p(differences):
    """The two-sided p of a paired t-test that the mean difference is 0."""
    mean, _, se = mean_sd_se(differences)
    if not se:
        raise ValueError(f"paired_p needs >= 2 differences that are not all equal, got {differences}")
    return max(0.0, 2 * (1 - t_cdf(abs(mean) / se, len(differences) - 1)))


def holm(p_values, level=0.05):
    """Holm's step-down over a list of p: which survive at family-wise error `level`."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    survives = [False] * len(p_values)
    for k, i in enumerate(order):
        if p_values[i] >= level / (len(p_values) - k):
            break
        survives[i] = True
    return survives


def mean_se_interval(values, level=0.95):
    """(mean, SE, (low, high) two-sided t-interval); a single value has no SE or interval (None)."""
    mean, _, se = mean_sd_se(values)
    if se is None:
        return mean, None, None
    half = t_quantile(0.5 + level / 2, len(values) - 1) * se
    return mean, se, (mean - half, mean + half)


def seeds_for_half_width(sd, target, level=0.95, most=1000):
    """The fewest seeds n (>= 2) whose paired t-interval has half-width <= target at a seed-to-seed
    sd of the differences; None if more than `most`."""
    if sd < 0 or target <= 0:
        raise ValueError(f"seeds_for_half_width needs sd >= 0 and target > 0, got sd={sd}, target={target}")
    for n in range(2, most + 1):
        if t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n) <= target:
            return n
    return None


def mean_se(values):
    mean, se, _ = mean_se_interval(values)
    return f"{mean:.3f}" if se is None else f"{mean:.3f} +- {se:.3f}"


def interval_text(values):
    mean, se, interval = mean_se_interval(values)
    return f"{mean:.3g}" if interval is None else f"{mean:.3g} ± {se:.2g} [{interval[0]:.3g}, {interval[1]:.3g}]"


def paired_text(values):
    mean, _, interval = mean_se_interval(values)
    return f"{mean:+.3f}" if interval is None else f"{mean:+.3f} [{interval[0]:+.3f}, {interval[1]:+.3f}]"


def mean_std(values):
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} +- {statistics.stdev(values):.3f}"
