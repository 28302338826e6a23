"""
=============================================================================
CS349E · 第 1 讲 · 01_roofline.py —— roofline：一块芯片能算多快，由算力和带宽中较紧的那个决定
=============================================================================

【这个脚本要回答的问题】
演示 1：H100 SXM5 / H100 PCIe / H200 / A100 / B200 和 d-Matrix Corsair 的峰值算力、带宽，以及 roofline 的拐点
（算力 ÷ 带宽，单位 FLOP/字节）：一个算子每搬一个字节要做多少次运算，才能把算力用满。
演示 2：一个搬 1 GB 数据、算术强度为 I 的算子在每块芯片上要多久，受算力还是带宽限制，用上了峰值算力的百分之几。
演示 3：大模型里的典型算子落在哪里：矩阵乘的强度随"一次处理的 token 数"增长，decode 时注意力的强度停在 GQA 组大小。
演示 4：把 A100、H100、B200 的 roofline 画出来（对数轴），标出 decode（批 1、批 64）和 4096 个 token 的 prefill 的强度。

【怎么读输出】roofline：时间下界 = max(FLOPs / 峰值算力, 字节 / 带宽)；演示 2 的时间表统一用 µs，方便逐格比较。强度 I = FLOPs / 字节 低于拐点时
受带宽限制（表里记"带宽"），时间只取决于搬了多少字节；高于拐点时受算力限制（记"算力"）。
"用上的算力" = min(1, I / 拐点)：受带宽限制的算子只能用上峰值算力的这么一点。

【模型的假设（务必看）】roofline 是**下界**：假设算力和带宽都能跑到数据手册的峰值、计算和搬数据完全重叠、
没有启动开销。真实的 kernel 达不到峰值（常听到的"大矩阵乘能跑到峰值的六到八成"只是经验值，不是出处里的数，
本脚本不用它）。所有算力都是稠密（非 2:4 稀疏）峰值。
B200 的数字是近似值；Corsair 容量层（LPDDR5X）的带宽 0.4 TB/s 是**假设值**（找不到公开的出处；观察只用差一倍也成立的结论）。芯片数字见 hw_specs 的出处。
Corsair 没有 BF16，它那一行用 MXINT8 的算力（数据类型不同，只能看量级）。

【运行】python3 01_roofline.py （约 0.1 秒）

【依赖】本目录的 console、hw_specs、llm_math（只用标准库）。
"""
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))

from console import (fmt_bytes, fmt_num, fmt_sig, fmt_time, print_header, print_observations, print_plot,  # noqa: E402
                     print_table)
from hw_specs import A100, B200, CORSAIR, H100, H100_PCIE, H200, roofline_bound, roofline_time  # noqa: E402
from llm_math import LLAMA31_8B, compute_bound_batch, decode_step, matmul_intensity, prefill_step  # noqa: E402

# 每块芯片比较时用的数据类型：GPU 用 BF16（稠密）；Corsair 只有 MX 整数格式，用 MXINT8。
GPUS = (A100, H100_PCIE, H100, H200, B200)
CHIPS = GPUS + (CORSAIR,)
MAIN_DTYPE = {c.name: ("mxint8" if c is CORSAIR else "bf16") for c in CHIPS}
# 8 位格式：A100 没有 FP8，用 INT8；Corsair 用 MXINT4 作为它的"低精度"档。
LOW_DTYPE = {A100.name: "int8", H100_PCIE.name: "fp8", H100.name: "fp8", H200.name: "fp8", B200.name: "fp8",
             CORSAIR.name: "mxint4"}
OP_BYTES = 1e9                                   # 演示 2：每个算子搬 1 GB（一个示意的量）
INTENSITIES = (0.25, 1, 4, 8, 16, 64, 128, 256, 512, 1024, 4096)
BOUND_ZH = {"compute": "算力", "memory": "带宽"}
PLOT_CHIPS = (A100, H100, B200)                  # 演示 4 画 roofline 的三块芯片
PLOT_CONTEXT, PLOT_PROMPT = 4096, 4096           # 演示 4：decode 的上下文、prefill 的提示长度（示意）


def short(chip):
    """表头里的芯片短名。"""
    return {"H100 SXM5": "H100", "H100 PCIe": "H100 PCIe", "H200 SXM": "H200", "A100 80GB SXM": "A100",
            "B200": "B200", "d-Matrix Corsair": "Corsair"}[chip.name]


def ridge(chip):
    """芯片在它的主数据类型下的拐点（FLOP/字节）。"""
    return chip.ridge_point(MAIN_DTYPE[chip.name])


# ---------------------------------------------------------------------------
# 演示 1：算力、带宽、拐点
# ---------------------------------------------------------------------------
def demo1_chips():
    print_header("演示 1：六块芯片的峰值算力（稠密）、带宽和 roofline 拐点（= 峰值 ÷ 带宽）")
    rows = []
    for c in CHIPS:
        dt, lo = MAIN_DTYPE[c.name], LOW_DTYPE[c.name]
        rows.append([c.name, f"{c.mem_bytes / 1e9:g}", fmt_sig(c.mem_bw / 1e12), dt, f"{c.peak_flops(dt) / 1e12:.0f}",
                     f"{ridge(c):.0f}", lo, f"{c.peak_flops(lo) / 1e12:.0f}", f"{c.ridge_point(lo):.0f}",
                     f"{c.power_w:.0f}" if c.power_w else "—"])
    cap_ridge = CORSAIR.peak_flops("mxint8") / CORSAIR.capacity_bw
    cap_lo, cap_hi = cap_ridge / 2, cap_ridge * 2                  # 容量层带宽（假设值）差一倍时的拐点
    rows.append(["Corsair 的 LPDDR5X 层", f"{CORSAIR.capacity_bytes / 1e9:g}", fmt_sig(CORSAIR.capacity_bw / 1e12), "mxint8",
                 f"{CORSAIR.peak_flops('mxint8') / 1e12:.0f}", f"{cap_ridge:.0f}", "—", "—", "—", "—"])
    print_table(["芯片", "容量\nGB", "带宽\nTB/s", "主类型", "峰值\nTFLOP/s", "拐点\nFLOP/B", "低精度", "峰值\nTFLOP/s",
                 "拐点\nFLOP/B", "功耗\nW"], rows)

    r = {short(c): ridge(c) for c in CHIPS}
    r["Corsair LPDDR"] = cap_ridge
    gen_flops = H100.peak_flops("bf16") / A100.peak_flops("bf16")
    gen_bw = H100.mem_bw / A100.mem_bw
    h200_bw = H200.mem_bw / H100.mem_bw
    low_gpu = min(GPUS, key=ridge)
    high_gpu = max(GPUS, key=ridge)
    low = {short(c): c.ridge_point(LOW_DTYPE[c.name]) for c in GPUS}
    top_low = max(GPUS, key=lambda c: c.ridge_point(LOW_DTYPE[c.name]))      # 低精度一列里拐点最高的 GPU
    b200_fp4 = B200.ridge_point("fp4")
    print_observations([
        f"H100 SXM5 的拐点是 {r['H100']:.0f} FLOP/字节：一个 BF16 算子每从 HBM 读一个字节，要做 {r['H100']:.0f} 次运算才能把算力用满。"
        f"GPU 里拐点最低的是 {low_gpu.name}（{ridge(low_gpu):.0f}），最高的是 {high_gpu.name}（{ridge(high_gpu):.0f}）。",
        f"从 A100 到 H100，算力涨了 {gen_flops:.2f} 倍，带宽只涨了 {gen_bw:.2f} 倍，拐点从 {r['A100']:.0f} 升到 {r['H100']:.0f}。"
        f"之后拐点没有接着升：H200 是同样的计算芯片配更快的 HBM（带宽 ×{h200_bw:.2f}），拐点降到 {r['H200']:.0f}；"
        f"B200 的带宽涨得比算力多（相对 H100：×{B200.mem_bw / H100.mem_bw:.2f} vs ×{B200.peak_flops('bf16') / H100.peak_flops('bf16'):.2f}），"
        f"拐点 {r['B200']:.0f}，也比 H100 低。低精度一列同样不是一路上升（A100 INT8 {low['A100']:.0f}、H100 FP8 {low['H100']:.0f}、"
        f"H200 FP8 {low['H200']:.0f}、B200 FP8 {low['B200']:.0f}；这一列 GPU 里最高的是 {top_low.name} 的 FP8，"
        f"{low[short(top_low)]:.0f}）。表里是三代 GPU（Ampere：A100；Hopper：两种 H100、H200；Blackwell：B200），"
        f"{'拐点比这一列都高的只有' if b200_fp4 > low[short(top_low)] else '拐点没有超过这一列的是'} B200 的 FP4"
        f"（表里没有：{fmt_num(B200.peak_flops('fp4'))}FLOP/s ÷ {fmt_bytes(B200.mem_bw)}/s = {b200_fp4:.0f}）。",
        f"低精度把算力翻倍（H100 的 FP8：{fmt_num(H100.peak_flops('fp8'))}FLOP/s），带宽不变，拐点也翻倍（{H100.ridge_point('fp8'):.0f}）；"
        f"但每个数也只占 1 个字节，同一个算子的 FLOP/字节跟着翻倍：两者抵消，受哪一项限制不变，时间都减半。",
        f"Corsair 反过来：片上 SRAM 带宽 {fmt_bytes(CORSAIR.mem_bw)}/s 是 H100 的 {CORSAIR.mem_bw / H100.mem_bw:.0f} 倍，"
        f"拐点只有 {r['Corsair']:.0f}（MXINT8），很低的强度就能用满算力；代价是每张卡只有 {fmt_bytes(CORSAIR.mem_bytes)}。"
        f"放不进 SRAM、要从 LPDDR5X 读时拐点变成 {cap_ridge:.0f}（这一层的带宽 {fmt_bytes(CORSAIR.capacity_bw)}/s 是假设值，"
        f"没有公开的出处；差一倍时在 {cap_lo:.0f}–{cap_hi:.0f} 之间），都比表里每块 GPU 的拐点（低精度一列最高 "
        f"{max(low.values()):.0f}）高：decode 的强度远在它下面，从这一层读就受带宽限制。",
    ])
    return {"ridge": r, "gen_flops": gen_flops, "gen_bw": gen_bw, "h200_bw": h200_bw,
            "h100_fp8_ridge": H100.ridge_point("fp8"), "corsair_bw_ratio": CORSAIR.mem_bw / H100.mem_bw,
            "lowest_gpu": low_gpu.name, "highest_gpu": high_gpu.name, "low_ridge": low, "b200_fp4_ridge": b200_fp4,
            "highest_low_gpu": top_low.name, "corsair_lpddr_ridge_range": (cap_lo, cap_hi)}


# ---------------------------------------------------------------------------
# 演示 2：强度为 I 的算子要多久
# ---------------------------------------------------------------------------
def demo2_time_vs_intensity():
    print_header(f"演示 2：一个搬 {fmt_bytes(OP_BYTES)}、强度为 I 的算子（FLOPs = I × 字节）在每块芯片上的时间下界")
    rows, util_rows = [], []
    times = {}
    for i in INTENSITIES:
        flops = i * OP_BYTES
        cells, ucells = [f"{i:g}"], [f"{i:g}"]
        for c in CHIPS:
            dt = MAIN_DTYPE[c.name]
            t = roofline_time(flops, OP_BYTES, c, dt)
            times[(i, short(c))] = t
            cells.append(f"{fmt_sig(t * 1e6)} {BOUND_ZH[roofline_bound(flops, OP_BYTES, c, dt)]}")
            ucells.append(f"{100 * min(1.0, i / ridge(c)):.3g}%")
        rows.append(cells)
        util_rows.append(ucells)
    print_table(["强度 I（FLOP/B）"] + [f"{short(c)}（µs）" for c in CHIPS], rows)
    print("\n用上的峰值算力 = min(1, I / 拐点)：")
    print_table(["强度 I（FLOP/B）"] + [short(c) for c in CHIPS], util_rows)

    t1 = times[(1, "H100")]
    util1 = 1 / ridge(H100)
    flat = times[(0.25, "H100")] == times[(64, "H100")]
    lo_ratio = times[(1, "H100")] / times[(1, "H200")]
    hi_ratio = times[(4096, "H100")] / times[(4096, "H200")]
    b_lo = times[(1, "H100")] / times[(1, "B200")]
    b_hi = times[(4096, "H100")] / times[(4096, "B200")]
    full_cs = min(i for i in INTENSITIES if i >= ridge(CORSAIR))      # 表里 Corsair 第一次用满算力的强度
    print_observations([
        f"拐点以下，时间只取决于字节：H100 上强度 0.25 和 64 的算子都是 {fmt_time(times[(0.25, 'H100')])}"
        f"（{'完全相同' if flat else '不同'}）——多做的运算是白送的。强度 1（BF16 的矩阵-向量乘，decode 批大小 1 的情形）"
        f"用了 {fmt_time(t1)}，只用上 H100 峰值算力的 {100 * util1:.2f}%。",
        f"哪块芯片快取决于强度：强度 1 时 H200 的速度是 H100 的 {lo_ratio:.2f} 倍（带宽之比），强度 4096 时{'一样快' if abs(hi_ratio - 1) < 0.005 else f'是 {hi_ratio:.2f} 倍'}（{hi_ratio:.2f}×，算力相同）。"
        f"B200 相对 H100：低强度时速度是它的 {b_lo:.2f} 倍，高强度时 {b_hi:.2f} 倍。",
        f"拐点以上，时间和强度成正比，受算力限制：H100 上强度 4096 要 {fmt_time(times[(4096, 'H100')])}，"
        f"A100 要 {fmt_time(times[(4096, 'A100')])}。",
        f"Corsair 的 SRAM 上强度 {full_cs:g} 就用满了算力（它的拐点是 {ridge(CORSAIR):.0f}）；同一个 1 GB 的算子在强度 1 时只要 {fmt_time(times[(1, 'Corsair')])}"
        f"（前提是数据放得进 {fmt_bytes(CORSAIR.mem_bytes)} 的 SRAM）。",
    ])
    return {"t_h100_i1": t1, "util_h100_i1": util1, "flat_below_ridge": flat, "h200_speedup_low": lo_ratio,
            "h200_speedup_high": hi_ratio, "b200_speedup_low": b_lo, "b200_speedup_high": b_hi,
            "corsair_full_intensity": full_cs, "times": times}


# ---------------------------------------------------------------------------
# 演示 3：大模型里的算子落在哪里
# ---------------------------------------------------------------------------
def demo3_llm_ops():
    m = LLAMA31_8B
    k, n = m.d_model, m.d_ff
    print_header(f"演示 3：{m.name} 的 mlp_up（[B × {k}] · [{k} × {n}]，BF16）和 decode 时的注意力核心落在哪里")
    rows = []
    for b in (1, 4, 16, 64, 256, 1024, 4096, 16384):
        i = matmul_intensity(b, k, n)
        rows.append([b, f"{i:.2f}"] + [BOUND_ZH["compute" if i >= ridge(c) else "memory"] for c in GPUS])
    ctx = 4096
    attn_i = (m.flops_per_token(ctx) - m.flops_per_token(0)) / m.kv_bytes(ctx)
    rows.append(["decode 的注意力核心（任意批）", f"{attn_i:.2f}"]
                + [BOUND_ZH["compute" if attn_i >= ridge(c) else "memory"] for c in GPUS])
    print_table(["mlp_up 一次处理的 token 数 B", "强度 FLOP/B"] + [short(c) for c in GPUS], rows)

    cross = {}
    for c in GPUS:
        b = 1
        while matmul_intensity(b, k, n) < ridge(c):
            b += 1
        cross[short(c)] = b
    print("\n矩阵乘刚好越过拐点（受算力限制）的最小 B：")
    print_table(["芯片", "拐点 FLOP/B", "最小 B"], [[c.name, f"{ridge(c):.0f}", cross[short(c)]] for c in GPUS])
    i1 = matmul_intensity(1, k, n)
    i64 = matmul_intensity(64, k, n)
    b_step = math.ceil(compute_bound_batch(m, H100, 0))     # decode 整步（只算权重字节）越过拐点的最小批
    print_observations([
        f"B = 1（decode 一个序列）时矩阵乘的强度是 {i1:.3f}：每读一个 BF16 权重（2 字节）只做一次乘加（2 FLOPs）。"
        f"B 不大时强度约等于 B（B = 64 时 {i64:.1f}）：同一份权重被 B 个 token 共用——这就是 decode 要攒大批的原因。",
        f"H100 上 B ≥ {cross['H100']} 时这个矩阵乘才受算力限制，A100 上 B ≥ {cross['A100']}，H200 上 B ≥ {cross['H200']}："
        f"拐点越高，要攒的批越大。prefill 一次处理整个提示：几千个 token 的提示在每块 GPU 上都越过了拐点（表里 B = 4096 一行）。"
        f"（这里的字节含读输入激活、写输出（llm_math.matmul_intensity），所以比只算权重字节的 decode 整步的结论"
        f"（H100、上下文 0 时 ⌈B*⌉ = {b_step}，第 1 讲 03、第 2 讲 03）大一些。）",
        f"decode 时注意力核心的强度是 {attn_i:.2f}（= GQA 组大小 {m.group}：每个 KV 头被 {m.group} 个 query 头共用），"
        f"和批大小无关——每个序列读自己的 KV cache，批再大也不共用。它在每块 GPU 上都受带宽限制。",
    ])
    return {"crossover": cross, "i_b1": i1, "i_b64": i64, "attn_intensity": attn_i, "group": m.group,
            "b_step_h100": b_step}


# ---------------------------------------------------------------------------
# 演示 4：roofline 画出来
# ---------------------------------------------------------------------------
def roofline_curve(chip, intensities):
    """一块芯片 BF16 的 roofline：每个强度 I 上可达的算力 min(峰值, I × 带宽)（FLOP/s）。"""
    return [min(chip.peak_flops("bf16"), i * chip.mem_bw) for i in intensities]


def demo4_roofline_plot():
    m = LLAMA31_8B
    print_header(f"演示 4：A100、H100、B200 的 roofline（BF16），和 {m.name} 的 decode / prefill 落在哪里")
    ops = {}
    for b in (1, 64):
        r = decode_step(m, H100, b, PLOT_CONTEXT)
        ops[f"decode 批 {b}"] = r["flops"] / (r["w_bytes"] + r["kv_bytes"])
    r = prefill_step(m, H100, PLOT_PROMPT)
    ops[f"prefill {PLOT_PROMPT}"] = r["flops"] / r["w_bytes"]
    x_lo, x_hi = 0.5, 2e4                                        # 强度的范围（FLOP/字节）
    n = 121
    xs = [x_lo * (x_hi / x_lo) ** (k / (n - 1)) for k in range(n)]   # 对数均匀的强度
    y_lo = x_lo * min(c.mem_bw for c in PLOT_CHIPS) / 1e12
    y_hi = max(c.peak_flops("bf16") for c in PLOT_CHIPS) / 1e12
    ys_v = [y_lo * (y_hi / y_lo) ** (k / 17) for k in range(18)]     # 竖线：每行一个点
    series = {}
    for (name, i), mark in zip(ops.items(), "dDP"):
        series[name] = ([i] * len(ys_v), ys_v, mark)
    for c, mark in zip(PLOT_CHIPS, "*o+"):
        series[short(c)] = (xs, [y / 1e12 for y in roofline_curve(c, xs)], mark)
    print(f"竖线：{m.name}（BF16）一整步的强度 = FLOPs ÷ 读的字节（权重 + KV cache）；decode 的上下文 {PLOT_CONTEXT}")
    print_plot(series, "算术强度 I（FLOP/字节，对数轴）", "可达算力 min(峰值, I × 带宽)（TFLOP/s，对数轴）",
               logx=True, logy=True, xlim=(x_lo, x_hi), ylim=(y_lo, y_hi))
    util = {(k, short(c)): min(1.0, i / ridge(c)) for k, i in ops.items() for c in PLOT_CHIPS}
    d1, d64, pre = list(ops)
    print_observations([
        "每条折线的斜线段受带宽限制（可达算力 = I × 带宽：对数轴上斜率都是 1，带宽越大线越高），平线段受算力限制（= 峰值），"
        "拐角正好在拐点：" + "、".join(f"{short(c)} {ridge(c):.0f}" for c in PLOT_CHIPS) + "。B200 的斜线段和平线段都最高。",
        f"{d1}（强度 {ops[d1]:.2f}）和 {d64}（{ops[d64]:.1f}）都落在三块芯片的斜线段上：H100 上只能用到峰值的 "
        f"{100 * util[(d1, 'H100')]:.2f}% 和 {100 * util[(d64, 'H100')]:.1f}%；这里换芯片，快多少看带宽"
        f"（B200 / H100 = {B200.mem_bw / H100.mem_bw:.2f}×）。",
        f"{pre}（强度 {ops[pre]:.0f}）落在三块芯片的平线段上，用满峰值：快多少看算力"
        f"（B200 / H100 = {B200.peak_flops('bf16') / H100.peak_flops('bf16'):.2f}×）。",
    ])
    return {"intensity": ops, "util": util}


if __name__ == "__main__":
    demo1_chips()
    demo2_time_vs_intensity()
    demo3_llm_ops()
    demo4_roofline_plot()
