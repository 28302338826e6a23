"""
numfmt —— 数的格式：浮点格式的位布局与舍入、对称整数量化（每张量 / 每通道 / 分组）、MX 块格式。

【浮点格式】FloatFormat 描述 1 位符号 + e 位指数 + m 位尾数的格式（偏置 2^(e−1) − 1，有次正规数）：
- FP32、FP16、BF16、FP8-E5M2：IEEE 风格，最大的指数码留给 inf / NaN；**溢出变成 ±inf**（和 IEEE 一样：
  舍入后超过最大有限值就是 inf，包括正好在最大值和下一个"虚拟"值中间、按偶数规则进位的情况）。
- FP8-E4M3（OCP 的 "FN" 版本）：没有 inf，只有 S.1111.111 是 NaN，所以最大值是 1.75 × 2⁸ = 448；
  FP4-E2M1：没有 inf 也没有 NaN，最大值 6。numfmt 让这两种**饱和**：超出范围的值（包括 ±inf）变成 ±最大有限值。
  对 E2M1 这是唯一的办法（没有别的码）；对 E4M3 是转换的选择，不是格式的性质：OCP OFP8 v1.0 允许饱和或不饱和
  （变 NaN），库各不相同——ml_dtypes 的转换溢出给 NaN（jax-ml/ml_dtypes#260），PyTorch 的 eager 转换原来
  也给 NaN、Triton 里饱和（pytorch/ao#1912），2026 年的 nightly 改成饱和（pytorch/ao#4359）。
- 舍入：就近舍入，一样近时取偶数（round to nearest, ties to even）。np.round 正是"取偶"的规则。
  负零保留符号（-0.0 仍是 -0.0；很小的负数下溢成 -0.0）。NaN 进 NaN 出。

【整数量化】对称：scale = max|w| / qmax（int8 的 qmax = 127，int4 的 qmax = 7，int3 的 qmax = 3），q = clip(round(w / scale))，
反量化 w' = q · scale。scale 存成 FP16（所以 scale 本身也先舍入到 FP16）。粒度：
- "tensor"：整个矩阵一个 scale；"channel"：每个输出通道（权重 [输入维, 输出维] 的每一列）一个；
- "group"：每个输出通道里沿输入维每 group 个数一个。全为 0 的组 scale = 0，反量化也是 0（不做除法）。
非对称（quantize_int_asym）：每组再加一个整数零点，把 2^bits 个刻度对到组的 [最小值, 最大值] 上；
int4 每 32 个一组、FP16 scale + 4 位零点 = 4 + 20/32 = 4.625 位。

【MX 块格式】（OCP Microscaling 规范 v1.0）每 32 个数共享一个 E8M0 的 scale（8 位，只有指数，值是 2 的幂）：
X = 2^(⌊log₂ max|v|⌋ − emax_elem)，emax_elem 是元素格式最大正规数的指数（E2M1 是 2，E4M3 是 8）；
元素 = round_to(v / X, 元素格式)（饱和）。MXFP4 = E2M1 元素：每个数 4 + 8/32 = **4.25 位**；MXFP8 = E4M3：8.25 位。

【NVFP4】（NVIDIA Blackwell 的 4 位格式）E2M1 元素，每 16 个数一个 **E4M3** scale（不只是 2 的幂，所以块的最大值
能对得更准），整个张量再一个 FP32 scale：每个数 4 + 8/16 = **4.5 位**（张量 scale 摊到全部数上，可以忽略）。

【NF4】（QLoRA 的 4 位 NormalFloat，Dettmers et al. 2023，arXiv 2305.14314 §3 和附录 E）16 个不等间距的值，按
N(0, 1) 的分位数取、再缩到 [−1, 1]（负的一侧 7 个、正的一侧 8 个，含一个精确的 0）；元素是"最近的那个值的下标"，
块的 absmax 是 scale。数值见 NF4_LEVELS。

【每个数占几位】bits_per_value 把 scale 算进去：int4 每组 32 个一个 FP16 scale = 4 + 16/32 = 4.5 位。
"""
import math
from dataclasses import dataclass

import numpy as np

__all__ = ["FloatFormat", "FP32", "FP16", "BF16", "FP8_E4M3", "FP8_E5M2", "FP4_E2M1", "FLOAT_FORMATS",
           "round_to", "encode_bits", "quantize_int", "quantize_fp8", "quantize_mx", "quantize_nvfp4", "quantize_e2m1_fp16", "bits_per_value", "INT_QMAX",
           "quantize_int_asym", "NF4_LEVELS", "quantize_nf4_fp16"]


@dataclass(frozen=True)
class FloatFormat:
    """1 位符号 + exp_bits 位指数 + man_bits 位尾数的二进制浮点格式。"""
    name: str
    exp_bits: int
    man_bits: int
    has_inf: bool          # True：IEEE 风格（最大指数码是 inf/NaN，溢出成 inf）；False：饱和
    nan_in_top: bool = False  # E4M3：最大指数码里只有尾数全 1 是 NaN

    @property
    def bits(self):
        return 1 + self.exp_bits + self.man_bits

    @property
    def bias(self):
        return 2 ** (self.exp_bits - 1) - 1

    @property
    def emin(self):
        """最小正规数的指数（= 1 − bias）。"""
        return 1 - self.bias

    @property
    def emax(self):
        """最大有限数的指数。"""
        top = 2 ** self.exp_bits - 1          # 最大的指数码
        return (top - 1 if self.has_inf else top) - self.bias

    @property
    def max_value(self):
        """最大有限值。"""
        m = self.man_bits
        if self.has_inf or not self.nan_in_top:
            frac = 2 - 2.0 ** -m              # 尾数全 1
        else:
            frac = 2 - 2.0 ** (1 - m)         # 尾数全 1 是 NaN，只能到 1.11…10
        return frac * 2.0 ** self.emax

    @property
    def min_normal(self):
        return 2.0 ** self.emin

    @property
    def min_subnormal(self):
        return 2.0 ** (self.emin - self.man_bits)

    @property
    def epsilon(self):
        """相对精度：1 和比 1 大的下一个数之差 = 2^(−尾数位数)。就近舍入的相对误差最多是它的一半。"""
        return 2.0 ** -self.man_bits


FP32 = FloatFormat("FP32", 8, 23, True)
FP16 = FloatFormat("FP16", 5, 10, True)
BF16 = FloatFormat("BF16", 8, 7, True)
FP8_E5M2 = FloatFormat("FP8-E5M2", 5, 2, True)
FP8_E4M3 = FloatFormat("FP8-E4M3", 4, 3, False, nan_in_top=True)
FP4_E2M1 = FloatFormat("FP4-E2M1", 2, 1, False)
FLOAT_FORMATS = (FP32, FP16, BF16, FP8_E4M3, FP8_E5M2, FP4_E2M1)


def round_to(x, fmt):
    """
    把 float64 数组 x 舍入到格式 fmt 能表示的最近的值（仍用 float64 存）-> 同形状数组。

    【推导】|x| 的指数 e = max(⌊log₂|x|⌋, emin)，这一段相邻两个可表示数的间隔（量子）是 2^(e − 尾数位数)；
    x / 量子 是精确的（除以 2 的幂），np.round 就近取偶，再乘回量子。次正规数区间量子固定为 2^(emin − m)。
    【边界】超出最大有限值：IEEE 风格的格式变 ±inf，饱和格式变 ±最大值；±inf 输入同理；NaN 原样；−0.0 保留。
    """
    x = np.asarray(x, dtype=np.float64)
    out = np.array(x, dtype=np.float64, copy=True)
    finite = np.isfinite(x) & (x != 0)
    if np.any(finite):
        v = x[finite]
        e = np.maximum(np.floor(np.log2(np.abs(v))), fmt.emin)
        quantum = np.exp2(e - fmt.man_bits)
        r = np.round(v / quantum) * quantum
        r = np.where(r == 0, np.copysign(0.0, v), r)      # 下溢到 0 时保留符号
        out[finite] = r
    over = np.abs(out) > fmt.max_value                     # 包括输入本来就是 ±inf
    if np.any(over):
        big = np.inf if fmt.has_inf else fmt.max_value
        out[over] = np.copysign(big, out[over])
    return out


def encode_bits(value, fmt):
    """
    一个（已经可以精确表示的）值在 fmt 里的位：返回 (符号位, 指数位串, 尾数位串)，例如 FP8-E4M3 的 448 →
    ("0", "1111", "110")。

    【边界】NaN：IEEE 风格返回指数全 1、尾数最高位 1；E4M3 返回 S.1111.111；E2M1 没有 NaN，抛 ValueError。
    value 不能精确表示时抛 ValueError（先用 round_to）。
    """
    v = float(value)
    E, M = fmt.exp_bits, fmt.man_bits
    if math.isnan(v):
        if not (fmt.has_inf or fmt.nan_in_top):
            raise ValueError(f"{fmt.name} 没有 NaN")
        man = "1" * M if fmt.nan_in_top else "1" + "0" * (M - 1)
        return "0", "1" * E, man
    sign = "1" if math.copysign(1.0, v) < 0 else "0"
    a = abs(v)
    if math.isinf(a):
        if not fmt.has_inf:
            raise ValueError(f"{fmt.name} 没有 inf（它饱和到 ±{fmt.max_value:g}）")
        return sign, "1" * E, "0" * M
    if float(round_to(a, fmt)) != a:
        raise ValueError(f"{v!r} 不能用 {fmt.name} 精确表示；先用 round_to 舍入")
    if a == 0:
        return sign, "0" * E, "0" * M
    e = max(math.floor(math.log2(a)), fmt.emin)
    if a < fmt.min_normal:                                  # 次正规数：指数码 0，尾数 = a / 最小次正规数
        return sign, "0" * E, format(int(round(a / fmt.min_subnormal)), f"0{M}b")
    frac = int(round((a / 2.0 ** e - 1) * 2 ** M))
    return sign, format(e + fmt.bias, f"0{E}b"), format(frac, f"0{M}b") if M else ""


INT_QMAX = {8: 127, 4: 7, 3: 3}


def quantize_int(w, bits, granularity="channel", group=None):
    """
    对称整数量化再反量化：w 形状 [输入维, 输出维]（权重矩阵）-> (w', scale)。

    【参数】bits：8、4 或 3（INT3 的 qmax = 3：7 个值 −3..3）；granularity："tensor"、"channel"（每列一个 scale）、"group"（每列里沿输入维每 group 个一个）。
    【边界】group 不整除输入维时抛 ValueError；全 0 的组 scale = 0，反量化结果也是 0；scale 舍入到 FP16
    （比 FP16 最小次正规数还小的 scale 取那个次正规数；max|w| / qmax 超过 FP16 的最大值 65504 抛 ValueError）。
    """
    if bits not in INT_QMAX:
        raise ValueError(f"整数量化只支持 {'、'.join(str(b) for b in INT_QMAX)} 位（收到 {bits}）")
    w = np.asarray(w, dtype=np.float64)
    if w.ndim != 2:
        raise ValueError(f"权重必须是二维 [输入维, 输出维]（收到形状 {w.shape}）")
    qmax = INT_QMAX[bits]
    n_in, n_out = w.shape
    # 按组的形状看 w（不转置、不复制）：[组数, 每组几个, 列数]，每个 (组, 列) 一个 scale
    if granularity == "tensor":
        blocks = w.reshape(1, n_in * n_out, 1)
    elif granularity == "channel":
        blocks = w.reshape(1, n_in, n_out)                   # 每列（一个输出通道）一个 scale
    elif granularity == "group":
        if not group or n_in % group:
            raise ValueError(f"分组大小 {group} 必须整除输入维 {n_in}")
        blocks = w.reshape(n_in // group, group, n_out)      # 每列里沿输入维每 group 个一组
    else:
        raise ValueError(f"未知的粒度 {granularity!r}；可用：tensor、channel、group")
    amax = np.abs(blocks).max(axis=1, keepdims=True)         # [组数, 1, 列数]
    if amax.max() / qmax > FP16.max_value:
        raise ValueError(f"max|w| = {amax.max():.3g} 太大：scale = max|w| / {qmax} 超过 FP16 的最大值 {FP16.max_value:g}")
    # scale 存成 FP16：太小的 scale 会下溢成 0，那时取 FP16 最小的次正规数（全 0 的组 scale 仍是 0）
    scale = np.where(amax > 0, np.maximum(round_to(amax / qmax, FP16), FP16.min_subnormal), 0.0)
    safe = np.where(scale > 0, scale, 1.0)
    q = np.divide(blocks, safe)                              # 逐元素：和先转置再算的结果一位不差，只是少几份拷贝
    np.round(q, out=q)
    np.clip(q, -qmax, qmax, out=q)
    q *= scale                                               # scale = 0 的组：q·0 = ±0（q 有限）
    q += 0.0                                                 # −0.0 + 0.0 = +0.0：全 0 的组和原来一样是 +0
    deq = q.reshape(n_in, n_out)
    if granularity == "tensor":
        return deq, scale.reshape(1)
    if granularity == "channel":
        return deq, scale.reshape(n_out)
    return deq, scale[:, 0, :].T.copy()                      # [列数, 组数]


def quantize_int_asym(w, bits, group):
    """
    非对称整数量化（每组一个 FP16 scale 和一个 bits 位的零点）再反量化：w [输入维, 输出维] -> (w', scale, zero)。

    【推导】每列里沿输入维每 group 个数一组，组的最小值 lo、最大值 hi（区间总包含 0：lo ≤ 0 ≤ hi）；
    scale = (hi − lo) / (2^bits − 1)，舍入到 FP16；零点 z = clip(round(−lo / scale), 0, 2^bits − 1)（一个 bits 位的整数）；
    q = clip(round(w / scale) + z, 0, 2^bits − 1)，w' = (q − z) · scale。对称量化的 2^bits − 1 个值以 0 为中心，
    一组数全是正的（或偏向一边）时浪费一半；零点把 2^bits 个刻度对到 [lo, hi] 上。
    【参数】bits：8、4 或 3；group 必须整除输入维（group = 输入维即每通道）。
    【边界】全 0 的组 scale = 0、反量化为 0；scale 太小时取 FP16 最小的次正规数（同 quantize_int）。
    """
    if bits not in INT_QMAX:
        raise ValueError(f"整数量化只支持 {'、'.join(str(b) for b in INT_QMAX)} 位（收到 {bits}）")
    w = np.asarray(w, dtype=np.float64)
    if w.ndim != 2:
        raise ValueError(f"权重必须是二维 [输入维, 输出维]（收到形状 {w.shape}）")
    n_in, n_out = w.shape
    if not group or n_in % group:
        raise ValueError(f"分组大小 {group} 必须整除输入维 {n_in}")
    levels = 2 ** bits - 1
    blocks = w.T.reshape(n_out * (n_in // group), group)
    lo = np.minimum(blocks.min(axis=1, keepdims=True), 0.0)
    hi = np.maximum(blocks.max(axis=1, keepdims=True), 0.0)
    span = hi - lo
    if span.max() / levels > FP16.max_value:
        raise ValueError(f"组的范围 {span.max():.3g} 太大：scale 超过 FP16 的最大值 {FP16.max_value:g}")
    scale = np.where(span > 0, np.maximum(round_to(span / levels, FP16), FP16.min_subnormal), 0.0)
    safe = np.where(scale > 0, scale, 1.0)
    zero = np.clip(np.round(-lo / safe), 0, levels)
    q = np.clip(np.round(blocks / safe) + zero, 0, levels)
    deq = np.where(scale > 0, (q - zero) * scale, 0.0)
    shape = (n_out, n_in // group)
    return deq.reshape(n_out, n_in).T.copy(), scale.reshape(shape), zero.reshape(shape)


def quantize_fp8(w, elem=None):
    """
    FP8 权重量化再反量化：w [输入维, 输出维]，每个输出通道（列）一个 FP32 scale，把这一列的 max|w| 对到 E4M3 的最大值 448
    -> (w', scale)。

    【推导】scale = round_to(max|w| / 448, FP32)；元素 = round_to(w / scale, E4M3)（超出的饱和）；w' = 元素 × scale。
    【边界】全 0 的列 scale 记 1、元素全 0。
    """
    elem = FP8_E4M3 if elem is None else elem
    w = np.asarray(w, dtype=np.float64)
    amax = np.abs(w).max(axis=0, keepdims=True)
    scale = np.where(amax > 0, round_to(amax / elem.max_value, FP32), 1.0)
    return round_to(w / scale, elem) * scale, scale.reshape(-1)


def quantize_mx(w, elem=FP4_E2M1, block=32):
    """
    MX 块格式量化再反量化：w [输入维, 输出维]，每列里沿输入维每 block 个数共享一个 E8M0 scale -> (w', scale)。

    【推导】X = 2^(⌊log₂ max|v|⌋ − emax_elem)（OCP MX v1.0 §6.3）；元素 = round_to(v / X, elem)，超出的饱和。
    【边界】block 不整除输入维时抛 ValueError；全 0 的块元素全 0（scale 取 2^(−emax_elem)，无所谓）；
    scale 的指数夹在 E8M0 的范围 −127..127 里（极小或极大的块会因此被截断或饱和）。
    """
    w = np.asarray(w, dtype=np.float64)
    n_in, n_out = w.shape
    if block < 1 or n_in % block:
        raise ValueError(f"MX 块大小 {block} 必须是正整数并整除输入维 {n_in}")
    blocks = w.T.reshape(n_out * (n_in // block), block)
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    safe = np.where(amax > 0, amax, 1.0)
    # E8M0 只能表示 2^−127 .. 2^127：指数夹在这个范围里
    scale = np.exp2(np.clip(np.floor(np.log2(safe)) - elem.emax, -127, 127))
    deq = round_to(blocks / scale, elem) * scale
    return deq.reshape(n_out, n_in).T.copy(), scale.reshape(n_out, n_in // block)


def quantize_nvfp4(w, block=16):
    """
    NVFP4 量化再反量化：w [输入维, 输出维]，每列里沿输入维每 block（默认 16）个数一个 E4M3 scale，整个张量一个 FP32 scale
    -> (w', block_scale × tensor_scale)。

    【推导】张量 scale s_t = round_to(max|w| / (448 × 6), FP32)（让块 scale 的最大值落在 E4M3 的最大值 448 上）；
    块 scale s_b = round_to(max|v| / 6 / s_t, E4M3)（块的最大值对到 E2M1 的最大值 6，scale 本身舍入到 E4M3）；
    元素 = round_to(v / (s_b · s_t), E2M1)，超出 ±6 的饱和（s_b 舍入到比精确值小时会发生）。
    【边界】block 不整除输入维时抛 ValueError；全 0 的张量或块元素全 0。块 scale 比 E4M3 的最小次正规数 2⁻⁹ 还小时
    舍入成 0，那一块反量化为 0（和真实的 E4M3 scale 一样：动态范围有限，这是这个格式的饱和 / 下溢行为）。
    """
    w = np.asarray(w, dtype=np.float64)
    if w.ndim != 2:
        raise ValueError(f"权重必须是二维 [输入维, 输出维]（收到形状 {w.shape}）")
    n_in, n_out = w.shape
    if block < 1 or n_in % block:
        raise ValueError(f"NVFP4 块大小 {block} 必须是正整数并整除输入维 {n_in}")
    amax_t = float(np.abs(w).max())
    if amax_t == 0:
        return np.zeros_like(w), np.zeros((n_out, n_in // block))
    s_t = float(round_to(amax_t / (FP8_E4M3.max_value * FP4_E2M1.max_value), FP32))
    blocks = w.T.reshape(n_out * (n_in // block), block)
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    s_b = round_to(amax / FP4_E2M1.max_value / s_t, FP8_E4M3)
    scale = s_b * s_t
    safe = np.where(scale > 0, scale, 1.0)
    deq = np.where(scale > 0, round_to(blocks / safe, FP4_E2M1) * scale, 0.0)
    return deq.reshape(n_out, n_in).T.copy(), scale.reshape(n_out, n_in // block)


def quantize_e2m1_fp16(w, group=32):
    """
    对照方案：E2M1 元素 + 每组一个 FP16 scale（不是标准格式，只为把"网格"和"scale"分开比）-> (w', scale)。

    【推导】scale = round_to(max|v| / 6, FP16)（块的最大值对到 E2M1 的最大值 6），元素 = round_to(v / scale, E2M1)。
    每个数 4 + 16/32 = 4.5 位：和 INT4-g32（bits_per_value("int4", group=32)）的 scale 精度、个数都一样，只差网格
    （E2M1 不等间距，INT4 等间距的 -7…7）；和 MXFP4 只差 scale（FP16 vs 2 的幂的 E8M0）。
    【边界】group 不整除输入维时抛 ValueError；全 0 的组反量化为 0。
    """
    w = np.asarray(w, dtype=np.float64)
    n_in, n_out = w.shape
    if group < 1 or n_in % group:
        raise ValueError(f"分组大小 {group} 必须是正整数并整除输入维 {n_in}")
    blocks = w.T.reshape(-1, group)
    scale = round_to(np.abs(blocks).max(axis=1, keepdims=True) / FP4_E2M1.max_value, FP16)
    safe = np.where(scale > 0, scale, 1.0)
    deq = np.where(scale > 0, round_to(blocks / safe, FP4_E2M1) * scale, 0.0)
    return deq.reshape(n_out, n_in).T.copy(), scale.reshape(n_out, n_in // group)


# QLoRA 的 NF4 的 16 个值（arXiv 2305.14314 附录 E；和 bitsandbytes 的 bitsandbytes/functional.py 里
# get_4bit_type("nf4") 的表逐位相同）。这是抄来的事实：按论文的构造（N(0, 1) 在 0.9677083 到 0.5 之间等分的分位数，
# 正的一侧 8 个、负的一侧 7 个，加 0，再除以最大值）用 float64 重算，和表差不到 2e-7（表里是 float32 的值；测试核对）。
NF4_LEVELS = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0])


def quantize_nf4_fp16(w, group=32):
    """
    对照方案：NF4 元素 + 每组一个 FP16 的 absmax scale -> (w', scale)。

    【推导】scale = round_to(max|v|, FP16)（块的最大值对到 NF4 的 ±1），元素 = NF4_LEVELS 里离 v / scale 最近的值
    （用相邻两个值的中点做分界；正好落在中点上的取小的那个，概率为 0）。QLoRA 本身每 64 个一个 FP32 的 absmax
    （再做"双重量化"）；这里为了和 INT4-g32、E2M1-g32 同样是 4 + 16/32 = 4.5 位，用每 32 个一个 FP16 scale。
    【边界】group 不整除输入维时抛 ValueError；全 0 的组反量化为 0。
    """
    w = np.asarray(w, dtype=np.float64)
    n_in, n_out = w.shape
    if group < 1 or n_in % group:
        raise ValueError(f"分组大小 {group} 必须是正整数并整除输入维 {n_in}")
    blocks = w.T.reshape(-1, group)
    scale = round_to(np.abs(blocks).max(axis=1, keepdims=True), FP16)
    safe = np.where(scale > 0, scale, 1.0)
    mid = (NF4_LEVELS[1:] + NF4_LEVELS[:-1]) / 2
    idx = np.searchsorted(mid, blocks / safe, side="left")          # 0..15
    deq = np.where(scale > 0, NF4_LEVELS[idx] * scale, 0.0)
    return deq.reshape(n_out, n_in).T.copy(), scale.reshape(n_out, n_in // group)


def bits_per_value(kind, n_in=None, group=None):
    """
    每个权重平均占几位（**含 scale**）。

    【参数】kind："int8"/"int4"/"int3"（加 granularity 的 scale：每通道一个 FP16 scale 摊到 n_in 个数上；每组一个摊到
    group 个数上，给了 n_in 且不整除时最后一组不满也要一个 scale）、"fp8"（每通道一个 FP32 scale，摊到 n_in 个数上）、"mxfp4"（4 + 8/32 = 4.25）、"mxfp8"（8.25）、"nvfp4"（4 + 8/16 = 4.5）、"int4-zp"（每组 FP16 scale + 4 位零点：4 + 20/group）、
    或者一个浮点格式名（"bf16"、"fp16"：16）。
    """
    if kind == "int4-zp":  # 每组一个 FP16 scale 和一个 4 位零点
        if not group:
            raise ValueError("int4-zp 需要分组大小 group")
        return 4 + (16 + 4) / group
    if kind in ("int8", "int4", "int3"):
        b = int(kind[3:])
        if group and n_in:  # 按实际组数：一行 ⌈n_in / group⌉ 个 scale（最后一组不满也要一个）
            return b + 16 * math.ceil(n_in / group) / n_in
        if group:
            return b + 16 / group
        if not n_in:
            raise ValueError("每通道量化需要 n_in（一个 scale 摊到多少个数上）")
        return b + 16 / n_in
    if kind == "fp8":
        if not n_in:
            raise ValueError("fp8 每通道量化需要 n_in")
        return 8 + 32 / n_in
    if kind == "mxfp4":
        return 4 + 8 / 32
    if kind == "mxfp8":
        return 8 + 8 / 32
    if kind == "nvfp4":
        return 4 + 8 / 16
    if kind in ("bf16", "fp16"):
        return 16.0
    if kind == "fp32":
        return 32.0
    raise ValueError(f"未知的格式 {kind!r}；可用：int8、int4、int3、int4-zp、fp8、mxfp4、mxfp8、nvfp4、bf16、fp16、fp32")


# ===========================================================================
# GGUF 的块格式（llama.cpp / ggml）：Q8_0、Q4_0、Q4_1
# ===========================================================================
# 【来源】ggml 的 ggml-common.h（block_q8_0 / block_q4_0 / block_q4_1）、ggml-quants.c（quantize_row_*_ref、
# dequantize_row_*）；gguf-py 的 quants.py 用 numpy 复刻同样的公式。都是小端，每块 32 个数，块里依次是：
# - Q8_0：fp16 d，32 个 int8 q；w = d·q。34 字节 / 32 个 = 8.5 位。
#   编码：d = max|x| / 127，q = round(x / d)（C 的 roundf：一样近时远离 0，不是取偶）。
# - Q4_0：fp16 d，16 字节 4 位 q；w = d·(q − 8)。18 字节 / 32 = 4.5 位。
#   编码：取绝对值最大的那个数 x_max（带符号），d = x_max / −8，q = min(15, ⌊x / d + 8.5⌋)——最大的那个数落在
#   q = 0（−8·d = x_max），刻度是不对称的 −8…7。
# - Q4_1：fp16 d，fp16 m，16 字节 4 位 q；w = d·q + m。20 字节 / 32 = 5.0 位。
#   编码：m = 块的最小值，d = (最大值 − 最小值) / 15，q = min(15, ⌊(x − m) / d + 0.5⌋)。
# - 4 位的排法（Q4_0 和 Q4_1 一样）：第 j 个字节（j < 16）的**低** 4 位是第 j 个数，**高** 4 位是第 j + 16 个数
#   （不是相邻两个数拼一个字节）。
# - 解码在 float32 里算：d、m 从 fp16 变成 float32（gguf-py 和 ggml 的 C 代码都这样）。d 只有 11 位有效数字、q 最多
#   8 位，所以 d·q 在 float32 里是精确的，唯一的舍入是 Q4_1 的 "+ m"：结果就是精确的 d·q + m 舍入到 float32
#   （用不用 FMA 都一样）。
# 编码用的是参考实现的"就近取整"，不搜索最优的 d（llama.cpp 的 imatrix / K-quant 那些更好的编码不在这里）。
__all__ += ["GGUF_BLOCK", "GGUF_BLOCK_BYTES", "GGUF_BITS_PER_WEIGHT", "decode_blocks", "encode_blocks",
            "quantize_gguf"]

GGUF_BLOCK = 32
GGUF_BLOCK_BYTES = {"Q8_0": 2 + 32, "Q4_0": 2 + 16, "Q4_1": 2 + 2 + 16}
GGUF_BITS_PER_WEIGHT = {k: 8 * v / GGUF_BLOCK for k, v in GGUF_BLOCK_BYTES.items()}  # 8.5、4.5、5.0

# 一个字节 -> 它的低 4 位 / 高 4 位（float32），查表比先移位再转类型快
_NIB_LO = (np.arange(256) & 0x0F).astype(np.float32)
_NIB_HI = (np.arange(256) >> 4).astype(np.float32)


def _check_block_kind(kind):
    if kind not in GGUF_BLOCK_BYTES:
        raise ValueError(f"未知的 GGUF 块格式 {kind!r}；可用：{', '.join(GGUF_BLOCK_BYTES)}")
    return GGUF_BLOCK_BYTES[kind]


def _fp16_field(blocks, start):
    """每块第 start、start+1 字节上的 fp16 -> float32 的列 [n_blocks, 1]。"""
    return np.ascontiguousarray(blocks[:, start:start + 2]).view("<f2").astype(np.float32)


def decode_blocks(raw, kind):
    """
    把 GGUF 块格式的字节解码成权重 -> float32 的一维数组（n_blocks × 32 个数，按文件里的顺序）。

    【推导】见本节开头：Q8_0 w = d·q；Q4_0 w = d·(q − 8)；Q4_1 w = d·q + m；都在 float32 里算。
    【参数】raw：uint8 数组或 bytes（长度是块字节数的整数倍）；kind："Q8_0"、"Q4_0"、"Q4_1"。
    【边界】长度不是整块时抛 ValueError；空输入得到空数组。
    """
    nb = _check_block_kind(kind)
    raw = np.frombuffer(raw, dtype=np.uint8) if isinstance(raw, (bytes, bytearray)) else np.asarray(raw, np.uint8)
    raw = raw.reshape(-1)
    if raw.size % nb:
        raise ValueError(f"{kind} 每块 {nb} 字节，{raw.size} 字节不是整块")
    blocks = raw.reshape(-1, nb)                      # [n_blocks, nb]
    d = _fp16_field(blocks, 0)                         # [n_blocks, 1]
    if kind == "Q8_0":
        q = blocks[:, 2:].view(np.int8)                  # 同样 1 字节：直接把 uint8 看成 int8，不复制
        return np.multiply(q, d, dtype=np.float32).reshape(-1)
    qs = blocks[:, nb - 16:]                           # [n_blocks, 16]：第 j 字节 = 第 j 个（低 4 位）和第 j+16 个（高 4 位）
    out = np.empty((blocks.shape[0], GGUF_BLOCK), dtype=np.float32)
    out[:, :16] = _NIB_LO[qs]
    out[:, 16:] = _NIB_HI[qs]
    if kind == "Q4_0":
        out -= np.float32(8)
        out *= d
    else:  # Q4_1
        out *= d
        out += _fp16_field(blocks, 2)
    return out.reshape(-1)


def _roundf(x):
    """C 的 roundf：就近取整，一样近时远离 0（np.round 是取偶，不一样）。

    【边界】不能写成 floor(|x| + 0.5)：float32 里 0.49999997 + 0.5 舍入成 1.0，会错进一位；先取整数部分再比小数部分。
    """
    a = np.abs(x)
    whole = np.floor(a)
    return np.sign(x) * (whole + (a - whole >= 0.5))


def encode_blocks(w, kind):
    """
    把权重编码成 GGUF 块格式的字节 -> uint8 的一维数组（n_blocks × 块字节数），用 llama.cpp 参考实现的公式。

    【推导】见本节开头（Q8_0：d = max|x|/127；Q4_0：d = x_max/−8；Q4_1：d = (max − min)/15，m = min）。
    先把 w 转成 float32（llama.cpp 量化的是 float32 的行），按 C 顺序拉平，每 32 个一块。
    【边界】元素个数不是 32 的倍数时抛 ValueError；全 0 的块 d = 0、q 全 0（Q4_0 是 q = 8），解码回 0。
    """
    nb = _check_block_kind(kind)
    x = np.asarray(w, dtype=np.float32).reshape(-1)
    if x.size % GGUF_BLOCK:
        raise ValueError(f"{kind} 每块 {GGUF_BLOCK} 个数，{x.size} 个数不是整块")
    x = x.reshape(-1, GGUF_BLOCK)                      # [n_blocks, 32]
    out = np.empty((x.shape[0], nb), dtype=np.uint8)
    with np.errstate(divide="ignore"):
        if kind == "Q8_0":
            d = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
            inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
            q = _roundf(x * inv).astype(np.int8)
            out[:, 2:] = q.view(np.uint8)
        else:
            if kind == "Q4_0":
                xmax = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)
                d = xmax / np.float32(-8)
                inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
                q = np.floor(x.astype(np.float64) * inv + 8.5)   # 参考实现：(int8)(x·id + 8.5f)，截断
            else:
                lo = x.min(axis=1, keepdims=True)
                d = (x.max(axis=1, keepdims=True) - lo) / np.float32(15)
                inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
                q = np.floor((x - lo) * inv + np.float32(0.5))
                out[:, 2:4] = lo.astype("<f2").view(np.uint8)
            q = np.clip(q, 0, 15).astype(np.uint8)
            out[:, nb - 16:] = q[:, :16] | (q[:, 16:] << 4)
    out[:, 0:2] = d.astype("<f2").view(np.uint8)
    return out.reshape(-1)


def quantize_gguf(w, kind):
    """
    按 GGUF 的块格式量化再反量化 -> w'（float64，和 w 同形状），w 按课程的 [输入维, 输出维] 存。

    【推导】GGUF 的矩阵是 [out, in]，块沿输入维（连续的那一维）：所以对 w.T 的每一行每 32 个一块，
    encode_blocks 再 decode_blocks。每个数的位数见 GGUF_BITS_PER_WEIGHT（含 scale 和 min）。
    【边界】输入维不是 32 的倍数时抛 ValueError。
    """
    w = np.asarray(w, dtype=np.float64)
    n_in, n_out = w.shape
    if n_in % GGUF_BLOCK:
        raise ValueError(f"GGUF 的块是 {GGUF_BLOCK} 个数，输入维 {n_in} 必须是它的倍数")
    deq = decode_blocks(encode_blocks(w.T, kind), kind)
    return deq.astype(np.float64).reshape(n_out, n_in).T.copy()
