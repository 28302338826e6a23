"""
stats_lab —— 拟合优度：Pearson χ² 检验和 χ² 分布的右尾概率，检查抽样结果和精确分布一致（只用 numpy 和标准库）。
"""
import math

import numpy as np

__all__ = ["chi2_sf", "chi2_gof"]


def chi2_sf(x, dof):
    """
    χ² 分布的右尾概率 P(X ≥ x)，自由度 dof = 正则化上不完全伽马函数 Q(dof/2, x/2)。

    【做法】x < a + 1 时用级数算 P 再取 1 − P，否则用连分式（Lentz 算法）直接算 Q（Numerical Recipes §6.2 的方法）。
    """
    if dof < 1:
        raise ValueError(f"自由度至少为 1（收到 {dof}）")
    if x <= 0:
        return 1.0
    a, z = dof / 2.0, x / 2.0
    log_pre = a * math.log(z) - z - math.lgamma(a)
    if z < a + 1:
        term = total = 1.0 / a
        for n in range(1, 1000):
            term *= z / (a + n)
            total += term
            if term < total * 1e-16:
                break
        return max(0.0, 1.0 - total * math.exp(log_pre))
    tiny = 1e-300
    b = z + 1 - a
    cc, d = 1.0 / tiny, 1.0 / b
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        cc = b + an / cc
        cc = tiny if abs(cc) < tiny else cc
        d = 1.0 / d
        delta = d * cc
        h *= delta
        if abs(delta - 1) < 1e-16:
            break
    return math.exp(log_pre) * h


def chi2_gof(counts, probs, min_expected=5.0):
    """
    Pearson χ² 拟合优度检验：观测次数 counts 是否来自分布 probs -> (χ², 自由度, p 值)。

    【做法】期望次数 < min_expected 的格子合并成一格（χ² 近似需要每格期望够大）；概率为 0 的格子如果有观测，
    χ² = inf、p = 0。自由度 = 格子数 − 1。
    """
    counts = np.asarray(counts, dtype=np.float64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    n = counts.sum()
    if counts.shape != probs.shape or n <= 0 or np.any(counts < 0):
        raise ValueError("counts 和 probs 必须一样长，counts 非负且至少有一次观测")
    if np.any(probs < 0) or abs(probs.sum() - 1.0) > 1e-9:
        raise ValueError(f"probs 必须是一个分布（非负、和为 1；收到和 {probs.sum()}）")
    if np.any((probs <= 0) & (counts > 0)):
        return math.inf, 0, 0.0
    exp = probs * n
    big = exp >= min_expected
    obs_cells = list(counts[big])
    exp_cells = list(exp[big])
    if np.any(~big) and exp[~big].sum() > 0:
        obs_cells.append(counts[~big].sum())
        exp_cells.append(exp[~big].sum())
    o, e = np.array(obs_cells), np.array(exp_cells)
    stat = float(((o - e) ** 2 / e).sum())
    dof = len(o) - 1
    return stat, dof, (chi2_sf(stat, dof) if dof >= 1 else 1.0)
