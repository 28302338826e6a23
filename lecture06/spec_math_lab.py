"""
spec_math_lab —— 投机解码的期望收益：Leviathan et al. 2023 的公式（式 (1)、定理 3.8、3.11）、最优 γ，
以及拿它们对照论文：从报告的加速比倒推 α、"产出 n_new 个 token 要几轮"的精确期望与不跑模型的模拟。

【假设】这些公式都假设每个草稿 token 以同一个概率 α 被接受、各位置独立（论文 §3 的假设）；
难的位置成片出现时会怎样，见 correlated_lab 和第 6 讲 08。
"""
import numpy as np

__all__ = ["expected_tokens", "walltime_speedup", "ops_factor", "best_gamma", "truncated_geometric",
           "alpha_for_speedup", "expected_rounds", "simulate_rounds", "LEVIATHAN_TABLE3",
           "LEVIATHAN_TABLE4"]

# 论文的数字（抄来的，第 6 讲 06、08 用）：Leviathan et al. 2023（arXiv 2211.17192）附录 A.3 表 4，
# T5-XXL 11B 目标，批大小 1，一块 TPU-v4：(任务, 草稿, T, γ, α, c, Exp, Emp)；Exp = 论文按定理 3.8 印的，
# Emp = 实测的墙钟加速，c 是论文从 profiler 的记录里估的（同一附录的正文）
LEVIATHAN_TABLE4 = [
    ("EnDe", "T5-small", 0, 7, 0.75, 0.02, 3.2, 3.4),
    ("EnDe", "T5-base", 0, 7, 0.80, 0.04, 3.3, 2.8),
    ("EnDe", "T5-large", 0, 7, 0.82, 0.11, 2.5, 1.7),
    ("EnDe", "T5-small", 1, 7, 0.62, 0.02, 2.3, 2.6),
    ("EnDe", "T5-base", 1, 5, 0.68, 0.04, 2.4, 2.4),
    ("EnDe", "T5-large", 1, 3, 0.71, 0.11, 2.0, 1.4),
    ("CNNDM", "T5-small", 0, 5, 0.65, 0.02, 2.4, 3.1),
    ("CNNDM", "T5-base", 0, 5, 0.73, 0.04, 2.6, 3.0),
    ("CNNDM", "T5-large", 0, 3, 0.74, 0.11, 2.0, 2.2),
    ("CNNDM", "T5-small", 1, 5, 0.53, 0.02, 1.9, 2.3),
    ("CNNDM", "T5-base", 1, 3, 0.55, 0.04, 1.8, 2.2),
    ("CNNDM", "T5-large", 1, 3, 0.56, 0.11, 1.6, 1.7),
]

# 同一篇论文的表 3（第 6 讲 06、10 用）：(目标, 草稿, α 在 T = 0, α 在 T = 1)，"在目标模型生成的 1 万个 token 上"量的；
# 整张表的神经网络草稿（10 对）和两个二元语法草稿（arXiv 2211.17192 表 3）
LEVIATHAN_TABLE3 = [
    ("GPT-like 97M", "GPT-like 6M", 0.88, 0.89),
    ("T5-XXL EnDe", "二元语法", 0.20, 0.19),
    ("T5-XXL EnDe", "T5-small", 0.75, 0.62),
    ("T5-XXL EnDe", "T5-base", 0.80, 0.68),
    ("T5-XXL EnDe", "T5-large", 0.82, 0.71),
    ("T5-XXL CNNDM", "二元语法", 0.23, 0.16),
    ("T5-XXL CNNDM", "T5-small", 0.65, 0.53),
    ("T5-XXL CNNDM", "T5-base", 0.73, 0.55),
    ("T5-XXL CNNDM", "T5-large", 0.74, 0.56),
    ("LaMDA 137B", "LaMDA 100M", 0.61, 0.57),
    ("LaMDA 137B", "LaMDA 2B", 0.71, 0.71),
    ("LaMDA 137B", "LaMDA 8B", 0.75, 0.74),
]

# ---------------------------------------------------------------------------
# 公式（Leviathan et al. 2023）
# ---------------------------------------------------------------------------
def _check_alpha_gamma(alpha, gamma):
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"接受率 α 必须在 [0, 1] 之间（收到 {alpha}）")
    if not (isinstance(gamma, (int, np.integer)) and not isinstance(gamma, bool) and gamma >= 0):
        raise ValueError(f"草稿长度 γ 必须是 ≥ 0 的整数（收到 {gamma!r}；γ = 0 是普通解码）")


def expected_tokens(alpha, gamma):
    """
    每轮（每次目标前向）平均产出的 token 数 E = (1 − α^{γ+1}) / (1 − α)（论文式 (1)）。

    【推导】产出 1 + (被接受的个数)；第 i 个草稿被接受的概率是 α^i（前 i 个都接受），E = Σ_{i=0..γ} α^i。
    【边界】α = 1 时取极限 γ + 1；γ = 0 时是 1（普通解码）。
    """
    _check_alpha_gamma(alpha, gamma)
    if alpha == 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def walltime_speedup(alpha, gamma, c):
    """
    墙钟加速比 = (1 − α^{γ+1}) / ((1 − α)(γc + 1))（定理 3.8）。c = 草稿一次前向 / 目标一次前向的时间。

    【边界】α = 1 取极限 (γ + 1) / (γc + 1)；γ = 0 时是 1；c < 0 抛 ValueError。
    """
    if not c >= 0:
        raise ValueError(f"代价系数 c 必须 ≥ 0（收到 {c}）")
    return expected_tokens(alpha, gamma) / (gamma * c + 1.0)


def ops_factor(alpha, gamma, c_hat):
    """
    总运算量相对普通解码的倍数 = (1 − α)(γĉ + γ + 1) / (1 − α^{γ+1})（定理 3.11）。ĉ = 草稿 / 目标 每 token 的运算量。

    【推导】每轮目标模型算 γ + 1 个位置、草稿算 γ 个（各 ĉ），产出 E 个 token。
    【边界】α = 1 取极限 (γĉ + γ + 1) / (γ + 1)；γ = 0 时是 1；ĉ < 0 抛 ValueError。
    """
    if not c_hat >= 0:
        raise ValueError(f"运算量系数 ĉ 必须 ≥ 0（收到 {c_hat}）")
    return (gamma * c_hat + gamma + 1.0) / expected_tokens(alpha, gamma)


def best_gamma(alpha, c, max_gamma=256):
    """
    在 γ = 1..max_gamma 里找墙钟加速比最大的 γ -> (γ*, 加速比)。

    【边界】没有任何 γ 的加速比 > 1（α ≤ c 时；α = c 时 γ = 1 正好是 1）返回 (0, 1.0)：不划算，用普通解码；
    c ≤ 0 或 α = 1 时加速比随 γ 无限增长、没有有限的最优值：抛 ValueError；最优值落在 max_gamma 上（真正的最优
    可能更远，例如 α = 0.999、c = 10⁻⁴）也抛 ValueError。
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"接受率 α 必须在 [0, 1] 之间（收到 {alpha}）")
    if not c > 0:
        raise ValueError(f"c = {c}：需要 c > 0（草稿免费时 γ 越大越快，没有有限的最优 γ）")
    if alpha == 1.0:
        raise ValueError("α = 1：草稿永远被接受，γ 越大越快，没有有限的最优 γ（需要 α < 1）")
    best = (0, 1.0)
    for g in range(1, max_gamma + 1):
        s = walltime_speedup(alpha, g, c)
        if s > best[1] * (1 + 1e-12):
            best = (g, s)
    if best[0] == max_gamma:
        raise ValueError(f"α = {alpha}、c = {c} 的最优 γ 超出搜索范围 1..{max_gamma}：调大 max_gamma")
    return best


def truncated_geometric(alpha, gamma):
    """
    每轮被接受个数的分布（各位置独立、接受率都是 α 时）：P(n) = α^n (1 − α)（n < γ），P(γ) = α^γ -> 长 γ + 1 的数组。
    """
    _check_alpha_gamma(alpha, gamma)
    return np.array([alpha ** n * (1 - alpha) for n in range(gamma)] + [alpha ** gamma])


# ---------------------------------------------------------------------------
# 论文对照（第 6 讲 06、07 用）：把定理 3.8 倒过来用、产出 n_new 个 token 的轮数
# ---------------------------------------------------------------------------
def alpha_for_speedup(speedup, gamma, c, tol=1e-12):
    """
    反解定理 3.8：加速比为 speedup（草稿长度 γ、代价系数 c）时的接受率 α -> float。

    【推导】speedup(α) = (1 + α + … + α^γ) / (γc + 1) 随 α 严格增加：α = 0 时是 1 / (γc + 1)，
    α = 1 时是 (γ + 1) / (γc + 1)。所以在 [0, 1] 上二分，直到区间短于 tol。
    【边界】speedup 不在 [1 / (γc + 1), (γ + 1) / (γc + 1)] 里（没有这样的 α）抛 ValueError；γ 必须 ≥ 1（γ = 0 时加速比恒为 1，
    求不出 α）；c < 0 抛 ValueError。
    """
    if not (isinstance(gamma, (int, np.integer)) and not isinstance(gamma, bool) and gamma >= 1):
        raise ValueError(f"草稿长度 γ 必须是 ≥ 1 的整数（收到 {gamma!r}；γ = 0 时加速比恒为 1，求不出 α）")
    lo_s, hi_s = walltime_speedup(0.0, gamma, c), walltime_speedup(1.0, gamma, c)
    if not lo_s <= speedup <= hi_s:
        raise ValueError(f"γ = {gamma}、c = {c} 时加速比只能在 {lo_s:.4g}（α = 0）到 {hi_s:.4g}（α = 1）之间，"
                         f"收到 {speedup}")
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if walltime_speedup(mid, gamma, c) < speedup:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def expected_rounds(alpha, gamma, n_new):
    """
    产出 n_new 个 token 平均要几轮（= 目标模型前向几次）-> float。各位置独立、接受率都是 α（式 (1) 的假设）。

    【推导】一轮产出 X = 1 + 被接受的个数 ∈ 1..γ + 1 个 token（截断几何分布）。记 u_k = "有一轮从第 k 个新 token
    开始"的概率：u_0 = 1，u_k = Σ_j u_{k−j}·P(X = j)（更新方程）。轮数 = 从 0..n_new − 1 开始的轮数，
    所以期望 = Σ_{k < n_new} u_k。最后一轮可能越过 n_new（多产出的被截掉），所以 n_new / 期望轮数 < E(α, γ)：
    这就是 "n_new / 轮数" 这个估计偏低的原因；n_new 越大，截掉的那一点占比越小。
    【边界】n_new 必须是 ≥ 1 的整数；γ = 0 时每轮 1 个 token，期望 = n_new。
    """
    _check_alpha_gamma(alpha, gamma)
    if not (isinstance(n_new, (int, np.integer)) and not isinstance(n_new, bool) and n_new >= 1):
        raise ValueError(f"n_new 必须是 ≥ 1 的整数（收到 {n_new!r}）")
    px = truncated_geometric(alpha, gamma)  # px[j − 1] = P(X = j)
    u = np.zeros(n_new)
    u[0] = 1.0
    for k in range(1, n_new):
        j = np.arange(1, min(k, gamma + 1) + 1)
        u[k] = float((u[k - j] * px[j - 1]).sum())
    return float(u.sum())


def simulate_rounds(alpha, gamma, n_new, n_runs, rng):
    """
    不跑模型，模拟 n_runs 次"投机解码生成 n_new 个 token"-> dict（各位置独立、每个草稿以概率 α 被接受）：
      "calls"：[n_runs] 每次的轮数（目标前向次数）；
      "accepted"：[n_runs] 每次所有轮被接受的草稿个数之和（最后一轮整轮计入，不截断）。

    【做法】每轮给每次运行 γ 个均匀数 u：从头数连续 u < α 的个数就是这一轮被接受的个数 n，这一轮产出 n + 1 个 token
    （和 speculative_generate 一样：第一个被拒绝的位置换成修正 token；全部接受时多一个额外的 token）。产够 n_new 的运行停下。
    【随机数】每轮 rng.random((n_runs, γ))，已经停下的运行也照样消耗，所以结果只取决于种子和参数。
    【边界】γ ≥ 1、n_new ≥ 1、n_runs ≥ 1 的整数，否则 ValueError；α = 1 时每轮 γ + 1 个。
    """
    _check_alpha_gamma(alpha, gamma)
    for name, v in (("γ", gamma), ("n_new", n_new), ("n_runs", n_runs)):
        if not (isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1):
            raise ValueError(f"{name} 必须是 ≥ 1 的整数（收到 {v!r}）")
    made = np.zeros(n_runs, dtype=np.int64)
    calls = np.zeros(n_runs, dtype=np.int64)
    accepted = np.zeros(n_runs, dtype=np.int64)
    while True:
        live = made < n_new
        if not live.any():
            break
        ok = rng.random((n_runs, gamma)) < alpha                  # [n_runs, γ]
        n = np.cumprod(ok, axis=1).sum(axis=1)                    # 从头数连续接受的个数
        made += live * (n + 1)
        calls += live
        accepted += live * n
    return {"calls": calls, "accepted": accepted}
