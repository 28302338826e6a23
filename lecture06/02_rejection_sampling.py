"""
=============================================================================
CS349E · 第 6 讲 · 02_rejection_sampling.py —— 接受 / 拒绝规则：为什么输出正好是目标分布 p
=============================================================================

【这个脚本要回答的问题】
演示 1：在手工构造的小分布上精确枚举一步"草稿抽 x → 以 min(1, p(x)/q(x)) 接受 → 拒绝就从残差重抽"：不管草稿 q 是什么，
输出都正好是 p（p == q、支撑不相交、q 在 p 不为 0 的地方是 0、p 是 one-hot（T = 0）都算）；接受率 α = Σ min(p, q) = 1 − TV(p, q)；
草稿改取 argmax（q 变成点质量）时接受率变成 p(argmax q)，不一定更低。
演示 2：拆开看一个例子：每个 token 的输出概率 = "接受并输出它" min(p, q) + "拒绝后从残差抽到它" max(0, p − q) = p。
演示 3：别的规则会怎样：朴素规则"草稿 token 等于目标新抽的 token 就接受"分布也对，但接受率只有 Σ p·q；
"拒绝后从 p 重抽"或"草稿一律接受"分布就错了。
演示 4：用随机数真的抽（固定种子）：修正拒绝采样直接跑 decode_lab.speculative_generate（见下面【演示 4 怎么抽】），
别的规则用本脚本的向量化抽样器；每个情形抽 N 次，计数和 p 做 χ² 拟合优度检验（stats_lab.chi2_gof）；错误的规则被检验抓出来。

【怎么读输出】p = 目标模型（target）的分布，q = 草稿模型（draft）的分布（Leviathan 的记号；Chen 等人的论文正好相反）。
分布按 token 0, 1, 2, 3 的顺序列出。"max |输出 − p|" 是精确枚举得到的输出分布和 p 的最大差：只有浮点舍入，打印成上界
（"< 1e-15"），所以打印的字节不依赖机器。TV(p, q) = ½ Σ |p − q| 是总变差距离。

【演示 4 怎么抽】正确的规则不在脚本里重写：把 p、q 各做成一张"上下文无关"的二元语法表（每一行都是 log p 或 log q，
前一个 token 是什么都一样），交给 decode_lab.speculative_generate，γ = 1、T = 1，一次生成一段 token。因为分布不随上下文变，
每一轮都是同一个 (p, q) 上独立的一步；每轮的第 1 个 token 就是一步接受 / 拒绝的输出（被接受的草稿，或拒绝后的修正 token），
stats["accepted"] 告诉我们每轮接受了没有、每轮产出几个 token（全部接受时多一个从 p 抽的"额外 token"，不计入检验）。
朴素规则和"拒绝后从 p 抽"不在 decode_lab 里（它们是反例），由本脚本的 sample_other_rule 向量化地抽。

【模型的假设（务必看）】这里的分布都是手工写的（4 个 token 的词表），不是模型的输出；T = 0 的情形用 decode_lab.adjust
从手写的 logits 得到 one-hot 的 p。一步规则来自 Leviathan 等 2023（arXiv 2211.17192）：输出分布 = p 的证明在它的附录 A.1（Chen 等 2023 的定理 1 是同一件事），
一个 token 被接受的概率 β = Σ min(p, q) 是它的定理 3.5；α = E[β]（论文的定义），推论 3.6：α = E[Σ min(p, q)]。
服务引擎的"接受率"（演示 1 观察 7）：vLLM 的 /metrics 计数 spec_decode_num_accepted_tokens 和 spec_decode_num_draft_tokens，
acceptance rate = 两者之比（NVIDIA NeMo AutoModel 的 bench_vllm 文档、AIPerf 文档按这个定义读它）。
Chen 等 2023（arXiv 2302.01318）的"修正拒绝采样"是同一个规则。

【运行】python3 02_rejection_sampling.py （约 1.4 秒）

【依赖】numpy；本目录的 decode_lab（residual_distribution、speculative_step_probs、acceptance_rate、adjust、
NGramLM、speculative_generate）、spec_math_lab（expected_tokens）、stats_lab（chi2_gof）；../lecture02 的 transformer_lab（sample_inverse_cdf）；
../lecture01 的 console（fmt_bound 等）。
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
for sub in ("lecture06", "lecture02", "lecture01"):
    sys.path.insert(0, os.path.join(HERE, "..", sub))

from console import fmt_bound, fmt_p, print_header, print_observations, print_table  # noqa: E402
from console import save_results  # noqa: E402
from decode_lab import (acceptance_rate, adjust, NGramLM, residual_distribution, speculative_generate,  # noqa: E402
                        speculative_step_probs)
from spec_math_lab import expected_tokens  # noqa: E402
from stats_lab import chi2_gof  # noqa: E402
from transformer_lab import sample_inverse_cdf  # noqa: E402

# ---- 手工构造的 (p, q)：p = 目标，q = 草稿（都是假设的例子，不来自任何模型）----
LOGITS_P = np.array([2.0, 1.0, 0.5, -1.0])     # T = 0 时 p 是 argmax 处的 one-hot
LOGITS_Q = np.array([1.0, 1.5, 0.0, -0.5])     # 草稿按 T = 1 抽
CASES = [
    ("一般情形", [0.5, 0.2, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]),
    ("草稿过于自信", [0.3, 0.3, 0.2, 0.2], [0.7, 0.1, 0.1, 0.1]),
    ("p == q", [0.4, 0.3, 0.2, 0.1], [0.4, 0.3, 0.2, 0.1]),
    ("支撑不相交", [0.6, 0.4, 0.0, 0.0], [0.0, 0.0, 0.5, 0.5]),
    ("q 在 p > 0 处为 0", [0.4, 0.3, 0.2, 0.1], [0.7, 0.3, 0.0, 0.0]),
    ("p one-hot（T = 0）", list(adjust(LOGITS_P, 0)), list(adjust(LOGITS_Q, 1.0))),   # q 是 T = 1 的分布
]
ONEHOT = CASES[-1][0]
ENUM_BOUND = 1e-15        # 精确枚举只差浮点舍入：打印成这个上界
N_SAMPLES = 10000         # 演示 4 每个情形抽几次
SEED = 0
CHUNK = 200               # 演示 4：decode_lab 的生成器每次生成多少个 token（分段调用，序列不会太长）
GAMMA = 4                 # 演示 3 用来换算"每轮产出几个 token"的草稿长度（演示 1 观察 7 也用它）
# 演示 1 第三张表多加的一个情形（手写的例子）：草稿取 argmax 反而接受得更多
GREEDY_EXTRA = ("p = (1, 0)、q = (0.6, 0.4)", [1.0, 0.0], [0.6, 0.4])
# 引用的数（不在本脚本里算）：06/12_production_trees.py 演示 2 的表，SmolLM2 的 k = 1 行，"独立"列（从 q 抽，
# = Σ min(p, q)）和"前 k 名"列（草稿取 argmax，= p(argmax q)）；tests/test_lecture06_01_02.py 核对它们和 06/12 打印的一致
SMOLLM2_K1 = (0.723, 0.498)


def fmt_dist(x):
    """分布 -> "0.50 0.20 0.20 0.10"。"""
    return " ".join(f"{v:.2f}" for v in x)


def case_arrays():
    return [(name, np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)) for name, p, q in CASES]


def greedy_draft_rows(cases):
    """
    草稿取 argmax（q 变成 argmax q 上的点质量）时一个草稿被接受的概率 -> [(情形, p, q, Σ min(p, q), p(argmax q))]。

    【推导】点质量 q' = onehot(argmax q)：α' = Σ min(p, q') = min(p(x*), 1) = p(x*)，x* = argmax q。
    【边界】q 的最大值并列时 argmax 不唯一（草稿取哪个由实现定），这样的情形不列。
    """
    rows = []
    for name, p, q in cases:
        if int((q == q.max()).sum()) != 1:
            continue
        rows.append((name, p, q, acceptance_rate(p, q), float(p[int(np.argmax(q))])))
    return rows


def engine_rate_example(alpha, gamma):
    """
    服务引擎的"接受率"（被接受的草稿 ÷ 草稿的 token）和 α 的差别 -> dict：alpha、e（式 (1) 的每轮 token）、
    rate = (e − 1) / γ（引擎报的数，期望上）、e_wrong（把 rate 误当成 α 代进式 (1) 得到的每轮 token）。
    """
    e = expected_tokens(alpha, gamma)
    rate = (e - 1) / gamma
    return {"alpha": alpha, "e": e, "rate": rate, "e_wrong": expected_tokens(rate, gamma)}


# -----------------------------------------------------------------------------
def demo1_enumeration():
    print_header("演示 1：精确枚举一步接受 / 拒绝——输出分布 = p，不管 q 是什么")
    rows, rows2, res = [], [], {}
    for name, p, q in case_arrays():
        out = speculative_step_probs(p, q)
        alpha = acceptance_rate(p, q)
        tv = 0.5 * float(np.abs(p - q).sum())
        resid = residual_distribution(p, q)
        guarded = float(np.maximum(p - q, 0.0).sum()) == 0.0
        err = float(np.abs(out - p).max())
        res[name] = {"alpha": alpha, "tv": tv, "err": err, "residual": resid, "out": out, "guarded": guarded}
        rows.append([name, fmt_dist(p), fmt_dist(q), f"{alpha:.3f}", f"{1 - tv:.3f}"])
        rows2.append([name, ("0/0 → 用 p：" if guarded else "") + fmt_dist(resid), fmt_dist(out), fmt_bound(err, ENUM_BOUND)])
    print_table(["情形", "p（目标）", "q（草稿）", "α = Σmin(p,q)", "1 − TV(p,q)"], rows)
    print()
    print("同样的情形：拒绝后用的残差分布，和精确枚举出来的一步输出分布")
    print_table(["情形", "残差 norm(max(0, p − q))", "输出（枚举）", "max |输出 − p|"], rows2)
    extra = (GREEDY_EXTRA[0], np.asarray(GREEDY_EXTRA[1]), np.asarray(GREEDY_EXTRA[2]))
    greedy = greedy_draft_rows(case_arrays() + [extra])
    print()
    print("草稿取 argmax（q 变成 argmax q 上的点质量）时一个草稿被接受的概率（q 的最大值并列的情形不列）")
    print_table(["情形", "p（目标）", "q（草稿）", "从 q 抽\nΣ min(p, q)", "取 argmax\np(argmax q)"],
                [[n, fmt_dist(p), fmt_dist(q), f"{a:.3f}", f"{g:.3f}"] for n, p, q, a, g in greedy])
    by_name = {n: {"alpha": a, "greedy": g} for n, p, q, a, g in greedy}
    n_lower = sum(g < a for n, p, q, a, g in greedy)
    drop_name = "草稿过于自信"
    drop, extra = by_name[drop_name], by_name[GREEDY_EXTRA[0]]
    worst = max(r["err"] for r in res.values())
    max_gap = max(abs(r["alpha"] - (1 - r["tv"])) for r in res.values())
    n_guard = sum(r["guarded"] for r in res.values())
    oh = res[ONEHOT]
    eng = engine_rate_example(res["一般情形"]["alpha"], GAMMA)
    gen_a, gen_e, eng_rate, eng_e = eng["alpha"], eng["e"], eng["rate"], eng["e_wrong"]
    print_observations([
        f"{len(res)} 个情形，输出分布和 p 的最大差都 {fmt_bound(worst, ENUM_BOUND)}（只有浮点舍入）：接受 / 拒绝规则不改变分布，"
        "草稿只影响快慢（α），不影响结果。这就是\"投机解码是精确的\"的全部秘密（Leviathan 附录 A.1）。",
        f"α = Σ min(p, q) 和 1 − TV(p, q) 逐行相等（最大差 {fmt_bound(max_gap, ENUM_BOUND)}）：草稿和目标越接近，接受得越多；"
        f"p == q 时 α = {res['p == q']['alpha']:.3f}（全部接受），支撑不相交时 α = {res['支撑不相交']['alpha']:.3f}（一个都不接受，"
        "输出全靠残差，而残差这时就是 p）。",
        f"残差 max(0, p − q) 只在 p > q 的 token 上有质量：草稿少给了多少，拒绝之后就补多少。p == q 时它全是 0，"
        f"归一化是 0/0（这里 {n_guard} 个情形被 residual_distribution 兜底成 p）；那时拒绝的概率是 0，兜底成什么都不影响分布，"
        "但不能真的去算 0/0（那会得到非数）。",
        f"q 在 p > 0 的地方是 0 也没关系：草稿抽不到的 token 由残差补上。p 是 one-hot（T = 0）时 α = q(argmax p) = "
        f"{oh['alpha']:.3f}，残差也是同一个 one-hot：输出必定是 argmax p，和贪心解码一样。",
        "这里的 p、q 是采样时真正用的分布，两边的要求不一样。输出等于测试里的那个 p，所以用户的采样设置（温度、top-k、"
        "top-p、重复惩罚）必须原样作用在 p 上；q 不必经过同样的设置，它必须是草稿 token 真正从中抽出来的那个分布"
        "（草稿按 top-p 抽，q 就是截过的 q；草稿取 argmax，q 就是那个 token 上的点质量）。q 用错了，输出就不再是 p。"
        "vLLM V1 的 EAGLE / MTP 草稿就取 argmax（vllm/v1/spec_decode/eagle.py），没有草稿概率时拒绝采样把 q(x) 记作 1、"
        "残差取 p 去掉 x（vllm/v1/sample/rejection_sampler.py 的 NO_DRAFT_PROBS）：正是 06/12 的点质量规则。",
        f"草稿改取 argmax，一个草稿被接受的概率就从 Σ min(p, q) 变成 p(argmax q)（上面第三张表）。表里 {len(greedy)} 个情形"
        f"有 {n_lower} 个变低（{drop_name}：{drop['alpha']:.3f} → {drop['greedy']:.3f}），但不是一定变低："
        f"{GREEDY_EXTRA[0]} 时 {extra['alpha']:.3f} → {extra['greedy']:.3f}（p 全压在 q 的第一名上）。"
        f"06/12 演示 2 在 SmolLM2 的文本上算了同一对数（表里 k = 1 行的\"独立\"和\"前 k 名\"两列）：从 q 抽 "
        f"{SMOLLM2_K1[0]:.3f}，取 argmax {SMOLLM2_K1[1]:.3f}，那段文本上是变低了。",
        f"α 在这里是一个草稿 token 被接受的概率 Σ min(p, q)。服务引擎报的\"接受率\"（例如 vLLM 的 /metrics："
        "被接受的草稿 token ÷ 草稿的 token）是另一个数：第一次拒绝之后的草稿都算没被接受，所以期望上它等于 (E − 1) / γ，"
        f"随 γ 变大而变小。一般情形 α = {gen_a:.3f}、γ = {GAMMA} 时每轮 E = {gen_e:.2f} 个 token，引擎会报 "
        f"{eng_rate:.3f}；把它当 α 代进式 (1) 得 {eng_e:.2f}，低估了 {(1 - eng_e / gen_e) * 100:.0f}%。"
        "要用式 (1)，得先用引擎报的每轮平均接受长度 E 反解出 α。",
    ])
    return res


# -----------------------------------------------------------------------------
def demo2_decomposition():
    name, p, q = case_arrays()[4]
    print_header(f"演示 2：拆开一个例子（{name}）——min(p, q) + max(0, p − q) = p")
    alpha = acceptance_rate(p, q)
    resid = residual_distribution(p, q)
    rows = []
    acc_part = np.zeros_like(p)
    rej_part = np.zeros_like(p)
    for x in range(len(p)):
        acc_prob = min(1.0, p[x] / q[x]) if q[x] > 0 else None
        acc_part[x] = q[x] * acc_prob if acc_prob is not None else 0.0
        rej_part[x] = (1 - alpha) * resid[x]
        rows.append([x, f"{p[x]:.2f}", f"{q[x]:.2f}", "—" if acc_prob is None else f"{acc_prob:.3f}",
                     f"{acc_part[x]:.3f}", f"{rej_part[x]:.3f}", f"{acc_part[x] + rej_part[x]:.3f}"])
    rows.append(["合计", f"{p.sum():.2f}", f"{q.sum():.2f}", "", f"{acc_part.sum():.3f}", f"{rej_part.sum():.3f}",
                 f"{(acc_part + rej_part).sum():.3f}"])
    print("（\"—\"：q(x) = 0，草稿抽不到这个 token）")
    print_table(["token x", "p(x)", "q(x)", "接受概率 min(1, p/q)", "q·接受概率 = min(p,q)", "(1 − α)·残差(x)",
                 "输出 x 的概率"], rows)
    err = float(np.abs(acc_part + rej_part - p).max())
    excess = float(np.maximum(p - q, 0).sum())
    print_observations([
        f"\"接受并输出 x\"的概率是 q(x)·min(1, p(x)/q(x)) = min(p(x), q(x))，加起来就是接受率 α = {acc_part.sum():.3f}。",
        f"拒绝的总概率 1 − α = {1 - alpha:.3f}，正好等于残差的总质量 Σ max(0, p − q) = {excess:.3f}（= TV(p, q)），"
        "所以 (1 − α)·norm(max(0, p − q)) = max(0, p − q)：归一化的分母和拒绝概率相消。",
        f"两部分相加 min(p, q) + max(0, p − q) = p，逐 token 成立（最大差 {fmt_bound(err, ENUM_BOUND)}）。"
        "这就是 Leviathan 附录 A.1 的证明：草稿多给的（q > p）按比例拒掉，少给的（p > q）拒绝之后补上。",
    ])
    return {"alpha": alpha, "reject": 1 - alpha, "residual_mass": excess, "accept_part": acc_part,
            "reject_part": rej_part, "err": err}


# -----------------------------------------------------------------------------
def rule_outputs(p, q):
    """三种别的规则一步的输出分布（精确）和接受率 -> dict。"""
    alpha = acceptance_rate(p, q)
    return {
        # 朴素：目标自己抽 y ~ p，草稿 x ~ q 和 y 相同就"接受"；输出总是 y
        "naive": (p.copy(), float((p * q).sum())),
        # 错误：按 min(1, p/q) 接受，但拒绝后从 p（而不是残差）重抽
        "resample_p": (np.minimum(p, q) + (1 - alpha) * p, alpha),
        # 错误：草稿一律接受
        "always": (q.copy(), 1.0),
    }


def demo3_other_rules():
    print_header(f"演示 3：别的规则——朴素的\"相等才接受\"分布对但接受得少；拒绝后从 p 重抽分布就错了（γ = {GAMMA}）")
    rows, res = [], {}
    for name, p, q in case_arrays():
        alpha = acceptance_rate(p, q)
        r = rule_outputs(p, q)
        naive_alpha = r["naive"][1]
        err_p = float(np.abs(r["resample_p"][0] - p).max())
        err_q = float(np.abs(r["always"][0] - p).max())
        res[name] = {"alpha": alpha, "naive_alpha": naive_alpha, "err_resample_p": err_p, "err_always": err_q,
                     "E_correct": expected_tokens(min(alpha, 1.0), GAMMA),
                     "E_naive": expected_tokens(min(naive_alpha, 1.0), GAMMA),
                     "resid_is_p": bool(np.abs(residual_distribution(p, q) - p).max() <= ENUM_BOUND)}
        rows.append([name, f"{alpha:.3f}", f"{naive_alpha:.3f}", f"{res[name]['E_correct']:.2f}",
                     f"{res[name]['E_naive']:.2f}", fmt_bound(float(np.abs(r["naive"][0] - p).max()), ENUM_BOUND),
                     f"{err_p:.3f}", f"{err_q:.3f}"])
    print(f"α：一个草稿被接受的概率；每轮 token：式 (1)，γ = {GAMMA}；|Δ| = |输出 − p|，精确枚举")
    print_table(["情形", "α\n修正", "α 朴素\nΣ p·q", "每轮 token\n修正", "每轮 token\n朴素", "朴素\nmax|Δ|",
                 "从 p 重抽\nmax|Δ|", "一律接受\nmax|Δ|"], rows)
    general = res["一般情形"]
    oh = res[ONEHOT]
    bad = [n for n, r in res.items() if r["err_resample_p"] > ENUM_BOUND]
    ok = [n for n, r in res.items() if r["err_resample_p"] <= ENUM_BOUND]
    # 碰巧对的原因：从不拒绝（α = 1），或者残差正好就是 p（支撑不相交、p one-hot）
    never_reject = [n for n in ok if res[n]["alpha"] > 1 - ENUM_BOUND]
    resid_is_p = [n for n in ok if n not in never_reject and res[n]["resid_is_p"]]
    gaps = {n: r["alpha"] - r["naive_alpha"] for n, r in res.items()}
    widest = max(gaps, key=gaps.get)
    always_ok = [n for n, r in res.items() if r["err_always"] <= ENUM_BOUND]
    print_observations([
        "朴素规则：目标在这个位置自己抽一个 y ~ p，和草稿的 x 相同才算\"接受\"，输出总是 y——分布当然是 p，但两个独立的抽样"
        f"碰巧相同的概率只有 Σ p·q ≤ Σ min(p, q)。一般情形 {general['naive_alpha']:.3f} vs {general['alpha']:.3f}，"
        f"γ = {GAMMA} 时每轮只产出 {general['E_naive']:.2f} 个 token 而不是 {general['E_correct']:.2f} 个；"
        f"差得最多的是 {widest}：{res[widest]['naive_alpha']:.3f} vs {res[widest]['alpha']:.3f}"
        "（草稿完全对，朴素规则却只在两次独立抽样撞上时接受）。",
        f"p 是 one-hot（T = 0）时两者相同（{oh['naive_alpha']:.3f} = {oh['alpha']:.3f}）：目标的\"抽样\"就是它的 argmax，"
        "朴素规则变成\"草稿抽到的 token 等于目标的 argmax 才接受\"，和修正拒绝采样是同一个规则。",
        f"拒绝后从 p 重抽（而不是从残差）：输出 = min(p, q) + (1 − α)·p，偏向草稿也喜欢的 token。{len(bad)} 个情形分布错了，"
        f"最大差 {max(r['err_resample_p'] for r in res.values()):.3f}。碰巧对的 {len(ok)} 个情形各有原因：从不拒绝"
        f"（{'、'.join(never_reject)}），或残差正好等于 p、从 p 抽和从残差抽是一回事（{'、'.join(resid_is_p)}）。",
        f"草稿一律接受，输出就是 q，差多少取决于草稿多差（只有 {'、'.join(always_ok)} 是对的）。",
    ])
    return res


# -----------------------------------------------------------------------------
def table_lm(probs):
    """分布 probs [V] -> 上下文无关的 NGramLM：每一行都是 log probs（概率为 0 的 token 是 −inf，softmax 之后还是 0）。"""
    with np.errstate(divide="ignore"):
        row = np.log(np.asarray(probs, dtype=np.float64))
    return NGramLM(np.tile(row, (len(row), 1)))


def sample_correct_via_lab(p, q, n, rng):
    """
    用 decode_lab.speculative_generate 本身跑修正拒绝采样，取 n 轮 -> (每轮的第 1 个 token [n], 这一轮接受了草稿没有 [n])。

    【做法】目标 = table_lm(p)、草稿 = table_lm(q)，γ = 1、T = 1，每次生成 CHUNK 个 token，按 stats["accepted"] 切出每一轮：
    接受了（1）这一轮产出 [草稿 token, 额外 token]，拒绝了（0）只产出 [修正 token]。每轮的第 1 个 token 是一步接受 / 拒绝的
    输出；额外 token 直接从 p 抽，不计入。分布不随上下文变，所以各轮独立、同分布。
    """
    target, draft = table_lm(p), table_lm(q)
    first, acc = [], []
    while len(first) < n:
        out, st = speculative_generate(target, draft, [0], CHUNK, 1, 1.0, rng)
        pos = 0
        for a in st["accepted"]:   # 每一轮都从 out 里还没截掉的位置开始，所以 out[pos] 一定存在
            first.append(int(out[pos]))
            acc.append(a == 1)
            pos += a + 1
    return np.asarray(first[:n], dtype=np.int64), np.asarray(acc[:n])


def sample_other_rule(p, q, n, rng, rule):
    """
    两个不在 decode_lab 里的规则（反例），向量化地抽 n 次 -> (输出 token [n], 是否接受草稿 [n])。每次用 3 个均匀数。

    rule="naive"：草稿抽 x ~ q、目标自己抽 y ~ p，x == y 才算接受，输出总是 y；
    rule="resample_p"（错误）：r·q(x) < p(x) 就接受 x（和修正拒绝采样一样），拒绝后从 p 抽（而不是从残差抽）。
    """
    V = len(p)
    u_draft, u_accept, u_fix = rng.random(n), rng.random(n), rng.random(n)
    x = sample_inverse_cdf(np.broadcast_to(q, (n, V)), u_draft)
    y = sample_inverse_cdf(np.broadcast_to(p, (n, V)), u_fix)
    if rule == "naive":
        return y, x == y
    if rule != "resample_p":
        raise ValueError(f"未知的规则 {rule!r}（正确的规则用 sample_correct_via_lab）")
    accept = u_accept * q[x] < p[x]
    return np.where(accept, x, y), accept


def demo4_sampling():
    print_header(f"演示 4：真的抽样（种子 {SEED}，每个情形 {N_SAMPLES} 次）——计数 vs p，χ² 拟合优度检验")
    rng = np.random.default_rng(SEED)
    runs = [(name, p, q, "correct") for name, p, q in case_arrays()]
    gen = case_arrays()[0]
    runs += [(gen[0], gen[1], gen[2], "naive"), (gen[0], gen[1], gen[2], "resample_p")]
    label = {"correct": "修正（decode_lab 生成器）", "naive": "朴素（相等才接受）",
             "resample_p": "错：拒绝后从 p 抽"}
    rows, rows2, res = [], [], {}
    for name, p, q, rule in runs:
        if rule == "correct":
            toks, acc = sample_correct_via_lab(p, q, N_SAMPLES, rng)
        else:
            toks, acc = sample_other_rule(p, q, N_SAMPLES, rng, rule)
        counts = np.bincount(toks, minlength=len(p))
        stat, dof, pv = chi2_gof(counts, p)
        alpha_exact = float((p * q).sum()) if rule == "naive" else acceptance_rate(p, q)
        acc_rate = float(acc.mean())
        se = float(np.sqrt(alpha_exact * (1 - alpha_exact) / N_SAMPLES))
        res[(name, rule)] = {"counts": counts, "chi2": stat, "dof": dof, "pvalue": pv, "accept": acc_rate,
                             "alpha": alpha_exact, "se": se}
        rows.append([name, label[rule], " ".join(str(c) for c in counts), " ".join(f"{v * N_SAMPLES:.0f}" for v in p)])
        rows2.append([name, label[rule], f"{stat:.2f}", dof if dof >= 1 else "—", fmt_p(pv) if dof >= 1 else "—",
                      f"{acc_rate:.3f}", f"{alpha_exact:.3f}"])
    print("各 token（0、1、2、3）被抽到的次数和期望次数（朴素规则和错误的规则由本脚本抽）：")
    print_table(["情形", "规则", "计数", "期望 N·p"], rows)
    print()
    print("χ² 拟合优度检验（\"—\"：只有一个可能的结果，没有自由度）和接受的比例：")
    print_table(["情形", "规则", "χ²", "自由度", "p 值", "接受比例\n（实测）", "接受率\n（精确）"], rows2)
    correct = {k: v for k, v in res.items() if k[1] == "correct" and v["dof"] >= 1}
    min_pv = min(v["pvalue"] for v in correct.values())
    max_z = max(abs(v["accept"] - v["alpha"]) / v["se"] for k, v in res.items() if v["se"] > 0)
    bad = res[(gen[0], "resample_p")]
    naive = res[(gen[0], "naive")]
    oh = res[(ONEHOT, "correct")]
    print_observations([
        f"修正拒绝采样（跑的是 decode_lab.speculative_generate 本身，每个情形 {N_SAMPLES} 轮、每轮取第 1 个 token）的 "
        f"{len(correct)} 个可检验的情形，χ² 检验的 p 值最小 {fmt_p(min_pv)}：计数和 N·p 在抽样误差以内一致"
        "（p 值在分布正确时是 [0, 1] 上的均匀数，大小本身不说明\"更对\"，只有很小——比如 < 0.001——才是证据）。",
        f"p 是 one-hot 时，{N_SAMPLES} 次全部输出 token {int(np.argmax(oh['counts']))}（计数 {int(oh['counts'].max())}），"
        "没有可以检验的自由度。",
        f"实测的接受比例和精确的接受率相差最多 {max_z:.1f} 个标准误（标准误 √(α(1 − α)/N)）。朴素规则实测接受 "
        f"{naive['accept']:.3f}（精确 Σ p·q = {naive['alpha']:.3f}），分布检验 p 值 {fmt_p(naive['pvalue'])}：分布对，只是接受得少。",
        f"错误的\"拒绝后从 p 抽\"被同样大小的检验抓住：χ² = {bad['chi2']:.0f}，p 值 {fmt_p(bad['pvalue'])}——"
        "这也是测试要做的事：统计检验要有能力发现错的实现，不然\"通过\"没有意义。",
    ])
    return res


if __name__ == "__main__":
    E1 = demo1_enumeration()
    demo2_decomposition()
    E3 = demo3_other_rules()
    E4 = demo4_sampling()
    save_results({"e1": E1, "e3": E3, "e4": E4})        # 给测试（console.save_results）：只在设了 CS349E_RESULTS 时存下这些数
