"""
=============================================================================
CS349E · 第 3 讲预备 · 02_scaling_and_blocks.py —— 整数格式和块格式：scale 放在哪、管多少个数
=============================================================================

【这个脚本要回答的问题】
演示 1：对称整数量化一步步怎么做：scale = max|w| / qmax，q = round(w / scale)，w' = q · scale；误差不超过 scale / 2。
演示 2：截断（clipping）：把 scale 取小一点，大的数被截到 ±qmax，换来其余数更细的间隔；INT4 每张量量化的误差随截断比例怎么变。
演示 3：粒度和离群值：每张量 / 每通道 / 每组 32 个一个 scale 的误差；放进一个 50σ 的离群值后，三种粒度各坏了多少。
演示 4：MXFP4（E2M1 元素 + 每 32 个共享一个 E8M0 scale）怎么量化一个块，和 INT4 分组量化比误差；E2M1 的不均匀网格在正态权重上
并不比 INT4 的等间距网格准，有用的是更小的块（NVFP4）。
演示 5：每个数到底占几位——把 scale 算进去：INT4 每 32 个一个 FP16 scale = 4.5 位，MXFP4 = 4.25 位（第 5 讲脚本 05 的 T_BITS）；FP8 每通道一个 FP32 scale。

【怎么读输出】"相对误差" = ‖W − W'‖_F / ‖W‖_F（W' 是量化再反量化的结果）。权重矩阵按 [输入维, 输出维] 存（y = x · W），
"每通道" = 每个输出通道（W 的一列）一个 scale；"每组 g" = 每列里沿输入维每 g 个数一个 scale。"位/数" 含 scale。

【模型的假设（务必看）】权重用独立同分布的 N(0, 1) 随机数代替（真实权重接近正态，但有更重的尾巴和离群值）——**这是假设**，
误差的数值只对这种分布成立；scale 的位置和位数的账和分布无关。离群值 50σ 是为了让效果一眼可见而**选的假设值**。
INT 量化是对称的（没有零点），scale 存成 FP16（numfmt 的约定）；MX 格式按 OCP Microscaling Formats Specification v1.0：
共享 scale X = 2^(⌊log₂ max|v|⌋ − 2)（E2M1 最大正规数的指数是 2），元素舍入到 E2M1、超出的饱和到 ±6。
NVFP4 按 NVIDIA 对 Blackwell 的 NVFP4 的描述：E2M1 元素、每 16 个一个 E4M3 scale、整个张量再一个 FP32 scale（numfmt.quantize_nvfp4）。

【运行】python3 02_scaling_and_blocks.py （约 0.4 秒）

【依赖】numpy；本目录的 numfmt（quantize_int、quantize_mx、quantize_nvfp4、quantize_e2m1_fp16、round_to、bits_per_value、INT_QMAX）；
../lecture01 的 console。
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))

from console import print_header, print_observations, print_table  # noqa: E402
from numfmt import (FP16, FP4_E2M1, INT_QMAX, bits_per_value, quantize_e2m1_fp16, quantize_int, quantize_mx,  # noqa: E402
                    quantize_nvfp4, round_to)

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
    print_observations([
        f"MX 的 scale 只能是 2 的幂：X = 2^(⌊log₂ max|v|⌋ − 2)，所以 max|v| / X 落在 [4, 8)。E2M1 最大只到 6，"
        f"max|v| / X ≥ 7 的块最大的数被饱和截断——这个矩阵里 {sat:.0%} 的块如此（这个块 max|v| / X = {amax / X:.2f}）。"
        f"这个块里 MXFP4 误差最大的是{'块最大的数' if worst_is_max else '第 ' + str(worst_k) + ' 个数'}"
        f"（误差 {worst_err:.3f}）：它的 v / X = {block[worst_k] / X:+.3f} 落在 E2M1 的 4 和 6 之间的空档里。",
        "E2M1 的 8 个非负值（0, 0.5, 1, 1.5, 2, 3, 4, 6）在 0 附近密、在大处稀；INT4 的 15 个值（-7…7）等间距。"
        f"在 N(0, 1) 权重上，不均匀的网格并不占便宜：同样每 {GROUP} 个一个 FP16 scale（块的最大值对到 6 或 7），"
        f"E2M1 元素的相对误差 {e2['rel_err']:.4f}，比 INT4-g32 的 {g32['rel_err']:.4f} "
        + ("略高" if e2["rel_err"] > g32["rel_err"] else "低") + "。"
        f"有用的是更小的块：NVFP4 每 16 个一个 E4M3 scale（比 MX 的 2 的幂准；外加整个张量一个 FP32 scale），同样 "
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


if __name__ == "__main__":
    demo1_symmetric_int()
    demo2_clipping()
    demo3_granularity_outlier()
    demo4_mxfp4()
    demo5_bits_per_value()
