"""
=============================================================================
CS349E · 第 6 讲 · 12_production_trees.py —— 真实系统验证的树：不同的候选、有损的捷径、动态树
=============================================================================

【这个脚本要回答的问题】
09 证明的多候选规则要候选从草稿 q 独立、有放回地抽；10 的 top-k 树只在 T = 0 走过。真实系统的树两样都不是：
演示 1：候选互不相同时怎么验证才不改变分布：无放回地抽（递归拒绝采样，RSD）和草稿的前 k 名（点质量规则，EAGLE）——
小词表上精确枚举，输出 = p（k 一直到词表大小；k 超过 q 的支撑时截在支撑）；三种规则的接受率。
演示 2：k = 1…8 个候选时每种规则的接受率：04 的玩具和 SmolLM2 的跳层草稿，温度 1，无放回的用抽样（带置信区间）。
演示 3：不精确的两条捷径：Medusa 的典型接受、"候选是目标的 argmax 就接受"（T > 0）——3 个 token 的例子上的输出分布、
它离 p 多远（TV）、χ² 检验在抽样上拒绝它；在 SmolLM2 上它们比精确规则多接受多少、代价是多大的 TV。
演示 4：EAGLE-2 的动态树：按草稿的路径概率长树、留下预算内最好的节点、点质量规则验证；预算 4…64 个节点时每次目标调用
产出几个 token，对照同样位置数的链和 09 / 10 的固定形状的树（T = 0 和 T = 1）；树从哪个预算起超过链，为什么。

【怎么读输出】p = 目标的分布，q = 草稿的分布（Leviathan 的记号）。"α_k" = k 个候选里有一个被接受的概率在各个位置上的
平均（k = 1 的独立规则就是 04 的 α）。"± " 是 95% 置信区间的半宽（只有无放回那一列是抽样）。"每次调用 token" = 如果
一轮从这个位置开始，目标一次前向平均产出的 token 数，对位置取平均；"位置/次" = 这次前向打分的位置数（节点 + 1）。
"max |Δ|" 只有浮点舍入，打印成上界（"< 1e-15"），所以打印的字节不依赖机器。

【模型的假设（务必看）】
- 玩具 = 04 的目标和"只用前 1 层"的草稿（drafts_lab），在目标自己采样的 8 × 64 个 token 上测（同 09 的 α_k）。
- SmolLM2-135M-Instruct（第 2 讲 real_model_lab），float32（贪心文本、演示 4 的树）；文本上各位置的 p、q 用 float64 再算一遍
  （同样的权重：演示 2 从 q 抽候选，float32 的舍入随 BLAS 的内核变，会让打印的第 3 位小数跟着变）；草稿 = 跳过第 14–15 层（30 层留 28 层，Draft & Verify 那样
  不训练）。文本 = 一个散文提示（聊天格式）的 48 个贪心新 token；演示 2、3 用它的 48 个位置，演示 4 用前 16 个位置
  （每个位置长一次树、目标前向一次：为了运行时间）。温度 1 的数也在这段贪心文本上算（同 10 的 α T = 1）。
  位置这么少，SmolLM2 的数只说明这段文本，换一段会变；float32 的 argmax 在几乎并列的地方可能和 float64 不同
  （T = 0 的动态树 == 贪心在 float64 下由测试核对）。
- 动态树：top_k = 10、depth = 6（tree_lab 的 EAGLE2_TOP_K、EAGLE2_DEPTH：EAGLE 仓库的默认在 depth 5–7、top_k 8–10、
  total_token 60–63 之间），长树用草稿 T = 1 的 softmax，验证用点质量规则；每次调用的 token 是每个位置的精确条件期望
  （tree_lab.dynamic_tree_expected：走到节点 v 的概率 = 目标的路径概率），不抽样。链在 T = 1 用式 (1)、09 的固定树用
  tree_expected_tokens（都假设各位置独立，08 说过这会高估：对链有利）。
- Medusa 的 ε = 0.09、δ = 0.3 是它代码的默认值（distinct_lab 的说明里写了出处）；草稿的候选一律是前 k 名。

【运行】python3 12_production_trees.py （空闲的 2 核机器、一个 BLAS 线程：约 42 秒，和种子 04 背靠背三对，比值中位数 2.9 倍
（2.7–3.2），内存峰值约 3.2 GB。大部分时间在装模型、贪心续写和演示 4 的 16 棵树（每棵 7 次草稿前向、1 次目标前向））

【依赖】numpy；本目录的 distinct_lab（不同候选的精确规则、有损规则、置信区间）、tree_lab（独立候选的规则、动态树）、
decode_lab（模型、adjust）、drafts_lab（玩具、跳层草稿）、stats_lab（χ²）；../lecture02 的 real_model_lab（装 SmolLM2）、hub_lab（gguf_path_or_exit）、
transformer_lab；../lecture03 的 quant_lab（需要 ../prereq3）；../lecture01 的 console。
【来源】Jeon et al. 2024，Recursive Speculative Decoding（arXiv 2402.14160）；Cai et al. 2024，Medusa（arXiv 2401.10774，
§2.3.1）；Li et al. 2024，EAGLE-2（arXiv 2406.16858）；Miao et al. 2024，SpecInfer（arXiv 2305.09781）。
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
for sub in ("lecture01", "lecture02", "lecture03", "prereq3"):
    sys.path.insert(0, os.path.join(HERE, "..", sub))

from console import fmt_bound, fmt_p, print_header, print_note, print_observations, print_table  # noqa: E402
from decode_lab import TransformerLM, acceptance_rate, adjust, autoregressive_generate  # noqa: E402
from distinct_lab import (MEDUSA_DELTA, MEDUSA_EPSILON, distinct_draft_acceptance,  # noqa: E402
                          distinct_rejection_products, lossy_acceptance, lossy_step_probs, lossy_verify, mean_ci, topk_acceptance,
                          topk_candidates, topk_draft_step_probs, topk_draft_verify, total_variation,
                          typical_threshold)
from drafts_lab import build_seed04_models, layer_skip_draft  # noqa: E402
from greedy_lab import token_ranks  # noqa: E402
from quant_lab import QCFG, sample_tokens  # noqa: E402
from hub_lab import gguf_path_or_exit  # noqa: E402
from real_model_lab import load_gguf  # noqa: E402
from transformer_lab import config_like  # noqa: E402
from stats_lab import chi2_gof  # noqa: E402
from tree_lab import (EAGLE2_DEPTH, EAGLE2_TOP_K, distinct_draft_step_probs, dynamic_tree_expected,  # noqa: E402
                      multi_draft_acceptance, tree_expected_tokens)

# ---- 手工构造的 (p, q)：p = 目标，q = 草稿（假设的例子，不来自任何模型）----
CASES = [
    ("一般情形", [0.5, 0.2, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]),
    ("草稿过于自信", [0.3, 0.3, 0.2, 0.2], [0.7, 0.1, 0.1, 0.1]),
    ("p、q 都有 0", [0.6, 0.4, 0.0, 0.0, 0.0], [0.5, 0.1, 0.3, 0.0, 0.1]),
    ("p == q", [0.4, 0.3, 0.2, 0.1], [0.4, 0.3, 0.2, 0.1]),
    ("支撑不相交", [0.6, 0.4, 0.0, 0.0], [0.0, 0.0, 0.5, 0.5]),
    ("q one-hot（T = 0）", [0.5, 0.2, 0.2, 0.1], [0.0, 1.0, 0.0, 0.0]),
]
ENUM_BOUND = 1e-15                # 精确枚举只差浮点舍入：打印成这个上界
DEMO1_KS = (1, 2, 3)              # 演示 1 的接受率表
KS = tuple(range(1, 9))           # 演示 2：候选数 k = 1..8
TOY_DRAFT = "只用前 1 层"          # 演示 2 的玩具草稿
TOY_TEXT = {"n_seq": 8, "length": 64, "seed": 0}   # 同 09 的 α_k
TOY_DRAWS, REAL_DRAWS = 64, 32    # 无放回：每个位置抽几组候选
PRUNE = 1e-8                      # SmolLM2 上抽无放回的候选之前去掉 p、q 都 ≤ 它的 token（为了快；去掉的质量打印出来）
# ---- 演示 3：3 个 token 的手算例子：(名字, p, q)；候选 = q 的前 k 名 ----
LOSSY_CASES = [
    ("两个候选都过线", [0.5, 0.3, 0.2], [0.1, 0.6, 0.3], 2),
    ("候选是 argmax", [0.5, 0.3, 0.2], [0.6, 0.3, 0.1], 1),
    ("候选不过线", [0.9, 0.06, 0.04], [0.1, 0.8, 0.1], 1),
]
CHI2_N = 2000                     # 演示 3：每个规则抽几次做 χ² 检验
LOSSY_KS = (1, 2, 4, 8)
# ---- SmolLM2 ----
PROMPT = "Write a short paragraph about the ocean."
N_TEXT = 48                       # 贪心续写的新 token 数（演示 2、3 的位置）
N_TREE_POS = 16                   # 演示 4：前 16 个位置各长一棵树
SKIP = (14, 2)                    # 跳层草稿：跳过第 14–15 层
BUDGETS = (4, 8, 16, 32, 64)      # 演示 4：每轮验证的节点数
SEED = 0

_CTX = {}


def fmt_dist(x):
    return " ".join(f"{v:.2f}" for v in x)


def _to_f64(P):
    """参数（dict / list 套着数组）的 float64 副本。"""
    if isinstance(P, dict):
        return {k: _to_f64(v) for k, v in P.items()}
    if isinstance(P, list):
        return [_to_f64(v) for v in P]
    return np.asarray(P, dtype=np.float64)


def smollm2():
    """装 SmolLM2、造跳层草稿、贪心续写、两边 teacher forcing 一次 -> dict（整个脚本只做一次）。"""
    if _CTX:
        return _CTX
    P, cfg, tok = load_gguf(dtype=np.float32)
    target = TransformerLM(P, cfg, "目标")
    draft = layer_skip_draft(target, *SKIP)
    prompt = tok.chat(PROMPT)
    text = autoregressive_generate(target, prompt, N_TEXT, 0.0, np.random.default_rng(SEED))
    seq = np.asarray([prompt + [int(t) for t in text]])
    # p、q 用 float64 算（同样的权重：float32 的值原样转成 float64）：演示 2 要从 q 抽候选，float32 的舍入随 BLAS 的
    # 内核变（1e-5 量级），会让个别抽样落到 CDF 的另一边、打印的第 3 位小数跟着变；float64 下只差 1e-13 量级
    t64 = TransformerLM(_to_f64(P), config_like(cfg, dtype="float64"), "目标（float64）")
    lp = t64.full_logits(seq)[0, len(prompt) - 1:-1]
    lq = layer_skip_draft(t64, *SKIP).full_logits(seq)[0, len(prompt) - 1:-1]
    del t64
    _CTX.update(target=target, draft=draft, prompt=prompt, text=text, lp=lp, lq=lq, cfg=cfg,
                ranks=token_ranks(lq, text), target_mismatch=int((token_ranks(lp, text) != 0).sum()))
    return _CTX


def fmt_ks(ks):
    """k 的列表：连续的写成 "2…8"，否则用顿号隔开；空的写 "没有"。"""
    ks = list(ks)
    if not ks:
        return "没有"
    if len(ks) > 2 and ks == list(range(ks[0], ks[-1] + 1)):
        return f"{ks[0]}…{ks[-1]}"
    return "、".join(str(k) for k in ks)


def accepted_at(ranks, t, widths):
    """T = 0：一轮从 t 开始、每层宽 widths（前 k 名）时接受的深度：文本的 token 连续排在草稿前 widths[r] 名的层数。"""
    r = 0
    while r < len(widths) and t + r < len(ranks) and ranks[t + r] < widths[r]:
        r += 1
    return r


# -----------------------------------------------------------------------------
def demo1_exact_rules():
    print_header("演示 1：不同的候选——无放回（RSD）和前 k 名（点质量）的输出分布（精确枚举）= p；接受率")
    rows, rows2, res = [], [], {}
    for name, p, q in CASES:
        p, q = np.asarray(p), np.asarray(q)
        V, s = p.size, int((q > 0).sum())
        err_rsd = max(float(np.abs(distinct_draft_step_probs(p, q, k) - p).max()) for k in range(1, V + 1))
        err_pm = max(float(np.abs(topk_draft_step_probs(p, topk_candidates(q, k)) - p).max()) for k in range(1, V + 1))
        a = {k: (float(multi_draft_acceptance(p, q, k)), distinct_draft_acceptance(p, q, k),
                 float(topk_acceptance(p, q, k))) for k in DEMO1_KS}
        res[name] = {"err_rsd": err_rsd, "err_pm": err_pm, "support": s, "V": V, "alpha": a}
        rows.append([name, fmt_dist(p), fmt_dist(q), f"{s} / {V}", fmt_bound(err_rsd, ENUM_BOUND),
                     fmt_bound(err_pm, ENUM_BOUND)])
        rows2.append([name] + [" / ".join(f"{x:.3f}" for x in a[k]) for k in DEMO1_KS])
    print_table(["情形", "p（目标）", "q（草稿）", "q 的支撑\n/ 词表", "无放回 max|Δ|\nk = 1..V",
                 "前 k 名 max|Δ|\nk = 1..V"], rows)
    print()
    print_note("接受率 α_k：独立（09 的规则）/ 无放回（RSD）/ 前 k 名（点质量），精确枚举。")
    print_table(["情形"] + [f"α_{k}\n独立 / 无放回 / 前 k 名" for k in DEMO1_KS], rows2)
    worst = max(max(r["err_rsd"], r["err_pm"]) for r in res.values())
    g, cap, oh = res["一般情形"]["alpha"], res["p、q 都有 0"], res["q one-hot（T = 0）"]["alpha"]
    print_observations([
        f"两种规则在每个情形、每个 k（1 到词表大小）都和 p 只差舍入（最多 {fmt_bound(worst, ENUM_BOUND)}）。无放回的规则"
        "每拒绝一个候选要做两件事：p 换成残差 norm(max(0, p − q))，q 去掉这个候选再归一化；只做后一件，分布就不对了"
        "（测试把残差那一步去掉，枚举立刻偏离 p）。",
        f"k 大于 q 的支撑时候选抽完了：\"p、q 都有 0\" 的 q 只有 {cap['support']} 个 token 能抽到，"
        f"k = {fmt_ks(range(cap['support'] + 1, cap['V'] + 1))} 截在 {cap['support']} 个候选（枚举照样等于 p）；"
        "前 k 名没有这个问题：q = 0 的 token 也排得上名次，只是排在最后。",
        f"一般情形：α_2 独立 {g[2][0]:.3f} < 无放回 {g[2][1]:.3f}——独立地抽会重复，重复的候选在残差下一定被拒绝；"
        f"前 k 名是 p(前 k 名)，k = 1 时 {g[1][2]:.3f} 不等于 Σ min(p, q) = {g[1][0]:.3f}：确定的候选丢掉了 q 的形状，"
        "好坏看 p 的质量是不是集中在 q 的前几名上。",
        f"q one-hot（T = 0 的草稿）：独立地抽 k 个都是同一个 token，α_k 不随 k 涨（{oh[1][0]:.3f} → {oh[3][0]:.3f}），"
        f"无放回也只有 1 个候选可抽；前 k 名不看 q 的大小，只看名次：k = 3 时 {oh[3][2]:.3f}（q 的名次在并列时按下标）。"
        "所以 T = 0 的树要用草稿 T = 1 的名次（演示 4）。",
    ])
    return res


# -----------------------------------------------------------------------------
def _alpha_table(p, q, n_draws, rng, prune=0.0):
    """
    一组位置：每个 k 的 (独立 α_k, (无放回 α_k, 半宽), 前 k 名 α_k) 和无放回抽样时去掉的最大质量。
    prune > 0：抽无放回的候选之前，去掉 p、q 都 ≤ prune 的 token 再归一化（大词表上为了快；去掉的质量打印出来）。
    """
    indep = [float(multi_draft_acceptance(p, q, k).mean()) for k in KS]
    prods, dropped = [], 0.0
    for pi, qi in zip(p, q):
        keep = (pi > prune) | (qi > prune)
        dropped = max(dropped, float(pi[~keep].sum()), float(qi[~keep].sum()))
        prods.append(distinct_rejection_products(pi[keep] / pi[keep].sum(), qi[keep] / qi[keep].sum(), KS[-1],
                                                 n_draws, rng))
    prods = np.stack(prods)
    rsd = [mean_ci(1.0 - prods[:, :, k - 1]) for k in KS]
    top = [float(topk_acceptance(p, q, k).mean()) for k in KS]
    return indep, rsd, top, dropped


def demo2_acceptance_k():
    print_header("演示 2：k = 1…8 个候选时每种规则的接受率 α_k（温度 1）：04 的玩具和 SmolLM2")
    target, drafts = build_seed04_models()
    toks = sample_tokens(target.params, QCFG, **TOY_TEXT)
    p_toy = adjust(target.full_logits(toks), 1.0).reshape(-1, QCFG.vocab)
    q_toy = adjust(drafts[TOY_DRAFT].full_logits(toks), 1.0).reshape(-1, QCFG.vocab)
    ctx = smollm2()
    p_real, q_real = adjust(ctx["lp"], 1.0), adjust(ctx["lq"], 1.0)
    rng = np.random.default_rng(SEED)
    toy = _alpha_table(p_toy, q_toy, TOY_DRAWS, rng)
    real = _alpha_table(p_real, q_real, REAL_DRAWS, rng, PRUNE)
    rows = []
    for i, k in enumerate(KS):
        rows.append([k] + [f"{toy[0][i]:.3f}", f"{toy[1][i][0]:.3f} ± {toy[1][i][1]:.3f}", f"{toy[2][i]:.3f}"]
                    + [f"{real[0][i]:.3f}", f"{real[1][i][0]:.3f} ± {real[1][i][1]:.3f}", f"{real[2][i]:.3f}"])
    print_note(f"玩具：04 的目标、草稿「{TOY_DRAFT}」，{len(p_toy)} 个位置（目标自己采样的文本），无放回的每个位置抽 "
               f"{TOY_DRAWS} 组；SmolLM2：跳过第 {SKIP[0]}–{SKIP[0] + SKIP[1] - 1} 层的草稿，{len(p_real)} 个位置（贪心文本），"
               f"每个位置 {REAL_DRAWS} 组（抽之前去掉 p、q 都 ≤ {PRUNE:.0e} 的 token：每个位置去掉的质量最多 "
               f"{real[3]:.1e}）。独立、前 k 名是精确值。")
    print_table(["k", "玩具\n独立", "玩具\n无放回", "玩具\n前 k 名", "SmolLM2\n独立", "SmolLM2\n无放回",
                 "SmolLM2\n前 k 名"], rows)
    V = p_real.shape[-1]
    tabs = (("玩具", toy), ("SmolLM2", real))
    k1_ok = all(abs(tab[1][0][0] - tab[0][0]) <= tab[1][0][1] for _, tab in tabs)
    above = {name: [k for i, k in enumerate(KS) if tab[1][i][0] - tab[1][i][1] > tab[0][i]] for name, tab in tabs}
    gap = {name: max(tab[1][i][0] - tab[0][i] for i in range(len(KS))) for name, tab in tabs}
    top_below = all(tab[2][i] < tab[1][i][0] - tab[1][i][1] for _, tab in tabs for i in range(len(KS)))
    k8 = len(KS) - 1
    pmax_toy, pmax_real = float(p_toy.max(-1).mean()), float(p_real.max(-1).mean())
    print_observations([
        f"k = 1 时无放回和独立是同一个规则（精确值 {toy[0][0]:.3f} / {real[0][0]:.3f}，抽样值"
        f"{'都在' if k1_ok else '不都在'}置信区间内）。k 越大无放回多接受得越多（最多多 {gap['玩具']:.3f}（玩具）、"
        f"{gap['SmolLM2']:.3f}（SmolLM2）；区间下沿高过独立的 k：玩具 {fmt_ks(above['玩具'])}、SmolLM2 "
        f"{fmt_ks(above['SmolLM2'])}）："
        "独立地抽会抽到重复的候选，重复的在残差下一定被拒绝。",
        f"前 k 名（点质量）在 k = 1…{KS[-1]} {'全都低于' if top_below else '并不都低于'}无放回（低过区间下沿）："
        f"k = 1 时是 p(草稿的 argmax)（玩具 {toy[2][0]:.3f}、SmolLM2 {real[2][0]:.3f}），k = {KS[-1]} 时 "
        f"{toy[2][k8]:.3f} / {real[2][k8]:.3f}，无放回 {toy[1][k8][0]:.3f} / {real[1][k8][0]:.3f}。玩具的 p 很平"
        f"（随机模型：p 的最大值平均 {pmax_toy:.3f}，SmolLM2 {pmax_real:.3f}），前几名只占很少的质量；确定的候选只看 q 的"
        "名次，丢掉了\"按 q 的比例抽\"本来就有的接受率。",
        f"无放回的精确值要对 O(V^k) 个候选序列求和（SmolLM2 的 V = {V}），所以这里抽样：每组候选把接受用的均匀数"
        "积分掉（distinct_rejection_products），只剩抽候选的随机性；区间是各位置抽样误差合起来的 95% 区间，"
        "位置本身（这段文本）是固定的。",
    ])
    return {"toy": toy, "real": real, "gap": gap, "above": above, "k1_ok": k1_ok, "top_below": top_below,
            "pmax": (pmax_toy, pmax_real),
            "n_toy": len(p_toy), "n_real": len(p_real)}


# -----------------------------------------------------------------------------
def demo3_lossy():
    print_header("演示 3：不精确的捷径——Medusa 的典型接受、T > 0 时\"是 argmax 就接受\"：输出分布、TV、χ²")
    rng = np.random.default_rng(SEED + 1)
    rows, res = [], {}
    for name, p, q, k in LOSSY_CASES:
        p, q = np.asarray(p), np.asarray(q)
        cand = [int(x) for x in topk_candidates(q, k)]
        tau = float(typical_threshold(p))
        for rule, label in (("exact", "点质量"), ("typical", "Medusa"), ("argmax", "argmax")):
            if rule == "exact":
                dist = topk_draft_step_probs(p, cand)
                draws = [topk_draft_verify(p, cand, rng)[1] for _ in range(CHI2_N)]
            else:
                dist = lossy_step_probs(rule, p, cand)
                draws = [lossy_verify(rule, p, cand, rng)[1] for _ in range(CHI2_N)]
            counts = np.bincount(draws, minlength=p.size)
            pv_p = chi2_gof(counts, p)[2]
            pv_own = chi2_gof(counts, dist)[2]
            tv = float(total_variation(dist, p))
            res[(name, rule)] = {"dist": dist, "tv": tv, "p_vs_p": pv_p, "p_vs_own": pv_own, "tau": tau}
            rows.append([name, fmt_dist(p), str(cand), f"{tau:.3f}", label, fmt_dist(dist), f"{tv:.2f}",
                         fmt_p(pv_p), fmt_p(pv_own)])
    print_note(f"规则：点质量（精确）、Medusa 的典型接受、\"是 argmax 就接受\"。门槛 τ = min(ε, δ·exp(−H(p)))，"
               f"ε = {MEDUSA_EPSILON}、δ = {MEDUSA_DELTA}；候选 = q 的前 k 名；每个规则抽 {CHI2_N} 次，"
               "χ² 检验的 p 值：对 p、对规则自己的精确分布。")
    print_table(["例子", "p", "候选", "τ", "规则", "输出分布", "TV", "χ² p 值\n对 p", "χ² p 值\n对自己"], rows)

    ctx = smollm2()
    p, q = adjust(ctx["lp"], 1.0), adjust(ctx["lq"], 1.0)
    rows2, real = [], {}
    for k in LOSSY_KS:
        ex = float(topk_acceptance(p, q, k).mean())
        ty = float(lossy_acceptance("typical", p, q, k).mean())
        am = float(lossy_acceptance("argmax", p, q, k).mean())
        cands = topk_candidates(q, k)
        tv_ty = float(np.mean([total_variation(lossy_step_probs("typical", pi, c), pi) for pi, c in zip(p, cands)]))
        tv_am = float(np.mean([total_variation(lossy_step_probs("argmax", pi, c), pi) for pi, c in zip(p, cands)]))
        real[k] = {"exact": ex, "typical": ty, "argmax": am, "tv_typical": tv_ty, "tv_argmax": tv_am}
        rows2.append([k, f"{ex:.3f}", f"{ty:.3f}", f"{am:.3f}", f"{tv_ty:.3f}", f"{tv_am:.3f}"])
    print()
    print_note(f"SmolLM2（跳层草稿，{len(p)} 个位置，温度 1）：草稿前 k 名里有一个被接受的比例，和每个位置的输出分布离 p "
               "的 TV 的平均（都精确，不抽样）。")
    print_table(["k", "点质量\n（精确）", "Medusa\n典型接受", "是 argmax\n就接受", "TV\nMedusa", "TV\nargmax"], rows2)
    a = res[("两个候选都过线", "typical")]
    c = res[("候选不过线", "typical")]
    lossy = [r for (n, rule), r in res.items() if rule != "exact" and r["tv"] > 0]
    same = [r for (n, rule), r in res.items() if rule != "exact" and r["tv"] == 0]
    pmax = max(r["p_vs_p"] for r in lossy)
    pown = min(r["p_vs_own"] for r in res.values())
    pmin_exact = min(r["p_vs_p"] for (n, rule), r in res.items() if rule == "exact")
    at_eps = float(np.mean(typical_threshold(p) >= MEDUSA_EPSILON))
    k1, k8 = real[LOSSY_KS[0]], real[LOSSY_KS[-1]]
    print_observations([
        f"Medusa 的典型接受在一个位置上的输出是一个确定的 token：过线的候选里取 p 最大的（\"两个候选都过线\"：τ = "
        f"{a['tau']:.3f}，输出 {fmt_dist(a['dist'])}，TV = {a['tv']:.2f}），一个都不过线就取目标的 argmax（\"候选不过线\"："
        f"TV = {c['tv']:.2f}）。温度 1 的采样在这一步没有了：它换来的是多接受，不是 p。",
        "\"是 argmax 就接受\"：argmax 在候选里时输出 argmax（TV = 1 − p(argmax)），不在时从 p 抽（TV = 0）。"
        f"两条捷径输出不是 p 的 {len(lossy)} 格，χ² 对 p 的 p 值最多 {fmt_p(pmax)}（拒绝）；输出碰巧就是 p 的 {len(same)} 格"
        f"（TV = 0）检验看不出来。所有格子对规则自己算出的分布，p 值最少 {fmt_p(pown)}；精确的点质量规则对 p 最少 "
        f"{fmt_p(pmin_exact)}。",
        f"在 SmolLM2 上：k = {LOSSY_KS[0]} 时精确规则接受 {k1['exact']:.3f}，典型接受 {k1['typical']:.3f}、argmax 规则 "
        f"{k1['argmax']:.3f}；k = {LOSSY_KS[-1]} 时 {k8['exact']:.3f} / {k8['typical']:.3f} / {k8['argmax']:.3f}。"
        f"多接受的代价是每个位置的输出离 p 平均 TV {k8['tv_typical']:.3f}（典型接受）/ {k8['tv_argmax']:.3f}（argmax），"
        f"k = {LOSSY_KS[0]} 时 {k1['tv_typical']:.3f} / {k1['tv_argmax']:.3f}。这段文本上 {100 * at_eps:.0f}% 的位置"
        f"门槛就是 ε = {MEDUSA_EPSILON}（δ·e^(−H) 更大：熵小）。",
    ])
    return {"cases": res, "real": real}


# -----------------------------------------------------------------------------
def demo4_dynamic_trees():
    print_header("演示 4：EAGLE-2 的动态树 vs 链、固定形状的树——预算 4…64 个节点，每次目标调用产出几个 token")
    ctx = smollm2()
    E = dynamic_tree_expected(ctx["target"], ctx["draft"], ctx["prompt"], ctx["text"], N_TREE_POS, BUDGETS, (0.0, 1.0))
    ranks = ctx["ranks"]
    pos = range(N_TREE_POS)
    p1, q1 = adjust(ctx["lp"][:N_TREE_POS], 1.0), adjust(ctx["lq"][:N_TREE_POS], 1.0)
    a0 = float(np.mean(ranks[:N_TREE_POS] == 0))
    a1 = acceptance_rate(p1, q1)
    ak = {k: float(multi_draft_acceptance(p1, q1, k).mean()) for k in (1, 2, 4)}
    rows, res = [], {}
    for n, b in enumerate(BUDGETS):
        chain0 = float(np.mean([1 + accepted_at(ranks, t, (1,) * b) for t in pos]))
        fixed0 = {w: float(np.mean([1 + accepted_at(ranks, t, (w,) + (1,) * (b // w - 1)) for t in pos]))
                  for w in (2, 4)}
        dyn0, dyn1 = float(E[:, n, 0].mean()), float(E[:, n, 1].mean())
        chain1 = tree_expected_tokens([a1] * b)
        fixed1 = tree_expected_tokens([ak[2]] + [a1] * (b // 2 - 1))
        res[b] = {"chain0": chain0, "fixed0": fixed0, "dyn0": dyn0, "chain1": chain1, "fixed1": fixed1, "dyn1": dyn1}
        rows.append([b, b + 1, f"{chain0:.2f}", f"{fixed0[2]:.2f}", f"{fixed0[4]:.2f}", f"{dyn0:.2f}",
                     f"{chain1:.2f}", f"{fixed1:.2f}", f"{dyn1:.2f}"])
    trunc = sum(1 for t in pos if accepted_at(ranks, t, (1,) * N_TEXT) >= N_TEXT - t)
    print_note(f"SmolLM2，跳层草稿（这 {N_TREE_POS} 个位置上 α = {a0:.3f}（T = 0）、{a1:.3f}（T = 1）），贪心文本的前 "
               f"{N_TREE_POS} 个位置各作一轮的起点，取平均。T = 0：链、树 (k, 1, …, 1)（10 的 top-k 树，b/k 层）按贪心文本"
               f"精确地数（文本有 {N_TEXT} 个 token，连续猜对一直到文本末尾的位置：{trunc} 个）；T = 1：链用式 (1)，"
               f"树 (2, 1, …) 是 09 的独立候选（tree_expected_tokens），动态树是每个位置的精确期望。"
               f"动态树：top_k = {EAGLE2_TOP_K}、depth = {EAGLE2_DEPTH}（最深 {EAGLE2_DEPTH + 1} 层）。")
    print_table(["预算\n节点", "位置\n/次", "T = 0\n链", "T = 0\n树 (2, 1…)", "T = 0\n树 (4, 1…)", "T = 0\n动态",
                 "T = 1 链\n式 (1)", "T = 1 树\n(2, 1…) 09", "T = 1\n动态"], rows)
    over0 = next((b for b in BUDGETS if res[b]["dyn0"] > res[b]["chain0"]), None)
    over_fixed = next((b for b in BUDGETS if max(res[b]["fixed0"].values()) > res[b]["chain0"]), None)
    dyn_best = [b for b in BUDGETS if res[b]["dyn0"] > max(res[b]["fixed0"].values())]
    over1 = [b for b in BUDGETS if res[b]["dyn1"] > res[b]["chain1"]]
    runs = [accepted_at(ranks, t, (1,) * N_TEXT) for t in pos]
    run_max = max(runs)
    sat = min(b for b in BUDGETS if b >= run_max) if run_max <= BUDGETS[-1] else None
    pm1 = float(topk_acceptance(p1, q1, 1).mean())
    big, small = BUDGETS[-1], BUDGETS[0]
    cap0 = 1 / (1 - a0)
    a0_all = float(np.mean(ranks == 0))
    print_observations([
        f"T = 0 的链：γ 从 {small} 加到 {big}，每次调用只从 {res[small]['chain0']:.2f} 涨到 {res[big]['chain0']:.2f}，"
        + (f"γ ≥ {sat} 以后一点不涨。" if sat else "")
        + f"一轮接受的个数不会超过从起点起连续猜对的长度，这 {N_TREE_POS} 个起点上最长 {run_max}："
        f"γ 再大，多出的位置都落在第一次猜错之后。式 (1) 的极限 1/(1 − α) 假设各位置独立：用这 {N_TREE_POS} 个起点的 α 是 "
        f"{cap0:.2f}，用整段 {N_TEXT} 个位置的 α（{a0_all:.3f}）是 {1 / (1 - a0_all):.2f}——一轮会走进起点之后的位置"
        + ("，那里猜错得更多。" if a0_all < a0 else "。"),
        (f"动态树（T = 0）从预算 {over0} 起超过链" if over0 else f"动态树（T = 0）在预算 ≤ {big} 时都没有超过链")
        + f"，预算 {big} 时每次 {res[big]['dyn0']:.2f} 个 token（链 "
        f"{res[big]['chain0']:.2f}）：位置按草稿的路径概率分给各个分支，链在第一次猜错处就断了。10 的固定形状"
        + "（第 1 层 k 个、往下各 1 个）"
        + (f"从预算 {over_fixed} 起超过链" if over_fixed else "没有超过链")
        + f"；动态树只在预算 {fmt_ks(dyn_best)} 时比两种固定形状都好（它最深 {EAGLE2_DEPTH + 1} 层，depth = "
        f"{EAGLE2_DEPTH}；节点按草稿 T = 1 的路径概率挑，不是按 T = 0 的接受）。"
        f"条件：这个草稿（这些位置上 α = {a0:.3f}），{N_TREE_POS} 个位置，top_k = {EAGLE2_TOP_K}。",
        (f"T = 1：动态树在预算 {fmt_ks(over1)} 时超过式 (1) 的链" if over1 else
         f"T = 1：预算 ≤ {big} 时动态树都不如式 (1) 的链（预算 {big}：{res[big]['dyn1']:.2f} vs {res[big]['chain1']:.2f}）")
        + f"，09 的独立候选的树（公式）在预算 {big} 时 {res[big]['fixed1']:.2f}。点质量规则在一个节点接受草稿第 1 名的"
        f"概率是 p(草稿的 argmax)，这些位置上平均 {pm1:.3f}，而从 q 抽的候选是 Σ min(p, q) = α = {a1:.3f}（演示 2 的"
        "\"前 k 名\"列）。链和 09 的数是假设各位置独立的公式（08：会高估），动态树是每个位置的精确期望：两者的差里有公式的偏差"
        + ("。" if over1 else "，这里只说明在这些条件下动态树没有赢。"),
        f"代价：每次调用打分的位置从 {small + 1} 涨到 {big + 1}，每个位置换来的 token 从 "
        f"{res[small]['dyn0'] / (small + 1):.2f} 降到 {res[big]['dyn0'] / (big + 1):.3f}（T = 0）。多打分几十个位置"
        "几乎不加时间（带宽受限、批很小，05 的 roofline）时才划算；EAGLE 发布的设置每轮验证约 60 个节点。",
    ])
    res["summary"] = {"over0": over0, "over_fixed": over_fixed, "dyn_best": dyn_best, "over1": over1,
                      "run_max": run_max, "sat": sat, "pm1": pm1, "a0": a0, "a1": a1}
    return res


if __name__ == "__main__":
    gguf_path_or_exit()          # 拿不到模型文件时只打印两条出路，退出码 1
    demo1_exact_rules()
    demo2_acceptance_k()
    demo3_lossy()
    demo4_dynamic_trees()
