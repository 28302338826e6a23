"""
=============================================================================
CS349E · 第 2 讲 · 05_flash_attention.py —— 注意力为什么要分块：FlashAttention 与 HBM 流量
=============================================================================

【这个脚本要回答的问题】
演示 1：分块注意力（FlashAttention）和普通写法 softmax(QKᵀ/√d + 遮罩)·V 的结果一样（因果 / 非因果、GQA、
长度不是块大小的整数倍）——只差浮点舍入。
演示 2：在线 softmax：一行分数一块一块地来，只记"最大值 m"和"指数和 l"两个数，最后的结果和一次算完相同。
演示 3：HBM 流量随 N、d、M 怎么变：普通写法 Θ(Nd + N²)，FlashAttention Θ(N²d²/M)（Dao et al. 2022 定理 2），
用真实运行的计数和公式核对。
演示 4：换到 H100 和 Llama-3.1-8B 的头形状上，4k 和 32k 个 token 的 prefill：分数矩阵有多大、两种写法各搬多少字节。
演示 5：对照 decode：只有一行 query，没有 N×N 的矩阵——decode 的注意力受限于读 KV cache，分块帮不上忙。

【怎么读输出】io 数的是**元素**在 HBM 和片上内存之间搬了几次（乘每个元素的字节数才是字节；演示 4、5 按 BF16 = 2 字节）。
普通写法是三个 kernel：打分（写 S）、softmax（读 S 写 P）、乘 V（读 P）；FlashAttention 按 FlashAttention-2 的循环顺序：
query 块在外层（读一次、输出写一次），key/value 块在内层（每个 query 块各读一遍），每个 query 头单独走一遍它的 K/V 头，
因果时整块在对角线上方的 key 块跳过。计数都来自 transformer_lab 的 naive_attention / flash_attention（运行时数）和
attention_io（同样的数、按公式，大尺寸只能这样数；测试核对两者逐个相等）。

【模型的假设（务必看）】
- 块大小按论文的规则从片上内存 M（元素数）选：B_c = ⌈M / 4d⌉，B_r = min(B_c, d)（Dao et al. 2022, arXiv 2205.14135，算法 1）。
- 演示 4、5 的 M 取 H100 一个 SM 的共享内存 228 KB（NVIDIA H100 架构白皮书），按 BF16 算 116,736 个元素——这是**假设**
  一个 query 块独占一个 SM；真实 kernel 的块更小（受寄存器限制）。L2 cache（H100 SXM5 50 MB）**不算**：
  这里每次从 HBM 读都算数，所以 FlashAttention 的数是没有 cache 时的上界，演示 4 另给"每个张量只读一次"的下限。
- 时间 = 字节 ÷ 3.35 TB/s（H100 SXM5 数据手册），只是搬数据的下界；注意力的计算时间按 989.4 TFLOP/s（BF16 稠密）。

【运行】python3 05_flash_attention.py （约 0.2 秒）

【依赖】numpy；本目录的 flash_lab（flash_attention、naive_attention、attention_io、flash_blocks、online_softmax）；
../lecture01 的 console、hw_specs、llm_math（Llama-3.1-8B 的形状）。
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
for sub in ("lecture01", "lecture02"):
    sys.path.insert(0, os.path.join(HERE, "..", sub))

from console import fmt_bound, fmt_bytes, fmt_num, fmt_time, print_header, print_observations, print_table  # noqa: E402
from hw_specs import H100  # noqa: E402
from llm_math import LLAMA31_8B  # noqa: E402
from flash_lab import attention_io, flash_attention, flash_blocks, naive_attention, online_softmax  # noqa: E402

SRAM_BYTES = 228 * 1024            # H100 一个 SM 的共享内存（白皮书）；当作片上内存 M（假设）
BYTES = 2                          # BF16
L2_BYTES = 50e6                    # H100 SXM5 的 L2 cache（白皮书），只在观察里用来比较


def _total(io):
    return io["read"] + io["written"]


# ---------------------------------------------------------------------------
def demo1_exact():
    print_header("演示 1：分块的结果 = 普通写法（float64）")
    rng = np.random.default_rng(0)
    cases = [("因果，GQA 4/2 头", 4, 2, 37, 37, 16, 8, 16, True),
             ("非因果", 4, 2, 37, 37, 16, 8, 16, False),
             ("因果，最后 5 个 query", 4, 2, 5, 37, 16, 4, 16, True),
             ("因果，块比序列长", 2, 1, 9, 9, 8, 16, 32, True)]
    rows, worst, ios = [], 0.0, []
    for name, H, Hk, nq, nk, d, bq, bk, causal in cases:
        q = rng.standard_normal((H, nq, d))
        k = rng.standard_normal((Hk, nk, d))
        v = rng.standard_normal((Hk, nk, d))
        out_f, io_f = flash_attention(q, k, v, bq, bk, causal)
        out_n, io_n = naive_attention(q, k, v, causal)
        err = float(np.abs(out_f - out_n).max())
        worst = max(worst, err)
        ios.append((_total(io_n), _total(io_f)))
        rows.append([name, f"{H}×{nq}×{d}", f"{Hk}×{nk}×{d}", f"{bq}×{bk}", fmt_bound(err, 1e-12),
                     _total(io_n), _total(io_f)])
    print_table(["情形", "q 形状", "k、v 形状", "块 q×k", "最大 |差|", "普通 io\n（元素）",
                 "分块 io\n（元素）"], rows)
    few = cases[2]
    print_observations([
        f"四种情形下分块的结果和普通写法逐个元素相差 {fmt_bound(worst, 1e-12)}（float64 的舍入）：在线 softmax 不是近似，"
        f"只是换了加法的顺序。长度不是块大小的整数倍时，最后一块短一些，照样对。",
        f"分块省掉的是写、读分数 S 和概率 P，多搬的是 K、V：每个 query 块各读一遍。{len(cases)} 种情形里 "
        f"{sum(f < n for n, f in ios)} 种分块搬得少；\"{few[0]}\"反而多（{ios[2][1]} 对 {ios[2][0]}）："
        f"S 只有 {few[3]} × {few[4]}，省得少，而 {-(-few[3] // few[6])} 个 query 块各读了一遍 K、V。"
        f"N、d、M 大时谁多谁少见演示 3。",
    ])
    return {"worst": worst, "io": ios}


# ---------------------------------------------------------------------------
def demo2_online_softmax():
    print_header("演示 2：在线 softmax——一行 12 个分数，每块 4 个")
    s = np.array([0.3, 1.2, -0.5, 0.8, 2.9, 0.1, -1.0, 2.2, 0.7, 3.4, -0.2, 1.5])
    trace = online_softmax(s, 4)
    rows = [[i + 1, f"{bm:.2f}", f"{m:.2f}", f"{l:.4f}"] for i, (bm, m, l) in enumerate(trace)]
    print_table(["块", "这块的最大值", "m（到目前的最大值）", "l = Σ e^(s−m)"], rows)
    m, l = trace[-1][1], trace[-1][2]
    direct = float(np.exp(s - s.max()).sum())
    print_observations([
        f"第 2 块来了更大的分数（{trace[1][0]:.2f}），m 从 {trace[0][1]:.2f} 变成 {trace[1][1]:.2f}，之前的 l 乘 "
        f"e^({trace[0][1]:.2f} − {trace[1][1]:.2f}) 缩小一次就接上了，不用回头看旧分数。",
        f"走完三块：m = {m:.2f}、l = {l:.4f}；一次算完 Σ e^(s − max s) = {direct:.4f}，相差 {fmt_bound(abs(l - direct), 1e-12)}。"
        f"输出的累加器也按同样的因子缩小，所以整个 N×N 的分数矩阵从来不用存下来。",
    ])
    return {"m": m, "l": l, "direct": direct, "trace": trace}


# ---------------------------------------------------------------------------
def demo3_io_complexity():
    print_header("演示 3：HBM 流量 vs N、d、M（一个头，非因果，单位：元素）")
    rows, res = [], []
    for d, M in ((64, 16384), (64, 4096), (128, 65536)):
        br, bc = flash_blocks(M, d)
        for N in (512, 1024, 2048, 4096):
            naive = _total(attention_io("naive", 1, 1, N, N, d, causal=False))
            flash = _total(attention_io("flash", 1, 1, N, N, d, br, bc, causal=False))
            ran = ""
            if N <= 1024 and br >= 64:            # 小尺寸真的跑一遍，运行时数的和公式比
                x = np.zeros((1, N, d))
                ran = "相等" if _total(flash_attention(x, x, x, br, bc, causal=False)[1]) == flash else "不等"
            res.append((d, M, N, naive, flash))
            rows.append([d, fmt_num(M), f"{br}×{bc}", N, fmt_num(naive), fmt_num(flash), f"{naive / flash:.1f}",
                         f"{naive / (N * d + N * N):.2f}", f"{flash / (N * N * d * d / M):.2f}", ran])
    print_table(["d", "M", "块 B_r×B_c", "N", "普通", "分块", "普通÷分块", "普通÷\n(Nd+N²)", "分块÷\n(N²d²/M)",
                 "运行计数\n= 公式"], rows)
    c_naive = [naive / (N * d + N * N) for d, M, N, naive, flash in res]
    c_flash = [flash / (N * N * d * d / M) for d, M, N, naive, flash in res]
    big = [(d, M, N, naive / flash) for d, M, N, naive, flash in res if N == 4096]
    small = (64, 4096, flash_blocks(4096, 64)[0])
    print_observations([
        f"普通写法 ÷ (Nd + N²) 在每一行都是 {max(c_naive):.2f}（读写 Q、K、V、O 共 4Nd，S 和 P 各写一次读一次共 4N²）；"
        f"分块 ÷ (N²d²/M) 在 {min(c_flash):.2f}–{max(c_flash):.2f} 之间、N 越大越接近 8"
        f"——两个计数都和论文定理 2 的阶一致"
        f"（这里 M ≤ 4d²，所以 B_r = B_c = M/4d，每个 query 块读一遍全部 K、V：2N²d/B_r = 8N²d²/M）。",
        f"两种写法都按 N² 增长，所以\"普通÷分块\"不随 N 变，约为 4N² ÷ (8N²d²/M) = M/2d²："
        f"N = 4096 时是 {big[0][3]:.1f}、{big[1][3]:.1f}、{big[2][3]:.1f}（按表里三组 d、M）。"
        f"M 越大，块越大，K、V 被重读的次数越少；M = {small[1]}、d = {small[0]} 时块只有 "
        f"{small[2]} 行，分块反而搬得多。在 M ≤ 4d² 的这几行里，分块能省多少取决于 M/d²，不取决于 N。",
    ])
    return {"c_naive": (min(c_naive), max(c_naive)), "c_flash": (min(c_flash), max(c_flash)),
            "ratio_4096": [r for *_, r in big], "small_block": small[2]}


# ---------------------------------------------------------------------------
def _min_io(H, H_kv, n_q, n_k, d):
    """每个张量只从 HBM 读一次、输出写一次的元素数（下限）：q、k、v 各一遍加输出。"""
    return H * n_q * d + 2 * H_kv * n_k * d + H * n_q * d


def demo4_h100_prefill():
    m = LLAMA31_8B
    H, Hk, d = m.n_heads, m.n_kv_heads, m.head_dim
    M = SRAM_BYTES // BYTES
    br, bc = flash_blocks(M, d)
    print_header(f"演示 4：H100 上一层注意力的 prefill（{m.name}：{H} 个 query 头、{Hk} 个 KV 头、d = {d}，BF16，因果）")
    print(f"片上内存 M = {SRAM_BYTES // 1024} KB（× 1024 字节）= {M:,} 个 BF16（假设）→ 块 B_r × B_c = {br} × {bc}")
    rows, res = [], {}
    for N in (4096, 32768):
        naive = _total(attention_io("naive", H, Hk, N, N, d, causal=True)) * BYTES
        flash = _total(attention_io("flash", H, Hk, N, N, d, br, bc, causal=True)) * BYTES
        low = _min_io(H, Hk, N, N, d) * BYTES
        flops = 4 * H * d * N * (N + 1) // 2                  # QKᵀ 和 PV 各 2·d 次，因果只算下三角
        s_bytes = H * N * N * BYTES
        res[N] = dict(naive=naive, flash=flash, low=low, flops=flops, s_bytes=s_bytes)
        rows.append([N, fmt_bytes(s_bytes), fmt_bytes(naive), fmt_bytes(flash), fmt_bytes(low),
                     fmt_time(naive / H100.mem_bw), fmt_time(flash / H100.mem_bw),
                     fmt_time(flops / H100.peak_flops("bf16"))])
    print_table(["N", "分数矩阵\n（全部头）", "普通\n搬的字节", "分块\n搬的字节", "下限：\n每个张量一遍",
                 "普通\n搬运时间", "分块\n搬运时间", "计算时间\n（峰值）"], rows)
    r32 = res[32768]
    kv_head = 2 * 32768 * d * BYTES
    kv_share = 1 - 2 * H * 32768 * d * BYTES / r32["flash"]        # 减去读 Q、写 O
    print_observations([
        f"普通写法要把分数矩阵 S 写进 HBM：32k 个 token 时一层的 S 有 {fmt_bytes(r32['s_bytes'])}，概率矩阵 P "
        f"一样大，两个加起来比一块 H100 的 {fmt_bytes(H100.mem_bytes)} 还大。普通写法一共搬 {fmt_bytes(r32['naive'])}"
        f"（{100 * 4 * r32['s_bytes'] / r32['naive']:.1f}% 是写、读 S 和 P），要 {fmt_time(r32['naive'] / H100.mem_bw)}，"
        f"是这一层计算时间的 {r32['naive'] / H100.mem_bw / (r32['flops'] / H100.peak_flops('bf16')):.0f} 倍。"
        f"FlashAttention 从不写出这个矩阵。",
        f"分块按本表的数法（不算 cache）搬 {fmt_bytes(r32['flash'])}，是普通写法的 "
        f"1/{r32['naive'] / r32['flash']:.1f}；其中 {100 * kv_share:.1f}% 是 K、V 被每个 query 块、每个 query 头重读。"
        f"一个 KV 头 32k 个位置的 K、V 只有 {fmt_bytes(kv_head)}，放得进 {fmt_bytes(L2_BYTES)} 的 L2：同时在算的 query 块"
        f"可以共享这些读。L2 挡住的越多，HBM 流量越接近下限 {fmt_bytes(r32['low'])}"
        f"（{fmt_time(r32['low'] / H100.mem_bw)}），那时计算（{fmt_time(r32['flops'] / H100.peak_flops('bf16'))}）"
        f"就成了瓶颈；普通写法的 N² 项没有这条出路。",
    ])
    return {"blocks": (br, bc), "res": res, "kv_head_bytes": kv_head, "kv_share": kv_share}


# ---------------------------------------------------------------------------
def demo5_decode():
    m = LLAMA31_8B
    H, Hk, d = m.n_heads, m.n_kv_heads, m.head_dim
    M = SRAM_BYTES // BYTES
    br, bc = flash_blocks(M, d)
    print_header(f"演示 5：对照 decode——一个新 token（n_q = 1），一层注意力（{m.name}，BF16）")
    rows, res = [], {}
    for N in (4096, 32768):
        naive = _total(attention_io("naive", H, Hk, 1, N, d, causal=True)) * BYTES
        flash = _total(attention_io("flash", H, Hk, 1, N, d, br, bc, causal=True)) * BYTES
        kv = 2 * Hk * N * d * BYTES                             # 这一层的 KV cache
        flops = 4 * H * d * N
        res[N] = dict(naive=naive, flash=flash, kv=kv, flops=flops)
        rows.append([N, fmt_bytes(naive), fmt_bytes(flash), fmt_bytes(kv), f"{flops / flash:.2f}", f"{flops / kv:.1f}",
                     fmt_time(kv / H100.mem_bw)])
    print_table(["上下文 N", "普通", "分块（每个头\n各读 KV）", "KV cache\n（读一遍）", "强度：\n分块", "强度：\nKV 一遍",
                 "读 KV 的时间"], rows)
    r = res[32768]
    print_observations([
        f"decode 只有一行 query：分数矩阵是 1 × N，普通写法和分块只差 {100 * (r['naive'] - r['flash']) / r['flash']:.2f}%"
        f"（上下文 32k）。两者的大头都是读 K、V。",
        f"按每个 query 头各读一遍它的 KV 头，强度只有 {r['flops'] / r['flash']:.2f} FLOP/字节；GQA 感知的 decode kernel "
        f"让一组 {H // Hk} 个头共用一次读，强度是 {r['flops'] / r['kv']:.1f}（= 组大小）——都远低于 H100 的拐点 "
        f"{H100.ridge_point('bf16'):.0f}。decode 的注意力受限于读 KV cache（第 1 讲的账），分块解决的是 prefill 的 N² 问题。",
    ])
    return {"res": res, "group": H // Hk}


if __name__ == "__main__":
    demo1_exact()
    demo2_online_softmax()
    demo3_io_complexity()
    demo4_h100_prefill()
    demo5_decode()
