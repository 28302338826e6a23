"""
=============================================================================
CS349E · 第 3 讲 · 04_moe_experts.py —— MoE：每个 token 只用一小部分参数，一批 token 却会碰到几乎所有专家
=============================================================================

【这个脚本要回答的问题】
演示 1：n 个 token、每个从 E 个专家里选 k 个，一层里一共碰到几个不同的专家：公式 E·(1 − (1 − k/E)^n)（路由均匀且各 token 独立时：一个专家不被某个 token 选中的概率是 1 − k/E）
        和一个带种子的模拟对比。
演示 2：gpt-oss-120b（和 gpt-oss-20b）的参数：总数和每个 token 的激活参数，分到各部分；按 checkpoint 的格式
        （专家 MXFP4，其余 BF16）一共多少字节。
演示 3：gpt-oss-120b decode 一步要读多少权重：批大小 1 时只读 5.1B 个激活参数，批一大就要读几乎全部 117B——
        在哪个批大小追上"读全部权重"的代价，又要多大的批才能受算力限制；有了 KV cache 和显存的限制，这个批还够不够得着。

【怎么读输出】演示 1 的"公式"是期望；"模拟"是 TRIALS 次重复的平均，± 后面是平均值的标准误。
演示 3 的时间是 roofline 下界（llm_math.decode_step，一块 H100 SXM5）。第一张表在上下文 0：只算读权重和矩阵乘法；
第二张表加上 KV cache：每个序列每步读自己的 KV，显存里也要放下它。

【模型的假设（务必看）】
- 公式和模拟都假设路由**均匀、独立**：每个 token 从 E 个专家里等可能地选 k 个不同的（无放回），token 之间互不相关。
  真实的路由器不均匀（有热门专家），相邻、相似的 token 常常选相同的专家（Mixtral 的路由分析，arXiv 2401.04088 §5：
  相邻 token 选同一专家的比例高于随机），所以实际碰到的专家一般**比公式少**；
  公式是上限附近的估计。
- 模拟：每个 token 给 E 个专家各抽一个 rng.random() 的均匀数，取最小的 k 个——这正是"等可能地选 k 个不同的"
  （每个 k 元子集概率相同）。只用 np.random.default_rng(种子).random()，不依赖 numpy 的 choice 实现。
- gpt-oss 的结构和参数总数来自模型卡与 config.json（llm_math.GPT_OSS_120B / GPT_OSS_20B；116.83B 总、5.13B 激活；
  checkpoint 60.8 GiB）。"激活参数"按模型卡的口径：含 lm_head、不含输入词嵌入。
- 演示 3 的字节：专家的权重矩阵 MXFP4（4.25 位，含 E8M0 scale），专家的偏置和其余一切 BF16（checkpoint 的格式）；
  第一张表上下文取 0（只看权重），第二张表的 KV cache 是 BF16（gpt-oss 每隔一层是 128 个 token 的滑动窗口，
  llm_math.kv_bytes）；"放得下的批" = (80 GB − checkpoint) / 每序列的 KV，激活等其他占用不算（上界）。
  H100 的 BF16 峰值（假设 MXFP4 反量化成 BF16 再算）。
  被碰到的专家数用期望值，不是某一批的实际值。gpt-oss-120b 的 checkpoint（65 GB）一块 80 GB 的 H100 放得下。

【运行】python3 04_moe_experts.py （约 0.3 秒）

【依赖】numpy；../lecture01 的 console（打印）、hw_specs（H100）、llm_math（GPT_OSS_120B、GPT_OSS_20B、
expected_touched_experts、decode_step（expert_fmt="mxfp4" 时按发布格式读字节，含被碰到的专家）、weight_bytes、
active_weight_bytes、bits_per_param）。
"""
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))

from console import fmt_bytes, fmt_num, fmt_time, print_header, print_note, print_observations, print_table  # noqa: E402
from console import save_results  # noqa: E402
from hw_specs import H100  # noqa: E402
from llm_math import (GPT_OSS_120B, GPT_OSS_20B, active_weight_bytes, bits_per_param, decode_step,  # noqa: E402
                      expected_touched_experts, max_batch, weight_bytes)

TRIALS, SIM_SEED = 400, 0            # 模拟的重复次数和种子（选的）
N_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CHIP = H100
GIB = 2 ** 30
BOUND_ZH = {"compute": "算力", "memory": "带宽"}
CONTEXTS3 = (0, 64, 128, 512, 1024, 4096)   # 演示 3 第二张表的上下文（选的）
EXPERT_FMT = "mxfp4"                 # gpt-oss 发布的 checkpoint：专家的权重矩阵 MXFP4，其余 BF16（模型卡）


def simulate_touched(n_experts, top_k, n_list, trials, rng):
    """
    模拟：trials 次，每次让 max(n_list) 个 token 依次各选 top_k 个专家，记下前 n 个 token 碰到了哪些专家
    -> {n: [trials, n_experts] 的 bool 数组}（按行求和就是碰到的不同专家数）。

    【做法】每个 token 给每个专家抽一个均匀数 rng.random()，取最小的 top_k 个（argpartition）：各个 k 元子集等可能，
    即均匀的无放回抽样。前 n 个 token 的结果是同一次模拟的前缀（不同 n 之间相关，但每个 n 的分布都对）。
    """
    seen = np.zeros((trials, n_experts), dtype=bool)
    rows = np.arange(trials)[:, None]
    out = {}
    for t in range(1, max(n_list) + 1):
        keys = rng.random((trials, n_experts))
        chosen = np.argpartition(keys, top_k - 1, axis=1)[:, :top_k]       # [trials, k]：最小的 k 个
        seen[rows, chosen] = True
        if t in n_list:
            out[t] = seen.copy()
    return out


def tokens_to_touch(m, frac):
    """
    期望碰到 frac 比例的专家至少要几个 token：E·(1 − (1 − k/E)^n) ≥ frac·E ⇔ n ≥ ln(1 − frac) / ln(1 − k/E)，取上整。
    """
    return math.ceil(math.log(1 - frac) / math.log(1 - m.top_k / m.n_experts))


def min_compute_batch(m, context):
    """
    MoE decode 在上下文 context 时受算力限制的最小整数批（llm_math.decode_step，专家 MXFP4）；批再大也不会时返回 None。

    【推导】t_compute − t_memory = B·(F/P − KV/BW) − W(B)/BW，F = 每 token 的 FLOPs，KV = 一个序列的 KV 字节，
    W(B) = 读的权重（随 B 增加、越来越慢，最后是全部权重）。F/P ≤ KV/BW 时它永远为负；否则它是 B 的凸函数、
    从负数开始，一旦变正就一直为正，所以可以二分查找。
    """
    if m.flops_per_token(context) / CHIP.peak_flops("bf16") <= m.kv_bytes(context) / CHIP.mem_bw:
        return None
    lo, hi = 0, 1
    while decode_step(m, CHIP, hi, context, expert_fmt=EXPERT_FMT)["bound"] != "compute":
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if decode_step(m, CHIP, mid, context, expert_fmt=EXPERT_FMT)["bound"] == "compute":
            hi = mid
        else:
            lo = mid
    return hi


def critical_context(m):
    """
    最短的上下文（整数）：从它起，每个序列读自己 KV 的时间 ≥ 它的计算时间，批再大 decode 也受带宽限制。

    【推导】条件 KV(c)/BW ≥ F(c)/P；KV 和注意力的 FLOPs 都随"看的位置数"线性增长，读 KV 的一项长得快，
    所以条件对 c 单调，二分查找。（llm_math.critical_context 的闭式只对没有滑动窗口的模型。）
    """
    def kv_slower(c):
        return m.kv_bytes(c) / CHIP.mem_bw >= m.flops_per_token(c) / CHIP.peak_flops("bf16")
    lo, hi = 0, 1
    while not kv_slower(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if kv_slower(mid) else (mid, hi)
    return hi


# ---------------------------------------------------------------------------
# 演示 1：碰到的专家数：公式 vs 模拟
# ---------------------------------------------------------------------------
def demo1_touched_experts():
    print_header(f"演示 1：n 个 token 在一层里碰到几个不同的专家——E·(1 − (1 − k/E)^n) vs 模拟（{TRIALS} 次）")
    rng = np.random.default_rng(SIM_SEED)
    rows = []
    res = {}
    sims = {}
    for m in (GPT_OSS_120B, GPT_OSS_20B):
        sims[m.name] = simulate_touched(m.n_experts, m.top_k, N_TOKENS, TRIALS, rng)
    for n in N_TOKENS:
        cells = [n]
        for m in (GPT_OSS_120B, GPT_OSS_20B):
            E, k = m.n_experts, m.top_k
            f = expected_touched_experts(E, k, n)
            s = sims[m.name][n].sum(axis=1)
            mean, se = float(s.mean()), float(s.std(ddof=1) / math.sqrt(TRIALS))
            res[(m.name, n)] = {"formula": f, "sim": mean, "se": se, "naive": min(n * k, E)}
            cells += [min(n * k, E), f"{f:.2f}", f"{mean:.2f} ± {se:.2f}", f"{100 * f / E:.0f}%"]
        rows.append(cells)
    e1, e2 = GPT_OSS_120B, GPT_OSS_20B
    short = {m.name: m.name.replace("gpt-oss-", "") for m in (e1, e2)}
    print_note("；".join(f"{short[m.name]} = {m.name}（E = {m.n_experts}、k = {m.top_k}）" for m in (e1, e2))
               + "；占全部 = 公式 ÷ E；min(n·k, E) = 没有重复时碰到的个数（上限）。")
    print_table(["token 数\nn"] + [f"{short[m.name]}\n{col}" for m in (e1, e2)
                                    for col in ("min(n·k, E)", "公式", "模拟", "占全部")], rows)
    z = max(abs(v["sim"] - v["formula"]) / v["se"] for v in res.values() if v["se"] > 0)
    # 标准误为 0 的格子：400 次模拟的结果全都一样（n = 1 正好 k 个；或者 n 大时每次都全部碰到）
    flat = max(abs(v["sim"] - v["formula"]) for v in res.values() if v["se"] == 0)
    E, k = e1.n_experts, e1.top_k
    half, n90, n99 = (tokens_to_touch(e1, f) for f in (0.5, 0.9, 0.99))
    res.update({"max_z": z, "max_flat_diff": flat, "n_half": half, "n90": n90, "n99": n99})
    r8 = res[(e1.name, 8)]
    print_observations([
        f"公式和模拟吻合：模拟平均和公式之差最多 {z:.1f} 个标准误。标准误为 0 的格子是 {TRIALS} 次模拟结果全都一样"
        f"（n = 1 时正好 k 个；n 大时每次都碰到全部专家），和公式最多差 {flat:.3f} 个专家。",
        f"n 小的时候几乎不重复：{e1.name}（E = {E}、k = {k}）8 个 token 碰到 {r8['formula']:.1f} 个，接近 n·k = {r8['naive']}。"
        f"n 大了以后重复越来越多：{half} 个 token 就碰到一半的专家，{n90} 个碰到 90%，{n99} 个碰到 99%。",
        f"推导：某个专家不被一个 token 选中的概率是 1 − k/E，n 个 token 都不选它的概率是 (1 − k/E)^n，"
        f"对 E 个专家求和（期望的线性性）。碰到一半的 n 满足 (1 − k/E)^n = 1/2，即 n ≈ E·ln2 / k = {E * math.log(2) / k:.1f}。",
        f"专家越少（{e2.name}：E = {e2.n_experts}），越快全部碰到：{res[(e2.name, 32)]['formula']:.1f} / {e2.n_experts} 个只要 32 个 token。",
    ])
    return res


# ---------------------------------------------------------------------------
# 演示 2：总参数 vs 激活参数
# ---------------------------------------------------------------------------
def param_breakdown(m):
    """
    gpt-oss 的参数按部分分开 -> [(部分, 总数, 每个 token 激活的)]。

    各部分用 llm_math.ModelConfig 的计数（attn_params、router_params、expert_params、embed_params、norm_params）；
    各部分加起来应当正好是 params()，激活列加起来正好是 active_params()（测试核对两者）。
    """
    L = m.n_layers
    head = 0 if m.tied else m.vocab * m.d_model
    parts = [
        ("输入词嵌入", m.embed_params(), 0),
        ("注意力（q/k/v/o、偏置、sink）", L * m.attn_params(), L * m.attn_params()),
        ("路由器", L * m.router_params(), L * m.router_params()),
        (f"专家（每层 {m.n_experts} 个，激活 {m.top_k} 个）", L * m.n_experts * m.expert_params(),
         L * m.top_k * m.expert_params()),
        ("lm_head", head, head),
    ]
    norms = m.norm_params()
    return parts[:4] + [("RMSNorm（每层 2 个 + 最后 1 个）", norms, norms), parts[4]]


def demo2_params():
    print_header("演示 2：gpt-oss 的参数——总数和每个 token 真正用到的（激活参数）")
    rows = []
    res = {}
    for m in (GPT_OSS_120B, GPT_OSS_20B):
        parts = param_breakdown(m)
        tot, act = sum(p[1] for p in parts), sum(p[2] for p in parts)
        for name, t, a in parts:
            rows.append([m.name, name, f"{t:,}", f"{100 * t / tot:.1f}%", f"{a:,}", f"{100 * a / act:.1f}%"])
        rows.append([m.name, "合计", f"{tot:,}", "100%", f"{act:,}", "100%"])
        ckpt = weight_bytes(m, "bf16", expert_fmt=EXPERT_FMT)
        res[m.name] = {"total": tot, "active": act, "ratio": tot / act, "ckpt_bytes": ckpt,
                       "expert_share": parts[3][1] / tot, "parts": parts,
                       "attn_head_active_share": (parts[1][2] + parts[5][2]) / act}
    print_table(["模型", "部分", "总参数", "占总数", "每 token 激活", "占激活"], rows)
    print()
    rows = []
    for m in (GPT_OSS_120B, GPT_OSS_20B):
        r = res[m.name]
        rows.append([m.name, fmt_num(r["total"]), fmt_num(r["active"]), f"{r['ratio']:.1f}",
                     fmt_bytes(2 * r["total"]), fmt_bytes(r["ckpt_bytes"]), f"{r['ckpt_bytes'] / GIB:.1f} GiB"])
    print_table(["模型", "总参数", "激活参数", "总 / 激活", "全 BF16", "checkpoint（专家 MXFP4）", "同左（GiB）"], rows)
    big = res[GPT_OSS_120B.name]
    print_observations([
        f"{GPT_OSS_120B.name}：总共 {big['total'] / 1e9:.2f}B 参数，每个 token 只用 {big['active'] / 1e9:.2f}B"
        f"（{big['ratio']:.0f} 分之一）——和模型卡的 116.83B / 5.13B 一致。"
        f"{100 * big['expert_share']:.1f}% 的参数在专家里，每个 token 只用其中 {GPT_OSS_120B.top_k}/{GPT_OSS_120B.n_experts}。",
        f"每 token 的计算量只和激活参数有关（≈ 2 × {big['active'] / 1e9:.2f}B FLOPs），但所有专家都得放在显存里："
        f"专家用 MXFP4（{bits_per_param(EXPERT_FMT):.2f} 位）存，整个 checkpoint {fmt_bytes(big['ckpt_bytes'])} = {big['ckpt_bytes'] / GIB:.1f} GiB（模型卡：60.8 GiB），"
        f"一块 80 GB 的 H100 放得下；全 BF16 要 {fmt_bytes(2 * big['total'])}。",
        f"激活参数里，注意力和 lm_head 占了不小的一块（{100 * big['attn_head_active_share']:.1f}%，上表）："
        "它们每个 token 都要用，专家部分却被稀疏地摊薄了。",
    ])
    return res


# ---------------------------------------------------------------------------
# 演示 3：decode 一步读多少权重
# ---------------------------------------------------------------------------
def demo3_decode_bytes():
    m = GPT_OSS_120B
    print_header(f"演示 3：{m.name} decode 一步读多少权重（{CHIP.name}，上下文 0，专家 MXFP4、其余 BF16）")
    # 读全部专家时每步的字节：整个 checkpoint 减去输入词嵌入（BF16，查表不整个读）
    all_bytes = weight_bytes(m, "bf16", expert_fmt=EXPERT_FMT) - m.embed_params() * 2
    rows = []
    res = {"all_bytes": all_bytes, "steps": {}}
    for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096):
        r = decode_step(m, CHIP, b, 0, expert_fmt=EXPERT_FMT)
        r["touched"] = expected_touched_experts(m.n_experts, m.top_k, b)   # 每层碰到的专家数的期望
        res["steps"][b] = r
        rows.append([b, f"{r['touched']:.1f}", fmt_bytes(r["w_bytes"]), f"{100 * r['w_bytes'] / all_bytes:.0f}%",
                     fmt_bytes(r["w_bytes"] / b), fmt_time(r["time"]), BOUND_ZH[r["bound"]], fmt_time(r["time"] / b)])
    print_table(["批大小 B", "每层碰到的专家", "每步读的权重", "占全部权重", "摊到每个 token", "一步（下界）", "受限于",
                 "每 token"], rows)

    # 追上"读全部权重"：碰到 99% 的专家；受算力限制：二分查找 decode_step 的 bound
    n99 = tokens_to_touch(m, 0.99)
    b_moe = min_compute_batch(m, 0)
    # 对照：一个稠密模型，每步读的字节 = gpt-oss 批大小 1 时读的（active_weight_bytes），每 token 的 FLOPs 也一样：
    # 受算力限制的最小批 = ⌈读字节的时间 / 每 token 的计算时间⌉（上下文 0）
    s1 = res["steps"][1]
    t_tok = m.flops_per_token(0) / CHIP.peak_flops("bf16")       # 受算力限制时每 token 的时间
    b_dense = math.ceil(active_weight_bytes(m, "bf16", EXPERT_FMT) / CHIP.mem_bw / t_tok)
    res.update({"n99": n99, "b_compute_moe": b_moe, "b_compute_dense": b_dense, "t_token_compute": t_tok})

    # 上面都是上下文 0（没有 KV cache）。有了上下文，每个序列每步还要读自己的 KV cache，显存也要放下它
    ckpt = weight_bytes(m, "bf16", expert_fmt=EXPERT_FMT)
    l_crit = critical_context(m)
    l_fit = max(c for c in range(1, l_crit) if max_batch(m, CHIP, c, "bf16", expert_fmt=EXPERT_FMT) >= b_moe)
    ctx_rows, by_ctx = [], {}
    for c in CONTEXTS3:
        kv = m.kv_bytes(c)
        ceil_i = m.flops_per_token(c) / kv if c else math.inf
        b_c = min_compute_batch(m, c)
        fit = max_batch(m, CHIP, c, "bf16", expert_fmt=EXPERT_FMT) if c else None
        by_ctx[c] = {"intensity_cap": ceil_i, "b_compute": b_c, "max_batch": fit, "kv_bytes": kv}
        ctx_rows.append([c, fmt_bytes(kv) if c else "0 B", f"{ceil_i:.0f}" if c else "—",
                         "永远不会" if b_c is None else b_c, "—" if fit is None else fit])
    # 上下文多长时，受算力限制的最小批还放得进显存（上下文越长，要的批越大、放得下的越少：第一次放不下就停）
    c_ok = 0
    while min_compute_batch(m, c_ok + 1) <= max_batch(m, CHIP, c_ok + 1, "bf16", expert_fmt=EXPERT_FMT):
        c_ok += 1
    res.update({"by_context": by_ctx, "critical_context": l_crit, "ckpt_bytes": ckpt,
                "max_ctx_fitting_b_moe": l_fit, "max_ctx_compute_and_fit": c_ok})
    print()
    print_note(f"有 KV cache 时：每个序列每步读自己的 KV（{CHIP.name} 拐点 {CHIP.ridge_point('bf16'):.0f} "
               f"FLOP/字节）；显存 {fmt_bytes(CHIP.mem_bytes)} 减去 checkpoint {fmt_bytes(ckpt)} 放 KV。"
               "强度上限 = 批无穷大时整步的 FLOPs ÷ 字节 = 每 token 的 FLOPs ÷ 每序列的 KV 字节。")
    print_table(["上下文", "每序列\nKV", "强度上限\n（FLOP/字节）", "受算力限制\n的最小批", "放得下\n的批"], ctx_rows)
    b64 = res["steps"][64]
    dense16 = 2 * m.active_params()                        # 同样多参数的稠密模型，全部 BF16
    expert_share = m.n_layers * m.top_k * m.expert_params() / m.active_params()
    res.update({"dense_bf16_bytes": dense16, "dense_bf16_time": dense16 / CHIP.mem_bw, "expert_active_share": expert_share})
    c = {k: by_ctx[k] for k in CONTEXTS3}
    print_observations([
        f"批大小 1：每层只读 {m.top_k} 个专家，一步读 {fmt_bytes(s1['w_bytes'])}，只占全部权重（{fmt_bytes(all_bytes)}）的 "
        f"{100 * s1['w_bytes'] / all_bytes:.0f}%，{fmt_time(s1['time'])} 一步。同样 {m.active_params() / 1e9:.2f}B 参数的"
        f"稠密模型用 BF16 存要读 {fmt_bytes(dense16)}、{fmt_time(dense16 / CHIP.mem_bw)} 一步；这里少读一半多，"
        f"是因为激活参数的 {100 * expert_share:.1f}% 是专家，专家的矩阵用 MXFP4（{bits_per_param(EXPERT_FMT):.2f} 位）存。"
        "只读一小部分权重，是 MoE 在单用户、低延迟场景的优势。",
        f"批一变大，每个 token 选的专家不同，读的字节迅速增加：B = 64 时每层碰到 {b64['touched']:.0f} 个专家，"
        f"一步读 {fmt_bytes(b64['w_bytes'])}（{100 * b64['w_bytes'] / all_bytes:.0f}%）；B ≥ {n99} 时碰到 99% 以上，"
        f"一步的字节和读全部 {m.params() / 1e9:.0f}B 参数（{fmt_bytes(all_bytes)}，同样的格式）几乎一样——这就是 MoE 追上"
        "稠密代价的地方。",
        f"计算量却始终只按激活参数算（每 token ≈ {m.flops_per_token(0) / 1e9:.1f} GFLOP），所以要把读全部权重的代价摊平，"
        f"批要大得多：上下文 0（第一张表，只读权重）时 B ≥ {b_moe} 才受算力限制；激活参数一样多、每步只读 "
        f"{fmt_bytes(s1['w_bytes'])} 的稠密模型，B ≥ {b_dense} 就够了。过了这个批大小，两者每 token 的时间才一样"
        f"（都是 FLOPs ÷ 峰值 = {fmt_time(t_tok)}）。",
        f"{b_moe} 只在上下文 0 时成立（第二张表）。有了 KV cache，每个序列每步还要读自己的 KV，批再大，整步的强度也"
        f"不超过'每 token 的 FLOPs ÷ 每序列的 KV 字节'：上下文 512 时 {c[512]['intensity_cap']:.0f}、1024 时 "
        f"{c[1024]['intensity_cap']:.0f}、4096 时 {c[4096]['intensity_cap']:.0f} FLOP/字节。上下文 ≥ {l_crit} 个 token 时"
        f"它低于拐点 {CHIP.ridge_point('bf16'):.0f}，批再大 decode 也受带宽限制。显存也挡着：放下 {fmt_bytes(ckpt)} 的 "
        f"checkpoint 只剩 {fmt_bytes(CHIP.mem_bytes - ckpt)} 给 KV，{b_moe} 个序列只在上下文不超过 {l_fit} 个 token 时"
        f"放得下；上下文 512 时只放得下 {c[512]['max_batch']} 个，受算力限制却要 {c[512]['b_compute']} 个。"
        f"一块 H100 上，只有上下文不超过 {res['max_ctx_compute_and_fit']} 个 token 时，受算力限制的批才放得进显存。"
        "MoE 用显存和带宽（所有专家都在、都要读）换每个 token 的计算量。",
        f"第 5 讲 05 的陷阱也在这里：投机解码验证 γ + 1 个 token，就像批大小变成 γ + 1——γ = 7 时验证 8 个 token，"
        f"按均匀、独立路由的公式，每层碰到的专家从 {m.top_k} 个变成 {res['steps'][8]['touched']:.1f} 个，一步读 "
        f"{fmt_bytes(res['steps'][8]['w_bytes'])}（不是 {fmt_bytes(s1['w_bytes'])}），验证并不免费。这 8 个 token 来自同一个"
        "序列，真实路由里相邻的 token 常选相同的专家（【模型的假设】），碰到的一般会少一些（至少 4 个）。",
    ])
    return res


if __name__ == "__main__":
    RESULTS = {"demo1": demo1_touched_experts(), "demo2": demo2_params(), "demo3": demo3_decode_bytes()}
    save_results(RESULTS)        # 给测试（console.save_results）：只在设了 CS349E_RESULTS 时存下这些数
