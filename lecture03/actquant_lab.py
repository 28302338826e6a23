"""
actquant_lab —— 量化矩阵乘的输入（激活）：每 token 的 INT4 / INT8、LLM.int8() 的混合精度分解，和插进 NumpyTransformer.matmul_hook 的钩子。

【钩子】transformer_lab.NumpyTransformer 的每次权重矩阵乘之前调用 matmul_hook(op, li, x)（op ∈ qkv、o_proj、gate_up、down、
lm_head），用它返回的 x' 去乘。模型为了快把 RMSNorm 的权重 g 和 √d 并进了后面的矩阵，所以 qkv、gate_up 的钩子收到的是
x / (rms(x)·√d)，不是矩阵乘"真正的输入"RMSNorm(x)·g。MatmulInputHook 先乘回每个通道的 c = √d·g（input_scales），
在真正的输入上量化（或记录），再除回去：(Q(x·c) / c) @ (c·W) = Q(x·c) @ W。o_proj、down 的输入就是真正的输入（c = 1）。
lm_head 不量化（和第 3 讲 07 一样：只量化每层的 7 个矩阵）。

【每 token 的对称量化】（QuaRot 的激活量化：每个 token 一个 scale）x' = round(x / s)·s，s = max|x_行| / qmax 存成 FP16
（numfmt.quantize_int 的做法），qmax = 7（INT4）或 127（INT8），就近舍入到偶数（np.round）。QuaRot 还把 scale 乘一个
裁剪系数（0.9）；这里不裁剪。
【LLM.int8()】（Dettmers et al. 2022，arXiv 2208.07339，§3.2）X·W = Σ_{h∈O} X_h W_h（16 位）+ Σ_{h∉O} Q8(X_h) Q8(W_h)：
O = 有任何一个 |x| ≥ 阈值 α 的那些特征维（输入通道），论文和 bitsandbytes 用 α = 6.0（transformers 的
BitsAndBytesConfig.llm_int8_threshold 默认 6.0）。其余的维每 token 一个 INT8 scale（在 O 之外的维上取最大），
权重每个输出通道一个 INT8 scale（"vector-wise"）。这里的 16 位：O 的那几列舍入到 FP16；权重全部是 INT8（bitsandbytes 的
Linear8bitLt 在 has_fp16_weights=False 时也是这样：16 位的那部分用反量化的 INT8 权重）。O 每次矩阵乘按这一批 token 重新找。
"""
import os
import sys

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
for _sub in ("prereq3", "lecture02"):
    _p = os.path.join(_HERE, "..", _sub)
    if _p not in sys.path:
        sys.path.insert(0, _p)

from numfmt import FP16, quantize_int, round_to  # noqa: E402

__all__ = ["QUANT_OPS", "INT8_THRESHOLD", "quantize_per_token", "outlier_dims", "systematic_dims", "int8_decompose",
           "input_scales",
           "PerToken", "Int8Decomposition", "MatmulInputHook"]

QUANT_OPS = ("qkv", "o_proj", "gate_up", "down")    # 量化输入的矩阵乘（lm_head 不量化）
INT8_THRESHOLD = 6.0                                 # LLM.int8() 的离群阈值 α（论文 §3.2；模块说明）


def _rows(x):  # [..., k] -> [N, k] float64
    x = np.asarray(x, dtype=np.float64)
    if x.ndim < 1 or x.shape[-1] < 1:
        raise ValueError(f"激活必须是 [..., 通道数] 的数组（收到形状 {x.shape}）")
    return x.reshape(-1, x.shape[-1])


def quantize_per_token(x, bits):  # [..., k] -> [..., k]
    """
    每个 token（最后一维是通道）一个 scale 的对称整数量化再反量化 -> 同形状 float64。

    【推导】s = max|x_行| / qmax（存成 FP16），x' = clip(round(x / s), −qmax, qmax)·s；qmax = 7（bits = 4）或 127（8）。
    全 0 的行 scale = 0，结果是 0。【边界】bits 不是 4 或 8 抛 ValueError。
    """
    if bits not in (4, 8):
        raise ValueError(f"激活的位数只支持 4、8（收到 {bits!r}）")
    x = np.asarray(x, dtype=np.float64)
    r = _rows(x)
    return quantize_int(r.T, bits, "channel")[0].T.reshape(x.shape)


def outlier_dims(x, threshold=INT8_THRESHOLD):  # [..., k] -> [k] bool
    """LLM.int8() 的离群特征维：有任何一个 |x| ≥ threshold 的通道 -> 布尔数组 [k]。"""
    if not threshold > 0:
        raise ValueError(f"阈值必须 > 0（收到 {threshold!r}）")
    return np.abs(_rows(x)).max(axis=0) >= threshold


def systematic_dims(per_layer, threshold=INT8_THRESHOLD, min_layers=0.25, min_tokens=0.06):
    """
    LLM.int8() §4.1 的"系统性"离群特征维 -> 排好序的 list：同一维 |x| ≥ threshold 出现在至少 min_layers 的层里、
    并且（在任何一层）出现在至少 min_tokens 的位置上。

    【推导】论文的定义：特征 = 隐状态 X_l（l = 0..L）的某一维 h_i；只统计这样的 h_i：至少有一个 |x| ≥ 6，在至少 25% 的层里
    是同一维，并且出现在所有隐状态合起来至少 6% 的序列位置上。这里"位置"按行算：每层的输入是同一段文本的同样的行。
    【参数】per_layer：每层一个 [N, k] 数组（同样的 N 个位置、同样的 k 个通道）。
    【边界】各层的形状不同、或者是空的时抛 ValueError。
    """
    xs = [np.abs(_rows(x)) for x in per_layer]
    if not xs or any(x.shape != xs[0].shape for x in xs):
        raise ValueError("per_layer 必须是同样形状 [N, k] 的数组的非空列表")
    hit = np.stack([x >= threshold for x in xs])                # [层, N, k]
    layers = hit.any(axis=1).sum(axis=0)                        # 每一维在几层里出现
    tokens = hit.any(axis=0).sum(axis=0)                        # 每一维在几个位置上出现（任何一层）
    ok = (layers >= min_layers * len(xs)) & (tokens >= min_tokens * xs[0].shape[0])
    return [int(j) for j in np.flatnonzero(ok)]


def int8_decompose(x, threshold=INT8_THRESHOLD):  # [..., k] -> ([..., k], [k] bool)
    """
    LLM.int8() 的激活一侧 -> (x', O)：O（outlier_dims）的列舍入到 FP16，其余的列每 token 一个 INT8 scale 量化再反量化。

    【推导】每 token 的 scale 只在 O 之外的列上取最大（离群的列不撑大它）：先把 O 的列置 0 再量化，再把 O 的列放回去。
    【边界】没有离群维时就是 quantize_per_token(x, 8)。
    """
    x = np.asarray(x, dtype=np.float64)
    r = _rows(x)
    O = outlier_dims(r, threshold)
    out = quantize_int(np.where(O[None, :], 0.0, r).T, 8, "channel")[0].T
    out[:, O] = round_to(r[:, O], FP16)
    return out.reshape(x.shape), O


def input_scales(params, cfg):
    """
    钩子收到的 x 和矩阵乘真正的输入之间的每通道因子 -> {(op, 层): c [d]}：真正的输入 = x·c。

    【推导】NumpyTransformer 把 √d·g 并进了 qkv（g = attn_norm）和 gate_up（g = mlp_norm）的矩阵，钩子收到 x/(rms·√d)；
    乘 c = √d·g 就是 RMSNorm(x)·g（第 3 讲 07 的"注意力输入""FFN 输入"）。fold_norms 之后 g 全是 1，c = √d。
    """
    sd = np.sqrt(cfg.d_model)
    out = {}
    for li, L in enumerate(params["layers"]):
        out[("qkv", li)] = sd * np.asarray(L["attn_norm"], dtype=np.float64)
        out[("gate_up", li)] = sd * np.asarray(L["mlp_norm"], dtype=np.float64)
    return out


class PerToken:
    """每 token 的对称 INT-bits 量化（quantize_per_token）：MatmulInputHook 的 quant。"""

    def __init__(self, bits):
        quantize_per_token(np.zeros((1, 1)), bits)          # 检查 bits
        self.bits = bits

    def __call__(self, op, li, x):  # [N, k] -> [N, k]
        return quantize_per_token(x, self.bits)


class Int8Decomposition:
    """
    LLM.int8() 的激活一侧（int8_decompose）：MatmulInputHook 的 quant；log 记下每次矩阵乘的 (op, 层, token 数, 通道数, |O|)。
    """

    def __init__(self, threshold=INT8_THRESHOLD):
        outlier_dims(np.zeros((1, 1)), threshold)           # 检查阈值
        self.threshold = threshold
        self.log = []

    def __call__(self, op, li, x):
        xq, O = int8_decompose(x, self.threshold)
        self.log.append((op, li, x.shape[0], x.shape[1], int(O.sum())))
        return xq


class MatmulInputHook:
    """
    NumpyTransformer.matmul_hook：对 QUANT_OPS 的输入先做在线旋转、再乘回真正的尺度、量化（或记录）、再除回去。

    【参数】scales：input_scales 的 dict（None：所有的 c = 1）；online：{op: 正交矩阵 H}，这个 op 的输入先乘 H
    （rotation_lab.rotate_down_input 把 Hᵀ 折进了 w_down 时用 {"down": H}；H 也可以是 rotation_lab.Kron）；quant：None（不量化）或 f(op, 层, x [N, k])
    -> [N, k]（PerToken、Int8Decomposition）；record：None 或一个 dict，{(op, 层): [真正的输入 [N, k], …]} 追加每次看到的输入
    （在线旋转之后、量化之前）。
    【边界】c 里为 0 的通道：真正的输入在那里是 0，除回去时给 0（不除）。lm_head 和不在 ops 里的矩阵乘原样通过。
    """

    def __init__(self, scales=None, online=None, quant=None, record=None, ops=QUANT_OPS):
        bad = set(ops) - set(QUANT_OPS)
        if bad:
            raise ValueError(f"ops 只能从 {', '.join(QUANT_OPS)} 里选（收到 {sorted(bad)}）")
        self.scales, self.online, self.quant, self.record, self.ops = scales or {}, online or {}, quant, record, ops

    def __call__(self, op, li, x):
        if op not in self.ops:
            return x
        shape = x.shape
        r = x.reshape(-1, shape[-1])
        if op in self.online:
            H = self.online[op]
            r = H.right(r) if hasattr(H, "right") else r @ H
        c = self.scales.get((op, li))
        xt = r * c if c is not None else r
        if self.record is not None:
            self.record.setdefault((op, li), []).append(np.array(xt, dtype=np.float64))
        if self.quant is None:
            return r.reshape(shape)
        xq = self.quant(op, li, xt)
        if c is not None:
            xq = np.divide(xq, c, out=np.zeros_like(xq), where=c != 0)
        return xq.astype(x.dtype, copy=False).reshape(shape)
