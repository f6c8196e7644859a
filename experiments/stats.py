"""Figures over seeds: means, Student's t intervals, medians and bootstrap intervals."""

import math
import random


def mean_sd(values):
    """The mean and the sample standard deviation (0 for a single value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


# Student's t for a two-sided 95% interval, by degrees of freedom.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042}


def t95(df):
    if df > 30:
        return 1.96
    return T95[max(k for k in T95 if k <= df)]


def paired_gap(values, reference):
    """Mean of the per-seed differences values[s] - reference[s] over the seeds both have,
    its 95% interval (Student's t; None under two seeds) and the seed count."""
    d = [values[s] - reference[s] for s in values if s in reference]
    if not d:
        return None, None, 0
    mean = sum(d) / len(d)
    if len(d) < 2:
        return mean, None, len(d)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1))
    half = t95(len(d) - 1) * sd / math.sqrt(len(d))
    return mean, (mean - half, mean + half), len(d)


def median(values):
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def log_ratio_interval(numerator, denominator, draws=4000, seed=20261204):
    """The ratio of the geometric means of two samples (times over seeds), with a 95% BCa
    bootstrap interval on the log times (scipy.stats.bootstrap, the two samples resampled
    independently). Percentile intervals of a ratio of means under-cover with 5 seeds; on
    log times BCa corrects for the skew. Returns (ratio, low, high); low == high == ratio
    when neither sample varies. Deterministic."""
    import numpy as np
    from scipy import stats as sps
    a = np.log(np.asarray(numerator, dtype=float))
    b = np.log(np.asarray(denominator, dtype=float))
    point = float(np.exp(a.mean() - b.mean()))
    if np.ptp(a) == 0 and np.ptp(b) == 0:
        return point, point, point
    def diff(x, y, axis=-1):
        return np.mean(x, axis=axis) - np.mean(y, axis=axis)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for method in ("BCa", "percentile"):  # BCa is undefined when a sample cannot vary
            r = sps.bootstrap((a, b), diff, n_resamples=draws, method=method,
                              vectorized=True, random_state=np.random.default_rng(seed))
            low, high = r.confidence_interval
            if np.isfinite(low) and np.isfinite(high):
                return point, float(np.exp(low)), float(np.exp(high))
    return point, point, point


def bootstrap_ratio(numerator, denominator, draws=4000, seed=20261204):
    """A 95% percentile-bootstrap interval of mean(numerator) / mean(denominator), each list
    (one value per seed) resampled with replacement on its own. Deterministic."""
    rng = random.Random(seed)
    ratios = []
    for _ in range(draws):
        a = [rng.choice(numerator) for _ in numerator]
        b = [rng.choice(denominator) for _ in denominator]
        ratios.append((sum(a) / len(a)) / (sum(b) / len(b)))
    ratios.sort()
    return ratios[int(0.025 * (draws - 1))], ratios[int(round(0.975 * (draws - 1)))]
