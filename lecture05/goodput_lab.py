"""
goodput_lab —— goodput（DistServe 的定义）：SLO 达标率、达标率 ≥ 门槛（默认 90%）的最高到达率（二分细找）、
一台 prefill 机长期撑得住的到达率上限。

要模拟的部署（同机、分块 prefill、P:D 几台对几台）在 disagg_lab：find_goodput 只要一个"到达率 → 达标率"的函数。
【出处】DistServe（Zhong et al., OSDI 2024, arXiv 2401.09670）：goodput = 满足 SLO 达标率的最高请求率。
"""
import math

import numpy as np

from iteration_lab import iteration_clock

__all__ = ["slo_attainment", "find_goodput", "prefill_capacity"]


def slo_attainment(res, ttft_slo, tpot_slo):
    """
    同时达到两个目标的请求所占的比例：TTFT ≤ ttft_slo 且 TPOT ≤ tpot_slo（秒）。只生成 1 个 token 的请求 TPOT 记 0。

    【边界】目标必须为正，否则抛 ValueError。
    """
    if not (ttft_slo > 0 and tpot_slo > 0):
        raise ValueError(f"TTFT、TPOT 目标都必须为正（秒；收到 {ttft_slo}, {tpot_slo}）")
    ok = (np.asarray(res["ttft"]) <= ttft_slo) & (np.asarray(res["tpot"]) <= tpot_slo)
    return float(ok.mean())


def find_goodput(attainment_at, rates, n_refine=4, goal=0.9, max_rate=math.inf):
    """
    goodput（DistServe 的定义）：SLO 达标率 ≥ goal 的最高到达率。先在粗网格 rates 上二分，找相邻的两个率：
    低的达标、高的不达标；再在这两个率之间均匀插 n_refine 个点，同样二分细找一次。返回 dict：goodput（达标的最高率；
    网格里最低的率都不达标时为 0）、upper（比它高、不达标的最低率；最高的率也达标时为 inf）、
    tested（{率: 达标率}，所有算过的点，按率排好）。

    【推导】二分假设达标率随负载单调下降——这时它和从小到大一个一个试的结果一样，只是试的点少（约 log₂ 个）。
    有限个请求的模拟里达标率有抽样起伏，单调只是近似（同一组随机数跑所有的率，起伏小）。
    真值在 [goodput, upper) 里，细找以后精度 = 粗网格那一格的宽度 / (n_refine + 1)。
    【参数】attainment_at：函数，到达率 → 达标率；rates：递增的正数；max_rate：到达率 ≥ 它时系统长期撑不住
    （某一侧的利用率 ≥ 1，队列越排越长，例如 prefill_capacity 给的上限），不用模拟、直接算不达标——有限个请求的模拟
    看不出这一点：队列还没排长，请求就发完了。
    【边界】rates 空、不递增或有非正数，n_refine < 0，goal 不在 (0, 1] 里，都抛 ValueError。
    """
    rates = [float(r) for r in rates]
    if not rates or not all(r > 0 for r in rates) or any(b <= a for a, b in zip(rates, rates[1:])):
        raise ValueError(f"到达率网格必须是不空、递增的正数（收到 {rates}）")
    if n_refine < 0 or not 0 < goal <= 1:
        raise ValueError(f"n_refine ≥ 0、goal 在 (0, 1] 里（收到 {n_refine}, {goal}）")
    tested = {}

    def last_pass(grid, lo, hi):
        """grid[lo] 达标（或 lo = −1）、grid[hi] 不达标（或 hi = len）：二分到两者相邻，返回 (lo, hi)。"""
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if grid[mid] not in tested:
                tested[grid[mid]] = attainment_at(grid[mid]) if grid[mid] < max_rate else 0.0
            lo, hi = (mid, hi) if tested[grid[mid]] >= goal else (lo, mid)
        return lo, hi

    i, j = last_pass(rates, -1, len(rates))
    if i < 0 or j == len(rates):
        return {"goodput": rates[i] if i >= 0 else 0.0, "upper": rates[j] if j < len(rates) else math.inf,
                "tested": dict(sorted(tested.items()))}
    step = (rates[j] - rates[i]) / (n_refine + 1)
    fine = [rates[i]] + [rates[i] + k * step for k in range(1, n_refine + 1)] + [rates[j]]
    i, j = last_pass(fine, 0, len(fine) - 1)
    return {"goodput": fine[i], "upper": fine[j], "tested": dict(sorted(tested.items()))}


def prefill_capacity(model, chip, prompt_lens):
    """
    一台 prefill 机（一次一个提示）长期最多每秒能 prefill 多少个请求 = 1 / 平均 prefill 时间（这批提示的平均）。

    【推导】排队论：到达率 × 平均服务时间 = 利用率 ρ；ρ ≥ 1 时队列越排越长，TTFT 没有上限。
    n 台 prefill 机的上限是 n 倍；同机部署的 GPU 还要做 decode，它的上限只会更低（这是必要条件，不是充分条件）。
    【边界】提示长度不空、每个 ≥ 1，否则抛 ValueError。
    """
    lens = [int(x) for x in prompt_lens]
    if not lens or min(lens) < 1:
        raise ValueError(f"至少一个提示、每个至少 1 个 token（收到 {len(lens)} 个，最短 {min(lens, default=0)}）")
    clock, _ = iteration_clock(model, chip)
    return len(lens) / sum(clock(prefill_tokens=n) for n in lens)
