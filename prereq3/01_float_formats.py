"""
=============================================================================
CS349E · 第 3 讲预备 · 01_float_formats.py —— 浮点数的位：FP32 到 FP4，范围、精度和舍入
=============================================================================

【这个脚本要回答的问题】
演示 1：FP32 / FP16 / BF16 / FP8-E4M3 / FP8-E5M2 / FP4-E2M1 各用几位做符号、指数、尾数，偏置多少；最大值、最小正规数、
最小次正规数、相对精度各是多少——全部由位数算出来，和规范对得上。
演示 2：把 FP4-E2M1 的 16 个码全部列出来（按位解码），再数一数两种 FP8 各有多少个有限值，并把 E2M1 和 E4M3 画在同一条数轴上：
小格式的"数轴"长什么样，哪里密、哪里稀。
演示 3：就近舍入、一样近时取偶数（RNE）在边界上怎么走：平局、溢出（IEEE 格式变 inf；E4M3 按 numfmt 的选择饱和，
E2M1 没有别的码、只能饱和）、下溢到 ±0、次正规数。
演示 4：几个数在各格式里的位串（encode_bits），BF16 和 FP32 的关系，0.1 在各格式里变成多少。
演示 5：相对精度的含义：正规数范围内，舍入的相对误差不超过 ε/2 = 2^-(尾数位数+1)，平均约是它的 36%。

【怎么读输出】一个浮点数 = (-1)^符号 × 1.尾数 × 2^(指数码 − 偏置)；指数码全 0 是次正规数：(-1)^符号 × 0.尾数 × 2^(1 − 偏置)。
"相对精度 ε" = 1 和比 1 大的下一个数之差 = 2^-(尾数位数)。位串写成 符号.指数.尾数。NaN = Not a Number（"不是数"的码）。
"十进制有效数字" = 有效的二进制位数（尾数位 + 隐含的 1 位）换算成十进制：log10(2^(尾数位数+1))。

【模型的假设（务必看）】没有假设值：格式的定义来自规范——IEEE 754-2008（FP32 = binary32、FP16 = binary16）；BF16 是 FP32 的高 16 位
（Google Brain 的 bfloat16，8 位指数、7 位尾数）；OCP 8-bit Floating Point Specification (OFP8) v1.0（E4M3：没有 inf，只有
S.1111.111 是 NaN，最大 448，最小次正规数 2^-9；E5M2：IEEE 风格，最大 57344）；OCP Microscaling (MX) Formats Specification v1.0
（E2M1：没有 inf 和 NaN，最大 6，最小次正规数 0.5）。OCP 的 FP8 规范允许溢出时饱和或不饱和（变 NaN），这里 E4M3 按饱和
（numfmt 的选择）；库各不相同：ml_dtypes 溢出给 NaN（jax-ml/ml_dtypes#260），PyTorch 的 eager 转换原来也给 NaN
（pytorch/ao#1912），2026 年的 nightly 改成饱和（pytorch/ao#4359）。

【运行】python3 01_float_formats.py （约 0.2 秒）

【依赖】numpy；本目录的 numfmt（格式、round_to、encode_bits）；../lecture01 的 console。
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))

from console import display_width, print_header, print_observations, print_table  # noqa: E402
from numfmt import (BF16, FLOAT_FORMATS, FP4_E2M1, FP8_E4M3, FP8_E5M2, FP16, FP32, FloatFormat,  # noqa: E402
                    encode_bits, round_to)

SEED = 0              # 演示 5 的随机数
N_RANDOM = 100_000    # 演示 5：每个格式抽多少个正规数范围内的随机数


def decode(sign, exp, man, fmt):
    """
    按位解码（不经过 numfmt）：(符号位串, 指数位串, 尾数位串) -> 值。

    【推导】指数码 E ≠ 0：(-1)^s × (1 + 尾数/2^m) × 2^(E − 偏置)；E = 0（次正规数）：(-1)^s × (尾数/2^m) × 2^(1 − 偏置)。
    【边界】不处理 inf / NaN 的码（调用者自己排除）。
    """
    s = -1.0 if sign == "1" else 1.0
    E = int(exp, 2)
    M = int(man, 2) if man else 0
    m = fmt.man_bits
    if E == 0:
        return s * (M / 2 ** m) * 2.0 ** (1 - fmt.bias)
    return s * (1 + M / 2 ** m) * 2.0 ** (E - fmt.bias)


def code_kind(exp, man, fmt):
    """一个码是什么：'零'、'次正规'、'正规'、'inf'、'NaN'（按规范的约定）。"""
    top = exp == "1" * fmt.exp_bits
    if fmt.has_inf and top:
        return "inf" if int(man or "0", 2) == 0 else "NaN"
    if fmt.nan_in_top and top and man == "1" * fmt.man_bits:
        return "NaN"
    if exp == "0" * fmt.exp_bits:
        return "零" if int(man or "0", 2) == 0 else "次正规"
    return "正规"


def all_codes(fmt):
    """枚举一个小格式的全部 2^位数 个码 -> [(符号, 指数, 尾数, 种类, 值或 None)]。"""
    out = []
    e, m = fmt.exp_bits, fmt.man_bits
    for c in range(2 ** fmt.bits):
        b = format(c, f"0{fmt.bits}b")
        sign, exp, man = b[0], b[1:1 + e], b[1 + e:]
        kind = code_kind(exp, man, fmt)
        out.append((sign, exp, man, kind, decode(sign, exp, man, fmt) if kind in ("零", "次正规", "正规") else None))
    return out


def bits_str(value, fmt):
    s, e, m = encode_bits(value, fmt)
    return f"{s}.{e}.{m}"


# ---------------------------------------------------------------------------
# 演示 1：位布局、范围、精度
# ---------------------------------------------------------------------------
def demo1_layouts():
    print_header("演示 1：六种浮点格式的位布局、范围和相对精度（全部由位数算出）")
    rows, res = [], {}
    for f in FLOAT_FORMATS:
        res[f.name] = {"bits": f.bits, "exp_bits": f.exp_bits, "man_bits": f.man_bits, "bias": f.bias,
                       "max": f.max_value, "min_normal": f.min_normal, "min_subnormal": f.min_subnormal,
                       "epsilon": f.epsilon, "emin": f.emin, "emax": f.emax,
                       "binades": f.emax - (f.emin - f.man_bits) + 1,
                       "digits": float((f.man_bits + 1) * np.log10(2)),     # 有效二进制位（含隐含的 1）换成十进制
                       "overflow_at": f.max_value + 2.0 ** (f.emax - f.man_bits - 1)}   # 最大值 + 半个间隔：从这里起舍入成 inf
        rows.append([f.name, f.bits, f"1 / {f.exp_bits} / {f.man_bits}", f.bias, f"{f.max_value:.6g}",
                     "inf" if f.has_inf else "饱和（numfmt 选的）" if f.nan_in_top else "饱和（没有别的码）"])
    print_table(["格式", "位数", "符号/指数/尾数", "偏置", "最大有限值", "溢出时"], rows)
    print()
    print_table(["格式", "最小正规数", "最小次正规数", "相对精度 ε"],
                [[f.name, f"2^{f.emin} = {f.min_normal:.4g}", f"2^{f.emin - f.man_bits} = {f.min_subnormal:.4g}",
                  f"2^-{f.man_bits} = {f.epsilon:.3g}"] for f in FLOAT_FORMATS])
    r = res
    print_observations([
        f"指数位决定范围，尾数位决定精度。FP16 和 BF16 都是 16 位：FP16 给尾数 {r['FP16']['man_bits']} 位（ε = "
        f"{r['FP16']['epsilon']:.3g}）但最大只到 {r['FP16']['max']:.0f}；BF16 的指数和 FP32 一样是 8 位，最大值 "
        f"{r['BF16']['max']:.3g} 和 FP32 的 {r['FP32']['max']:.3g} 同一个量级，代价是 ε = {r['BF16']['epsilon']:.3g}"
        f"（有效位 = {r['BF16']['man_bits']} 位尾数 + 隐含的 1 位 = {r['BF16']['man_bits'] + 1} 位二进制，约 {r['BF16']['digits']:.1f} 位十进制有效数字；"
        f"FP16 {r['FP16']['digits']:.1f} 位、FP32 {r['FP32']['digits']:.1f} 位）。"
        f"从 FP32 转成 BF16，只有不小于 {r['BF16']['overflow_at']:.6g} 的数（BF16 最大值加半个间隔，离 FP32 的最大值不到 "
        f"{100 * (1 - r['BF16']['overflow_at'] / r['FP32']['max']):.1f}%）才溢出成 inf；FP16 到 "
        f"{r['FP16']['overflow_at']:.0f} 就溢出：这是训练和推理常选 BF16 的一个原因。",
        f"E4M3 的最大值是 {r['FP8-E4M3']['max']:.0f} 而不是 1.875 × 2^8 = {1.875 * 2 ** 8:.0f}：它没有 inf，把最大的指数码也拿来"
        f"表示数，只留 S.1111.111 当 NaN，所以最大是 1.75 × 2^{FP8_E4M3.emax} = {r['FP8-E4M3']['max']:.0f}。E5M2 和 IEEE 一样留出"
        f"最大指数码给 inf 和 NaN：1.75 × 2^{FP8_E5M2.emax} = {r['FP8-E5M2']['max']:.0f}。"
        f"E4M3 溢出时变什么是转换的选择，不是格式的性质：OCP OFP8 规范允许饱和到 {r['FP8-E4M3']['max']:.0f} 或变 NaN，"
        "numfmt 选了饱和，别的库不一定（ml_dtypes 给 NaN）。E2M1 连 NaN 的码也没有，溢出只能饱和。",
        f"同是 8 位，E4M3 精度高一倍（ε = {r['FP8-E4M3']['epsilon']:g} vs {r['FP8-E5M2']['epsilon']:g}），E5M2 范围大得多"
        f"（从最小次正规数到最大值跨 {r['FP8-E5M2']['binades']} 个 2 的幂 vs {r['FP8-E4M3']['binades']} 个）。"
        "所以 FP8 格式的提出者建议 E4M3 存权重和激活、E5M2 存训练时的梯度（Micikevicius 等 2022，arXiv 2209.05433）。",
        f"FP4-E2M1 只有 4 位：最大 {r['FP4-E2M1']['max']:g}、最小次正规数 {r['FP4-E2M1']['min_subnormal']:g}、ε = "
        f"{r['FP4-E2M1']['epsilon']:g}。它单独没法表示权重（范围太小），必须配一个 scale 用（下一个脚本的 MXFP4）。",
    ])
    return res


# ---------------------------------------------------------------------------
# 演示 2：把小格式的码全部列出来
# ---------------------------------------------------------------------------
def number_line(strips, lo, hi, width=72):
    """
    几条横的数轴，上下对齐、共用一条刻度 -> 各行（一条一行，行首是它的名字）。

    strips：[(名字, 值, 记号), …]；值 v 画在第 round((v − lo) / (hi − lo) · (width − 1)) 列（落在同一列的重叠），
    刻度是 lo..hi 之间的整数。名字按显示宽度对齐。
    """
    lw = max(display_width(name) for name, _, _ in strips)
    col = lambda v: int(round((v - lo) / (hi - lo) * (width - 1)))       # noqa: E731
    lines = []
    for name, vals, mark in strips:
        row = [" "] * width
        for v in vals:
            row[col(v)] = mark
        lines.append((name + " " * (lw - display_width(name)) + " " + "".join(row)).rstrip())
    ticks = range(int(np.ceil(lo)), int(np.floor(hi)) + 1)
    base, under = ["-"] * width, [" "] * (width + 2)
    for t in ticks:
        base[col(t)] = "+"
        under[col(t)] = str(t)
    lines.append(" " * (lw + 1) + "".join(base))
    lines.append((" " * (lw + 1) + "".join(under)).rstrip())
    return lines


def demo2_small_formats_enumerated():
    print_header("演示 2：FP4-E2M1 的全部 16 个码（按位解码），以及两种 FP8 有多少个有限值")
    codes = all_codes(FP4_E2M1)
    rows = []
    for sign, exp, man, kind, v in codes:
        rows.append([f"{sign}.{exp}.{man}", kind, f"{v:g}", bits_str(v, FP4_E2M1) == f"{sign}.{exp}.{man}"])
    print_table(["位（符号.指数.尾数）", "种类", "值", "encode_bits 给出同样的位"], rows)
    pos = sorted({v for *_, v in codes if v is not None and v > 0})
    counts = {}
    for f in (FP8_E4M3, FP8_E5M2, FP4_E2M1):
        cs = all_codes(f)
        finite = [v for *_, v in cs if v is not None]
        counts[f.name] = {"codes": len(cs), "finite_codes": len(finite), "distinct": len(set(finite)),
                          "nan": sum(1 for c in cs if c[3] == "NaN"), "inf": sum(1 for c in cs if c[3] == "inf"),
                          "max": max(finite), "min_pos": min(v for v in finite if v > 0),
                          "all_fixed_points": bool(np.all(round_to(np.array(finite), f) == np.array(finite)))}
    rows2 = [[n, c["codes"], c["finite_codes"], c["distinct"], c["inf"], c["nan"], f"{c['min_pos']:g}", f"{c['max']:g}",
              c["all_fixed_points"]] for n, c in counts.items()]
    print()
    print_table(["格式", "码的个数", "有限值的码", "不同的有限值", "inf 码", "NaN 码", "最小正数", "最大值",
                 "舍入后不变"], rows2)
    print("不同的有限值：+0 和 -0 算一个；舍入后不变：round_to 把每个有限值映到它自己")
    gaps = np.diff([0.0] + pos)
    c4, c5 = counts["FP8-E4M3"], counts["FP8-E5M2"]
    # 数轴：E2M1 的全部非负值，和 E4M3 落在同一段 [0, 6] 里的非负值
    e2m1 = [0.0] + pos
    e4m3 = sorted({v for *_, v in all_codes(FP8_E4M3) if v is not None and 0 <= v <= FP4_E2M1.max_value})
    print(f"\n数轴 [0, {FP4_E2M1.max_value:g}]：每个可表示的非负值画一个记号（落在同一格的值重叠）")
    for line in number_line([("E2M1", e2m1, "o"), ("E4M3", e4m3, "|")], 0.0, FP4_E2M1.max_value):
        print(line)
    print("     值（线性轴）；o = FP4-E2M1 的值，| = FP8-E4M3 在 [0, 6] 里的值")
    e4_small = sum(1 for v in e4m3 if v < 0.5)
    per_binade = {f.name: 2 ** f.man_bits for f in (FP4_E2M1, FP8_E4M3)}   # 每个正规数的 2 的幂区间里有几个值
    ieee_e4m3 = FloatFormat("E4M3（假如 IEEE 风格）", 4, 3, True)   # 对比用：最大的指数码留给 inf / NaN
    print_observations([
        f"E2M1 的正数只有 {len(pos)} 个：{', '.join(f'{v:g}' for v in pos)}。相邻两个的间隔从 {gaps.min():g} 涨到 "
        f"{gaps.max():g}：浮点数的间隔随数的大小变大（每过一个 2 的幂翻一倍），整数格式的间隔则处处相同。",
        f"按位解码的结果和 numfmt.encode_bits 完全一致（上表最后一列），最大值 {counts['FP4-E2M1']['max']:g}（0.11.1）、"
        f"最小次正规数 {counts['FP4-E2M1']['min_pos']:g}（0.00.1）正是 OCP MX 规范给的数。",
        f"E4M3 的 {c4['codes']} 个码里 {c4['nan']} 个是 NaN、{c4['inf']} 个 inf，{c4['finite_codes']} 个有限值的码"
        f"（去掉 ±0 的重复是 {c4['distinct']} 个不同的数）；E5M2 有 {c5['inf']} 个 inf 码、{c5['nan']} 个 NaN 码，只剩 "
        f"{c5['finite_codes']} 个有限值的码。E4M3 放弃 inf 为的是范围，不是省码：如果像 IEEE 那样把最大的指数码 1111 "
        f"整个留给 inf / NaN，最大值只有 1.875 × 2^{ieee_e4m3.emax} = {ieee_e4m3.max_value:g}；OFP8 让这个指数码里的 7 个尾数码"
        f"都当正规数，最大值到 {c4['max']:g}，多出 2^{FP8_E4M3.emax} = {2.0 ** FP8_E4M3.emax:g} 到 {c4['max']:g} 这一整段"
        f"（OCP OFP8 规范）。只有 4 位指数时，多一个 2 的幂的范围比省下的几个码要紧；E5M2 范围够大，保留了 IEEE 的 inf。",
        f"数轴上两种格式都是靠近 0 密、越往大越稀：每个 2 的幂区间（[1, 2)、[2, 4)、…）里的值一样多——E2M1 "
        f"{per_binade['FP4-E2M1']} 个、E4M3 {per_binade['FP8-E4M3']} 个——区间越往右越长，间隔就越大。"
        f"[0, {FP4_E2M1.max_value:g}] 里 E2M1 只有 {len(e2m1)} 个值，E4M3 有 {len(e4m3)} 个，其中 {e4_small} 个挤在 [0, 0.5) 里"
        f"（图的最左边重叠成一片）。",
    ])
    return {"e2m1_positive": pos, "e2m1_gaps": gaps.tolist(), "counts": counts, "ieee_style_e4m3_max": ieee_e4m3.max_value,
            "e4m3_in_e2m1_range": len(e4m3), "e4m3_below_half": e4_small, "per_binade": per_binade,
            "encode_matches": all(r[3] for r in rows)}


# ---------------------------------------------------------------------------
# 演示 3：舍入的边界情况
# ---------------------------------------------------------------------------
EDGE_CASES = [
    # (格式, 输入, 说明)
    (FP16, 1 + 2.0 ** -11, "平局：1 和 1+2^-10 正中间 → 尾数取偶（1）"),
    (FP16, 1 + 3 * 2.0 ** -11, "平局：1+2^-10 和 1+2^-9 正中间 → 取偶（1+2^-9）"),
    (FP16, 65519.0, "比最大值 65504 大，但不到半个间隔 → 65504"),
    (FP16, 65520.0, "65504 和 65536 正中间 → 取偶 = 65536，超出 → inf"),
    (FP16, 1e6, "远超最大值 → inf（IEEE：溢出成 inf）"),
    (FP16, -1e-9, "比最小次正规数的一半还小的负数 → -0"),
    (FP16, 3 * 2.0 ** -25, "次正规数区间的平局：2^-24 和 2^-23 中间 → 取偶（2^-23）"),
    (FP16, 1e-7, "次正规数：量子固定为 2^-24"),
    (BF16, 1 + 2.0 ** -8, "平局：1 和 1+2^-7 正中间 → 取偶（1）"),
    (BF16, np.pi, "π 只剩 8 位有效二进制位"),
    (BF16, 1e38, "BF16 的范围和 FP32 一样，1e38 不溢出"),
    (FP8_E4M3, 464.0, "448 和 480 正中间 → 取偶 = 448"),
    (FP8_E4M3, 500.0, "超出最大值 → 饱和到 448"),
    (FP8_E4M3, np.inf, "inf 也饱和到 448（numfmt 的选择）"),
    (FP8_E4M3, 2.0 ** -10, "最小次正规数 2^-9 的一半：0 和 2^-9 中间 → 取偶 = 0"),
    (FP8_E4M3, 3 * 2.0 ** -10, "2^-9 和 2^-8 中间 → 取偶 = 2^-8"),
    (FP8_E5M2, 60000.0, "没过 57344 和 65536 的中点 → 57344"),
    (FP8_E5M2, 61440.0, "57344 和 65536 正中间 → 取偶 = 65536，超出 → inf"),
    (FP4_E2M1, 5.0, "4 和 6 正中间 → 取偶（4 = 1.0 × 2^2）"),
    (FP4_E2M1, 0.75, "0.5 和 1 正中间 → 取偶（1.0）"),
    (FP4_E2M1, 0.25, "0 和 0.5 正中间 → 取偶 = 0"),
    (FP4_E2M1, 100.0, "超出 → 饱和到 6"),
    (FP4_E2M1, -0.1, "负的小数 → -0（保留符号）"),
]


def demo3_rounding_edges():
    print_header("演示 3：就近舍入、平局取偶（RNE）在边界上怎么走（numfmt.round_to）")
    rows, res = [], []
    for f, x, note in EDGE_CASES:
        y = float(round_to(x, f))
        neg_zero = y == 0 and np.signbit(y)
        shown = "-0" if neg_zero else (f"{y:.10g}" if np.isfinite(y) else ("inf" if y > 0 else "-inf"))
        xs = "inf" if np.isinf(x) else f"{x:.10g}"
        res.append({"fmt": f.name, "x": x, "y": y, "neg_zero": bool(neg_zero)})
        rows.append([f.name, xs, shown, note])
    print_table(["格式", "输入", "舍入后", "为什么"], rows)
    y = {(r["fmt"], r["x"]): r["y"] for r in res}
    print_observations([
        f"平局取偶：FP16 里 1 + 2^-11 → {y[('FP16', 1 + 2.0 ** -11)]:.10g}（舍），1 + 3·2^-11 → "
        f"{y[('FP16', 1 + 3 * 2.0 ** -11)]:.10g}（入）——都落到尾数最后一位是 0 的那个数上。只往一个方向舍的规则会让误差"
        "累积出偏差，取偶让平局一半向上一半向下。numpy 的 np.round 也是这个规则。",
        f"溢出：IEEE 风格的 FP16 / E5M2 到了 最大值 + 半个间隔（正好在中点也算，取偶进位）就是 inf（65520 → {y[('FP16', 65520.0)]}，"
        f"61440 → {y[('FP8-E5M2', 61440.0)]}）；E4M3 没有 inf，numfmt 让它饱和到最大值（500 → {y[('FP8-E4M3', 500.0)]:g}；"
        f"变 NaN 也合规范，演示 1），E2M1 既没有 inf 也没有 NaN，只能饱和（100 → {y[('FP4-E2M1', 100.0)]:g}）。量化时正是靠 scale 让数落在范围里，饱和只是兜底。",
        f"下溢：比最小次正规数的一半还小的数变成 0，负数变成 -0（FP16 里 -1e-9 → -0）；次正规数的间隔固定（FP16 是 2^-24），"
        f"所以 1e-7 → {y[('FP16', 1e-7)]:.6g}，相对误差 {abs(y[('FP16', 1e-7)] - 1e-7) / 1e-7:.1%}，远大于正规数的 ε/2。",
        f"BF16 的 1e38 → {y[('BF16', 1e38)]:.6g}（不溢出），π → {y[('BF16', np.pi)]:.10g}：范围够、精度粗。",
    ])
    return {"cases": res, "by_case": y}


# ---------------------------------------------------------------------------
# 演示 4：位串
# ---------------------------------------------------------------------------
def demo4_encode_bits():
    print_header("演示 4：几个数在各格式里的位串（符号.指数.尾数；先用 round_to 舍入，变了的写出舍入后的值）")
    values = [1.0, -2.5, 0.1, 448.0, 6.0, -0.0]
    fmts = (FP32, FP16, BF16, FP8_E4M3, FP8_E5M2, FP4_E2M1)
    rows, res = [], {}
    for v in values:
        cells = [f"{v:g}" if not (v == 0 and np.signbit(v)) else "-0"]
        for f in fmts:
            r = float(round_to(v, f))
            b = bits_str(r, f)
            res[(f.name, v)] = {"rounded": r, "bits": b}
            cells.append(b if r == v else f"{b} = {r:.9g}" if f.bits > 16 or f is BF16 else f"{b} = {r:.6g}")
        rows.append(cells)
    # 一张表放不下 100 列：FP32 和 BF16（同样的 8 位指数）一张，其余四种一张
    wide = (0, 1, 3)                                    # 值、FP32、BF16 在 cells 里的下标
    print_table(["值", "FP32", "BF16"], [[row[i] for i in wide] for row in rows])
    print()
    print_table(["值"] + [f.name for f in fmts if f not in (FP32, BF16)],
                [[row[0]] + [c for f, c in zip(fmts, row[1:]) if f not in (FP32, BF16)] for row in rows])
    specials = {"FP16 最小次正规数": bits_str(FP16.min_subnormal, FP16), "FP16 最大值": bits_str(FP16.max_value, FP16),
                "FP16 +inf": bits_str(np.inf, FP16), "E4M3 最小次正规数": bits_str(FP8_E4M3.min_subnormal, FP8_E4M3),
                "E4M3 最大值": bits_str(FP8_E4M3.max_value, FP8_E4M3), "E4M3 NaN": bits_str(np.nan, FP8_E4M3),
                "E5M2 最大值": bits_str(FP8_E5M2.max_value, FP8_E5M2), "E2M1 最小次正规数": bits_str(0.5, FP4_E2M1)}
    print()
    print_table(["特殊值", "位串"], [[k, v] for k, v in specials.items()])
    # BF16 的符号和指数位和 FP32 一样（同一个偏置 127）
    same_exp = all(res[("BF16", v)]["bits"].split(".")[:2] == res[("FP32", v)]["bits"].split(".")[:2] for v in values)
    fp32_01 = res[("FP32", 0.1)]["bits"].split(".")[2]
    bf16_01 = res[("BF16", 0.1)]["bits"].split(".")[2]
    rounded_up = int(bf16_01, 2) > int(fp32_01[:7], 2)
    print_observations([
        f"BF16 的符号位和 8 位指数和 FP32 完全一样（上表每一行都" + ("是" if same_exp else "不是") + "），尾数只留前 7 位："
        f"0.1 在 FP32 里尾数是 {fp32_01}，BF16 是 {bf16_01}（前 7 位 {fp32_01[:7]}，后面是 {fp32_01[7:]}，"
        + ("超过一半，所以进位" if rounded_up else "不到一半，所以舍去") + "）。"
        "所以 FP32 → BF16 只需要对高 16 位做舍入，硬件上很便宜。",
        f"E4M3 的 448 是 {res[('FP8-E4M3', 448.0)]['bits']}：指数码全 1 仍是普通的数；而 FP16 的全 1 指数码是 inf 和 NaN"
        f"（+inf = {specials['FP16 +inf']}），FP16 的最大值用的是 11110 这个指数码（{specials['FP16 最大值']}）。",
        f"0.1 在任何二进制格式里都不能精确表示：FP16 存的是 {res[('FP16', 0.1)]['rounded']:.8g}，E4M3 是 "
        f"{res[('FP8-E4M3', 0.1)]['rounded']:.6g}，E2M1 里它直接变成 {res[('FP4-E2M1', 0.1)]['rounded']:g}（比 0.5 的一半还小）。",
        "-0 的位串只有符号位是 1。它和 +0 相等（-0 == 0），但 1/(-0) = -inf：舍入时保留符号是 IEEE 的规定。",
    ])
    return {"bits": res, "specials": specials, "bf16_same_sign_exp_as_fp32": same_exp, "bf16_01_rounded_up": rounded_up}


# ---------------------------------------------------------------------------
# 演示 5：相对精度
# ---------------------------------------------------------------------------
def demo5_relative_error():
    print_header(f"演示 5：相对精度——{N_RANDOM:,} 个正规数范围内的随机数（对数均匀），舍入的相对误差")
    rng = np.random.default_rng(SEED)
    rows, res = [], {}
    for f in FLOAT_FORMATS:
        # 对数均匀地落在 [最小正规数, 2^emax) 里，符号随机（rng.random() 反查）
        u = rng.random(N_RANDOM)
        x = np.exp2(f.emin + u * (f.emax - f.emin)) * np.where(rng.random(N_RANDOM) < 0.5, -1.0, 1.0)
        rel = np.abs(round_to(x, f) - x) / np.abs(x)
        res[f.name] = {"max_rel": float(rel.max()), "mean_rel": float(rel.mean()), "half_eps": f.epsilon / 2,
                       "ratio": float(rel.max() / (f.epsilon / 2)),
                       "digits": float((f.man_bits + 1) * np.log10(2))}
        res[f.name]["mean_ratio"] = float(rel.mean() / (f.epsilon / 2))
        res[f.name]["sup"] = (f.epsilon / 2) / (1 + f.epsilon / 2)
        rows.append([f.name, f.man_bits, f"{f.epsilon / 2:.3g}", f"{res[f.name]['sup']:.3g}", f"{rel.max():.3g}",
                     f"{rel.max() / (f.epsilon / 2):.4f}",
                     f"{rel.mean():.3g}", f"{res[f.name]['mean_ratio']:.2f}", f"{res[f.name]['digits']:.1f}"])
    print("误差都是相对误差；十进制位数 = log10(2^(尾数位+1))")
    print_table(["格式", "尾数位", "ε/2\n（界）", "上确界\n(ε/2)/(1+ε/2)", "实测\n最大", "最大\n/ (ε/2)", "实测\n平均",
                 "平均\n/ (ε/2)", "十进制\n位数"], rows)
    worst = max(r["ratio"] for r in res.values())
    mean_ratios = [r["mean_rel"] / r["half_eps"] for r in res.values()]
    lo, hi = min(mean_ratios), max(mean_ratios)
    gap_name = max(res, key=lambda k: abs(res[k]["max_rel"] / res[k]["sup"] - 1))
    gap_sup = abs(res[gap_name]["max_rel"] / res[gap_name]["sup"] - 1)
    print_observations([
        f"每种格式实测的最大相对误差都不超过 ε/2 = 2^-(尾数位+1)（最大 / (ε/2) 最多 {worst:.4f}）。精确的上确界是 "
        f"(ε/2)/(1 + ε/2)，在 1 + ε/2 这样的平局点取到：实测的最大值和它最多差 {gap_sup:.2%}（{gap_name}：{res[gap_name]['max_rel']:.4g} vs "
        f"{res[gap_name]['sup']:.4g}；尾数位越多，随机数越难正好碰到平局点）。正规数范围里相对误差只由尾数位数决定，和数的大小无关——这就是\"相对精度\"。",
        f"平均相对误差约是界的 {lo:.0%}–{hi:.0%}（FP16：{res['FP16']['mean_rel']:.3g} vs {res['FP16']['half_eps']:.3g}）；"
        f"对数均匀分布下的理论值是 1/(4 ln 2) = {1 / (4 * np.log(2)):.3f} 倍。"
        f"FP8-E4M3 每次舍入平均相差 {res['FP8-E4M3']['mean_rel']:.1%}，E2M1 是 {res['FP4-E2M1']['mean_rel']:.1%}——"
        "低位格式的误差就是量化误差的来源（第 3 讲）。",
        "次正规数范围不在这个界里（演示 3 的 1e-7）：那里间隔固定，越小的数相对误差越大。",
    ])
    return res


if __name__ == "__main__":
    demo1_layouts()
    demo2_small_formats_enumerated()
    demo3_rounding_edges()
    demo4_encode_bits()
    demo5_relative_error()
