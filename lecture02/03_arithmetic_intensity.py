"""
=============================================================================
CS349E · 第 2 讲 · 03_arithmetic_intensity.py —— decode 的算术强度：投影跟着批大小涨，注意力停在 GQA 组大小
=============================================================================

【这个脚本要回答的问题】
演示 1：Llama-3.1-70B decode 一步里，投影 + FFN（所有带权重的矩阵乘）的算术强度 = 批大小 B，注意力核心的强度 = GQA 组大小
G = 8，和批大小、上下文长度都无关；对照 H100 的拐点（ridge point），投影 + FFN 在 B 超过拐点后受算力限制，注意力永远受带宽限制。
（第 5 讲 05 脚本（种子）演示 3 引用讲义第 2 讲的两节，说的就是这两个结论。）
演示 2：H100 上一步 decode 的 roofline 时间怎么在注意力和投影 + FFN 之间分配——批和上下文变大时，注意力从零头变成大头。
演示 3：整个 decode 步的强度有上限：批再大，也超不过 (每 token 的 FLOPs) ÷ (每个序列的 KV 字节)，上下文越长越接近 G。

【怎么读输出】强度 = 有用 FLOPs ÷ 读的字节（FLOP/字节），都来自 transformer_lab.analytic_ops(LLAMA31_70B, B, 1, 上下文 − 1,
last_only=True)：有用 FLOPs 是字段 "useful"，投影 + FFN 读的是权重（字段 "w"），注意力核心读的是 K、V（字段 "kv"），按 BF16 记。
一个部分的时间 = max(有用 FLOPs ÷ 峰值算力, 字节 ÷ 带宽)（roofline 下界）；"受什么限制"看哪一项大。

【模型的假设（务必看）】H100 SXM5：BF16 稠密峰值 989.4 TFLOP/s、HBM3 3.35 TB/s（NVIDIA 数据手册）。时间是 roofline 下界：
假设算子达到峰值、两部分先后执行（一步 = 两部分时间之和），不算 norm / RoPE / softmax 等逐元素运算、激活的读写和
kernel 启动开销。70B 的权重（141 GB）一块 H100（80 GB）放不下，KV cache 也常常放不下：这里**忽略放不放得下**，
只用一块卡的峰值比较两部分各受什么限制（真实部署把模型切到多块卡上，每块卡的 FLOPs 和字节同比例变小，忽略通信时比例不变）。模型结构来自 Llama 3.1 的 config.json。

【运行】python3 03_arithmetic_intensity.py （约 0.2 秒）

【依赖】numpy；本目录的 ledger_lab（analytic_ops、sum_rows、MATMUL_OPS、ATTN_CORE_OPS）；
../lecture01 的 console、hw_specs、llm_math（critical_context）。
"""
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
for sub in ("lecture01", "lecture02"):
    sys.path.insert(0, os.path.join(HERE, "..", sub))

from console import fmt_bytes, fmt_sig, fmt_time, print_header, print_observations, print_table  # noqa: E402
from hw_specs import A100, B200, H100, H100_PCIE, H200, roofline_bound, roofline_time  # noqa: E402
from llm_math import LLAMA31_8B, LLAMA31_70B, LLAMA31_405B, compute_bound_batch, critical_context  # noqa: E402
from ledger_lab import ATTN_CORE_OPS, MATMUL_OPS, analytic_ops, sum_rows  # noqa: E402

M = LLAMA31_70B
CHIP = H100
CTX_DEMO1 = 4096  # 演示 1 的上下文（同第 5 讲 05 脚本的演示 3）
BOUND_CN = {"compute": "算力", "memory": "带宽"}


def decode_parts(model, B, ctx):
    """
    decode 一步（B 个序列，每个已有 ctx − 1 个位置、再喂 1 个，所以注意力看 ctx 个位置）的两部分：
    投影 + FFN（MATMUL_OPS）的 (有用 FLOPs, 权重字节) 和注意力核心（ATTN_CORE_OPS）的 (有用 FLOPs, KV 字节)。
    """
    rows = analytic_ops(model, B, 1, ctx - 1, last_only=True)
    return {"proj_flops": sum_rows(rows, "useful", MATMUL_OPS), "proj_bytes": sum_rows(rows, "w", MATMUL_OPS),
            "attn_flops": sum_rows(rows, "useful", ATTN_CORE_OPS), "attn_bytes": sum_rows(rows, "kv", ATTN_CORE_OPS)}


# ---------------------------------------------------------------------------
# 演示 1：两种强度
# ---------------------------------------------------------------------------
def demo1_two_intensities():
    print_header(f"演示 1：{M.name} decode 的两种算术强度（上下文 {CTX_DEMO1}，BF16，{CHIP.name}）")
    ridge = CHIP.ridge_point("bf16")
    rows, res = [], {}
    for B in (1, 8, 64, 256, 296, 1024):
        p = decode_parts(M, B, CTX_DEMO1)
        ip, ia = p["proj_flops"] / p["proj_bytes"], p["attn_flops"] / p["attn_bytes"]
        tpc, tpm = p["proj_flops"] / CHIP.peak_flops("bf16"), p["proj_bytes"] / CHIP.mem_bw
        tac, tam = p["attn_flops"] / CHIP.peak_flops("bf16"), p["attn_bytes"] / CHIP.mem_bw
        rows.append([B, f"{ip:g}", f"{ia:g}", fmt_time(tpc), fmt_time(tpm),
                     BOUND_CN[roofline_bound(p["proj_flops"], p["proj_bytes"], CHIP)],
                     fmt_time(tac), fmt_time(tam), BOUND_CN[roofline_bound(p["attn_flops"], p["attn_bytes"], CHIP)]])
        res[B] = {"proj_intensity": ip, "attn_intensity": ia, "proj_compute": tpc, "proj_memory": tpm,
                  "attn_compute": tac, "attn_memory": tam}
    print_table(["批大小 B", "投影+FFN 强度", "注意力强度", "投影+FFN：计算", "读权重", "受限于",
                 "注意力：计算", "读 KV", "受限于"], rows)

    print(f"\n注意力核心的强度和批大小、上下文都无关，只看 GQA 组大小 G = query 头数 ÷ KV 头数：")
    rows2, attn_by_model = [], {}
    cases = ((1, 1024), (64, 32768), (1024, 131072))
    for model in (LLAMA31_8B, LLAMA31_70B, LLAMA31_405B):
        vals = []
        for B, ctx in cases:
            p = decode_parts(model, B, ctx)
            vals.append(p["attn_flops"] / p["attn_bytes"])
        attn_by_model[model.name] = (model.group, vals)
        rows2.append([model.name, f"{model.n_heads} / {model.n_kv_heads} = {model.group}"] + [f"{v:g}" for v in vals])
    print_table(["模型", "G = 头 / KV 头"] + [f"B={B}, 上下文 {ctx}" for B, ctx in cases], rows2)

    print("\n各芯片的拐点（BF16 稠密峰值 ÷ 带宽）和投影 + FFN 开始受算力限制的批大小：")
    rows3, ridges = [], {}
    for chip in (H100, H100_PCIE, H200, A100, B200):
        r = chip.ridge_point("bf16")
        ridges[chip.name] = r
        rows3.append([chip.name, f"{chip.peak_flops('bf16') / 1e12:g}", fmt_sig(chip.mem_bw / 1e12), f"{r:.0f}",
                      f"B > {r:.0f}"])
    print_table(["芯片", "BF16 TFLOP/s", "带宽 TB/s", "拐点 FLOP/字节", "投影+FFN 受算力限制"], rows3)

    b1024 = res[1024]
    first_compute = min(B for B in res if res[B]["proj_compute"] >= res[B]["proj_memory"])
    last_memory = max(B for B in res if res[B]["proj_compute"] < res[B]["proj_memory"])
    g = {name: gv[0] for name, gv in attn_by_model.items()}
    print_observations([
        f"投影 + FFN 的强度正好等于 B：每个权重（2 字节）读一次，要和 B 个 token 各做一次乘加（2B FLOPs）。"
        f"{CHIP.name} 的拐点是 {ridge:.1f} FLOP/字节，所以 B = {last_memory} 还受带宽限制，B = {first_compute} 起受算力限制；"
        f"B = 1024 时计算 {fmt_time(b1024['proj_compute'])} > 读权重 {fmt_time(b1024['proj_memory'])}。",
        f"注意力核心的强度在每个批大小都是 {res[1]['attn_intensity']:g} = G：每个序列有自己的 KV，批再大也不能分摊；"
        f"一个 KV 头的 K（或 V）每个数（2 字节）读一次，和共用它的 G 个 query 头各做一次乘加（2G FLOPs）。"
        f"它离拐点 {ridge:.0f} 差得远，永远受带宽限制，读 KV 的时间和 B 成正比。",
        f"Llama 3.1 的三个模型 KV 头都是 {LLAMA31_8B.n_kv_heads} 个：8B 的 G = {g[LLAMA31_8B.name]}、70B 的 G = "
        f"{g[LLAMA31_70B.name]}、405B 的 G = {g[LLAMA31_405B.name]}，注意力强度就是这三个数，跟批大小、上下文无关。"
        "多头注意力（MHA，G = 1）强度是 1，多查询注意力（MQA，只有 1 个 KV 头）强度是 query 头数（04 脚本）。",
        f"拐点从 A100 的 {ridges[A100.name]:.0f} 到 H100 PCIe 的 {ridges[H100_PCIE.name]:.0f}：同样的批大小在不同的卡上受不同的限制；"
        f"H200 和 H100 SXM 算力一样、带宽更大，所以拐点更低（{ridges[H200.name]:.0f}）。",
    ])
    return {"ridge": ridge, "by_batch": res, "first_compute_bound_batch": first_compute,
            "attn_by_model": attn_by_model, "ridges": ridges}


# ---------------------------------------------------------------------------
# 演示 2：时间怎么分
# ---------------------------------------------------------------------------
def demo2_time_split():
    print_header(f"演示 2：{CHIP.name} 上 {M.name} decode 一步的 roofline 时间：注意力 vs 投影 + FFN")
    kv_per_token = int(M.kv_bytes_per_token())                    # 每个位置所有层的 K + V，BF16
    w_proj = decode_parts(M, 1, 1)["proj_bytes"]                  # 权重矩阵的字节（和 B、上下文无关）
    crossover = w_proj / kv_per_token                             # B × 上下文 超过它，读 KV 比读权重还久
    rows, res = [], {}
    for B in (1, 8, 32, 128):
        for ctx in (1024, 8192, 32768, 131072):
            p = decode_parts(M, B, ctx)
            tp = roofline_time(p["proj_flops"], p["proj_bytes"], CHIP)
            ta = roofline_time(p["attn_flops"], p["attn_bytes"], CHIP)
            res[(B, ctx)] = {"t_proj": tp, "t_attn": ta, "share": ta / (tp + ta), "kv_total": p["attn_bytes"],
                             "proj_bound": roofline_bound(p["proj_flops"], p["proj_bytes"], CHIP)}
            rows.append([B, ctx, fmt_time(tp), BOUND_CN[res[(B, ctx)]["proj_bound"]], fmt_time(ta),
                         f"{100 * ta / (tp + ta):.1f}%", fmt_time(tp + ta), f"{B / (tp + ta):.0f}",
                         fmt_bytes(p["attn_bytes"])])
    print_table(["B", "上下文", "投影+FFN", "受限于", "注意力（读 KV）", "注意力占", "一步（下界）", "吞吐 token/s",
                 "KV 总量"], rows)
    s_1_128k = res[(1, 131072)]["share"]
    s_8_32k, s_32_32k = res[(8, 32768)]["share"], res[(32, 32768)]["share"]
    big = res[(128, 131072)]
    all_memory = all(v["proj_bound"] == "memory" for v in res.values())
    t_proj_set = sorted({round(v["t_proj"], 12) for v in res.values()})
    print_observations([
        f"B = 1、上下文 1024 时注意力只占 {100 * res[(1, 1024)]['share']:.1f}%：一步几乎全是读权重"
        f"（{fmt_time(res[(1, 1024)]['t_proj'])}）。上下文到 131072 时，单个序列的 KV 就有 "
        f"{fmt_bytes(res[(1, 131072)]['kv_total'])}，注意力占到 {100 * s_1_128k:.0f}%。",
        f"两部分都受带宽限制时，谁大看读的字节：读 KV 的字节 = B × 上下文 × {kv_per_token:,} 字节"
        f"（每个位置 2 × {M.n_layers} 层 × {M.n_kv_heads} 个 KV 头 × {M.head_dim} × 2 字节），读权重矩阵的字节 = {fmt_bytes(w_proj)}；"
        f"所以 B × 上下文 ≈ {crossover:,.0f} 个 token 是分界线。B = 8、上下文 32768（{8 * 32768:,}）注意力占 {100 * s_8_32k:.0f}%，"
        f"B = 32、上下文 32768（{32 * 32768:,}）就占 {100 * s_32_32k:.0f}%。",
        "批变大时，投影 + FFN 的时间"
        + (f"不变（表里都是 {fmt_time(t_proj_set[0])}：" if len(t_proj_set) == 1 else f"并不都一样（表里有 {len(t_proj_set)} 个值：")
        + "B ≤ 128 " + ("都还受带宽限制" if all_memory else "并不都受带宽限制")
        + "，权重读一遍、被更多 token 分摊），注意力的时间却和 B 成正比："
        f"B = 128、上下文 131072 时一步要 {fmt_time(big['t_proj'] + big['t_attn'])}，其中 {100 * big['share']:.0f}% 在读 "
        f"{fmt_bytes(big['kv_total'])} 的 KV（远远放不下，这里只算时间）。长上下文的 decode，瓶颈是 KV cache（04 脚本、第 5 讲）。",
    ])
    return {"by_case": res, "crossover_tokens": crossover, "kv_per_token": kv_per_token, "w_proj": w_proj,
            "all_proj_memory_bound": all_memory, "n_distinct_t_proj": len(t_proj_set)}


# ---------------------------------------------------------------------------
# 演示 3：整个 decode 步的强度上限
# ---------------------------------------------------------------------------
def demo3_step_intensity_limit():
    print_header(f"演示 3：{M.name} 整个 decode 步的强度（有用 FLOPs ÷ 读的权重和 KV）——批再大也有上限")
    ridge = CHIP.ridge_point("bf16")
    L, Hkv, hd, G = M.n_layers, M.n_kv_heads, M.head_dim, M.group
    mm_flops = 2 * M.matmul_params()                              # 一个 token 的权重矩阵乘 FLOPs（含 lm_head）
    # 上限 > 拐点 ⇔ 2·matmul_params / (4·L·Hkv·hd·S) + G > 拐点 ⇔ S < L*（llm_math.critical_context，实数）；
    # 约定同第 1 讲 03、第 5 讲 01：能超过拐点的最长整数上下文是 ⌈L*⌉ − 1
    s_star = critical_context(M, CHIP)
    s_max = math.ceil(s_star) - 1
    batches = (1, 64, 256, 1024)
    rows, res = [], {}
    for ctx in (256, 1024, 2048, 4096, 32768, 131072):
        vals = []
        for B in batches:
            p = decode_parts(M, B, ctx)
            vals.append((p["proj_flops"] + p["attn_flops"]) / (p["proj_bytes"] + p["attn_bytes"]))
        p1 = decode_parts(M, 1, ctx)
        limit = (p1["proj_flops"] + p1["attn_flops"]) / p1["attn_bytes"]   # B → ∞：权重字节可以忽略
        closed = (mm_flops + 4 * M.n_heads * hd * L * ctx) / (4 * L * Hkv * hd * ctx)
        res[ctx] = {"by_batch": dict(zip(batches, vals)), "limit": limit, "closed": closed}
        rows.append([ctx] + [f"{v:.1f}" for v in vals] + [f"{limit:.1f}", "能" if limit > ridge else "不能"])
    print_table(["上下文"] + [f"B = {B}" for B in batches] + ["B → ∞ 的上限", f"能超过拐点 {ridge:.0f} 吗"], rows)
    # 表里最长的"能"：整步强度 B·F / (W + B·K) 超过拐点要 B > 拐点·W / (F − 拐点·K)；那时 KV 有多大
    ctx_ok = max(c for c in res if res[c]["limit"] > ridge)
    p1 = decode_parts(M, 1, ctx_ok)
    F, W, K = p1["proj_flops"] + p1["attn_flops"], p1["proj_bytes"], p1["attn_bytes"]
    b_star = ridge * W / (F - ridge * K)
    b_min = math.floor(b_star) + 1
    b_star01 = compute_bound_batch(M, CHIP, ctx_ok)              # 第 1 讲 03 的账：读的权重还含 norm
    print_observations([
        f"一步的有用 FLOPs ≈ B × (每 token 的矩阵乘 + 注意力)，读的字节 = 权重（一份）+ B × 每个序列的 KV。B → ∞ 时权重可以忽略，"
        f"强度趋于 (2 × matmul_params + 4 × 头数 × head_dim × 层数 × 上下文) ÷ (每个序列的 KV 字节)——和批大小无关的上限。",
        f"上下文越长，上限越低，趋于 G = {G}（131072 时已经是 {res[131072]['limit']:.1f}）。临界上下文 L* = {s_star:,.1f}"
        f"（llm_math.critical_context）：上下文 ≤ {s_max:,} 个位置时上限还高于 H100 的拐点 {ridge:.0f}，"
        f"≥ {s_max + 1:,} 时就低于拐点——整个 decode 步无论批多大，读的字节 ÷ 带宽都比有用 FLOPs ÷ 峰值算力长。"
        f"表里的\"能\"不管放不放得下：上下文 {ctx_ok} 时要 B ≥ {b_min} 才过拐点，那时 KV 就有 {fmt_bytes(b_min * K)}，"
        f"是一块 H100（{fmt_bytes(CHIP.mem_bytes)}）的 {b_min * K / CHIP.mem_bytes:.1f} 倍，还没算 {fmt_bytes(W)} 的权重矩阵。"
        f"（这里 B* = {b_star:.3f}；第 1 讲 03 读的权重还算上 norm 的 {fmt_bytes(2 * M.active_params() - W)}，"
        f"B* = {b_star01:.3f}，所以那张表写 {math.ceil(b_star01)}：B* 正好贴着整数，两本账就差一个。）",
        f"这和演示 1 不矛盾：上下文 4096、B = 1024 时投影 + FFN 单独看已经受算力限制，但同一步里读 KV 的时间更长，"
        f"整步的强度只有 {res[4096]['by_batch'][1024]:.0f}。想让长上下文的 decode 也吃满算力，要减少每个序列的 KV 字节："
        "更大的 G（GQA/MQA，04 脚本）、KV 量化、滑动窗口或 MLA 这类压缩。",
    ])
    return {"ridge": ridge, "s_star": s_star, "s_max": s_max, "by_ctx": res, "ctx_ok": ctx_ok, "b_min": b_min,
            "kv_at_b_min": b_min * K, "b_star": b_star, "b_star_lecture01": b_star01}


if __name__ == "__main__":
    demo1_two_intensities()
    demo2_time_split()
    demo3_step_intensity_limit()
