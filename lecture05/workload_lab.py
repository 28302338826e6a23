"""
workload_lab —— 确定的请求流：泊松到达的时刻、均匀分布的长度（同样的种子、同样的请求）。

【约定】随机数只用 np.random.default_rng(seed).random()，自己反查 CDF（不用 numpy 的分布函数：
它们的算法换了版本可能不同）；同样的种子、同样的结果。
"""
import numpy as np

__all__ = ["poisson_arrivals", "uniform_ints"]


def poisson_arrivals(rate, n, seed):
    """
    泊松过程的前 n 个到达时刻（秒，递增）：间隔是均值 1/rate 的指数分布，用 −ln(1 − u) / rate 反查 CDF。

    【参数】rate：每秒到达的请求数；seed：np.random.default_rng 的种子（只用 .random()）。
    """
    if not rate > 0:
        raise ValueError(f"到达率必须为正（每秒的请求数，收到 {rate}）")
    u = np.random.default_rng(seed).random(n)
    return np.cumsum(-np.log1p(-u) / rate)


def uniform_ints(lo, hi, n, seed):
    """n 个 [lo, hi) 里均匀分布的整数：lo + floor(u · (hi − lo))，u 来自 default_rng(seed).random()。"""
    u = np.random.default_rng(seed).random(n)
    return (lo + np.floor(u * (hi - lo))).astype(np.int64)
