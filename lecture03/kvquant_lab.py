"""
kvquant_lab —— KV cache 按"沿哪个方向分组"量化：每 token（K、V 都是）和 KIVI 的布局（K 每通道、V 每 token）-> 写入缓存时用的量化函数。

【KIVI 的布局】Liu et al. 2024（KIVI, arXiv 2402.02750）：K cache 有固定的离群通道（少数几个通道在所有 token 上都大），
V cache 没有；所以 K 按通道量化（一个通道里沿 token 每 G 个一组，一组一个 scale 和零点，离群通道自己一组，不拖累别的通道），
V 按 token 量化（一个 token 里沿通道每 G 个一组）。这里实现的是它的量化布局；论文还把最近的 R 个 token 留在全精度
（流式解码时凑不满一组的那些），这里不留：所有 token 都量化，序列末尾不满 G 个的那一组就小一点。
【整数格式】非对称（每组一个 FP16 scale 和一个 bits 位的整数零点；numfmt.quantize_int_asym）。每个数的位数
bits + (16 + bits) / G（scale 16 位 + 零点 bits 位，摊到一组的 G 个数上）。KIVI 自己的代码存得多一些：每组一个 scale
和一个最小值 mn，都用模型的 dtype（FP16），反量化是 q·scale + mn（jy-yuan/KIVI 的 quant/new_pack.py，
triton_quantize_and_pack_along_last_dim，提交 876b4d2）；它的 docs/long_bench.md 用每 32 个一组、最近 128 个 token
留在 FP16。按它的存法每个数 bits + 32 / G 位（kivi_code_bits、KIVI_CODE）。
【怎么用】kv_quantizer_layout(layout, bits, group) 返回一对函数 (K 的, V 的)：kvcache_lab.KVCache 只接受一个 quant
函数、K 和 V 都用它，所以用 kv_cache(cfg, batch, max_len, fk, fv) 造缓存（K、V 各用各的）。量化函数收到的块是
[..., token, head_dim]（KVCache 写入的 [批, KV 头, 新 token, head_dim]）：每 token 的布局只看最后一维；KIVI 的 K 沿
倒数第二维（一次写入的 token）分组——一次前向喂完整段文本时，一次写入就是整段。逐个 token 解码时一次只写一个 token，
每通道的分组就退化成每个数一组：那要像论文那样先把 token 攒满一组再量化，这里不做（第 3 讲 07 只做整段的前向）。
"""
import os
import sys

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
for _sub in ("prereq3", "lecture02"):
    _p = os.path.join(_HERE, "..", _sub)
    if _p not in sys.path:
        sys.path.insert(0, _p)

from numfmt import quantize_int_asym  # noqa: E402
from kvcache_lab import KVCache, quantizing_store  # noqa: E402

__all__ = ["LAYOUTS", "kv_layout_bits", "quantize_along", "kv_quantizer_layout", "kv_cache", "KIVI_CODE",
           "kivi_code_bits"]

LAYOUTS = ("token", "kivi")

# KIVI 的代码（jy-yuan/KIVI，提交 876b4d2）怎么存：quant/new_pack.py 的 scale、mn 和输入同一个 dtype（模型按
# torch.float16 装，example.py）；docs/long_bench.md："32 group size and 128 residual length"（KIVI-2 和 KIVI-4）。
KIVI_CODE = {"group": 32, "scale_bits": 16, "min_bits": 16, "residual_tokens": 128}


def kivi_code_bits(bits, group=KIVI_CODE["group"]):
    """按 KIVI 的代码的存法，量化了的 KV 每个数平均几位 -> bits + (16 + 16) / group（FP16 scale + FP16 最小值）。

    【边界】最近的 residual_tokens 个 token 留在 FP16，不在这个数里（它摊到每个数上多少取决于上下文长度）。
    """
    _check(bits, group)
    return bits + (KIVI_CODE["scale_bits"] + KIVI_CODE["min_bits"]) / group


def kv_layout_bits(bits, group):
    """非对称分组量化每个数平均占几位（含 FP16 scale 和 bits 位零点）-> bits + (16 + bits) / group。"""
    _check(bits, group)
    return bits + (16 + bits) / group


def _check(bits, group):
    if bits not in (3, 4, 8):
        raise ValueError(f"KV 的整数位数只支持 3、4、8（收到 {bits!r}）")
    if not (isinstance(group, (int, np.integer)) and not isinstance(group, bool) and group >= 1):
        raise ValueError(f"分组大小必须是正整数（收到 {group!r}）")


def quantize_along(x, axis, bits, group):  # [...] -> 同形状
    """
    沿 x 的第 axis 维每 group 个数一组做非对称量化再反量化 -> 同形状、同 dtype。

    【推导】把第 axis 维挪到最前、其余维摊平成列：[那一维, 其余] 正是 quantize_int_asym 的 [输入维, 输出维]
    （它沿输入维分组）。那一维不是 group 的整数倍时末尾补 0 再量化、量化完切掉：quantize_int_asym 的区间总包含 0
    （lo ≤ 0 ≤ hi），补的 0 不改变任何一组的 scale 和零点，末尾那一组就是一个小一点的组。
    【参数】bits：3、4、8；group ≥ 1。
    【边界】axis 越界、bits 或 group 不合规矩抛 ValueError。
    """
    _check(bits, group)
    x = np.asarray(x)
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis = {axis} 超出 {x.ndim} 维数组的范围")
    moved = np.moveaxis(x, axis, 0)
    n = moved.shape[0]
    flat = moved.reshape(n, -1).astype(np.float64)
    pad = (-n) % group
    if pad:
        flat = np.concatenate([flat, np.zeros((pad, flat.shape[1]))], axis=0)
    q = quantize_int_asym(flat, bits, group)[0][:n]
    return np.moveaxis(q.reshape(moved.shape), 0, axis).astype(x.dtype)


def kv_quantizer_layout(layout, bits=4, group=32):
    """
    KV cache 写入时用的一对量化函数 -> (K 的, V 的)，每个 f(块 [..., token, head_dim]) -> 同形状。

    【参数】layout："token"（K、V 都是每个 token 里沿 head_dim 每 group 个一组）或 "kivi"（K 每个通道里沿 token
    每 group 个一组，V 同 "token"）；bits、group 见 quantize_along。
    【边界】未知的 layout 抛 ValueError，列出可用的。
    """
    if layout not in LAYOUTS:
        raise ValueError(f"未知的 KV 量化布局 {layout!r}；可用：{', '.join(LAYOUTS)}")
    _check(bits, group)

    def per_token(x):
        return quantize_along(x, -1, bits, group)

    def per_channel(x):
        return quantize_along(x, -2, bits, group)

    return (per_channel if layout == "kivi" else per_token), per_token


def kv_cache(cfg, batch, max_len, quant_k, quant_v):
    """K 和 V 各用各的量化函数的 KVCache -> kvcache_lab.KVCache（quant_k / quant_v 为 None 的那个不量化）。"""
    cache = KVCache(cfg, batch, max_len)
    if quant_k is not None:
        cache.k = quantizing_store(cache.k, quant_k)
    if quant_v is not None:
        cache.v = quantizing_store(cache.v, quant_v)
    return cache
