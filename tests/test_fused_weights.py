"""
transformer_lab.NumpyTransformer 构造时融合的权重（见类的【为了快做的等价变换】）：逐位等于照定义写的式子，并且不改动 params。

参照在这里按定义另写一遍：每个头内的列重排用循环写，RMSNorm 的权重 √d·g 乘进后面的矩阵，q 再除以 √head_dim，
lm_head 乘 √d·g_final。每个数和实验模块里一样都是同样的一两次 IEEE 乘除，所以要求逐位相同（不是近似）。
实验模块就地乘（out=）、lm_head 按 4096 列一段乘进连续的结果：这里的词表取 4096 的一倍多（最后一段不满），
词嵌入绑定和不绑定、float32 / float64、参数和配置的类型不一致（混合）都试。
"""
import math

import numpy as np
import pytest

from transformer_lab import LMConfig, NumpyTransformer, init_params


def _permute_heads(w, heads, hd):
    """每个头内：新的第 2i 列 = 原来的第 i 列，第 2i+1 列 = 原来的第 hd/2 + i 列（循环写，不用实验模块的 perm）。"""
    out = np.empty_like(w)
    for h in range(heads):
        for i in range(hd // 2):
            out[:, h * hd + 2 * i] = w[:, h * hd + i]
            out[:, h * hd + 2 * i + 1] = w[:, h * hd + hd // 2 + i]
    return out


def _reference(P, cfg):
    dt = np.dtype(cfg.dtype)
    sd, hd = math.sqrt(cfg.d_model), cfg.head_dim
    layers = []
    for L in P["layers"]:
        g1 = (sd * L["attn_norm"])[:, None]
        g2 = (sd * L["mlp_norm"])[:, None]
        wq = _permute_heads(L["wq"], cfg.n_heads, hd) / math.sqrt(hd)
        wk = _permute_heads(L["wk"], cfg.n_kv_heads, hd)
        qkv = np.hstack([g1 * wq, g1 * wk, g1 * L["wv"]]).astype(dt)
        gu = np.hstack([g2 * L["w_gate"], g2 * L["w_up"]]).astype(dt)
        layers.append((qkv, L["wo"].astype(dt), gu, L["w_down"].astype(dt)))
    head = ((sd * P["final_norm"])[:, None] * P["lm_head"]).astype(dt)
    return layers, head


def _params(cfg, variant):
    P = init_params(cfg, seed=3)
    P = {**P, "layers": [dict(L) for L in P["layers"]]}
    if variant == "float32 params":
        P = {k: ([{n: w.astype(np.float32) for n, w in L.items()} for L in v] if k == "layers" else v.astype(np.float32))
             for k, v in P.items()}
    elif variant == "mixed":          # 矩阵 float32、RMSNorm 的权重 float64：g·W 要升成 float64 再转 cfg.dtype
        for L in P["layers"]:
            for n in ("wq", "wk", "wv", "w_gate", "w_up"):
                L[n] = L[n].astype(np.float32)
        P["lm_head"] = P["lm_head"].astype(np.float32)
    if cfg.tied:
        P["lm_head"] = P["embed"].T   # 绑定：lm_head 是词嵌入的转置视图（real_model_lab 这样装）
    # 范数的权重不全是 1（init_params 给 1）：否则乘 g 看不出乘错了行
    rng = np.random.default_rng(4)
    for L in P["layers"]:
        L["attn_norm"] = (1 + 0.1 * rng.standard_normal(cfg.d_model)).astype(L["attn_norm"].dtype)
        L["mlp_norm"] = (1 + 0.1 * rng.standard_normal(cfg.d_model)).astype(L["mlp_norm"].dtype)
    P["final_norm"] = (1 + 0.1 * rng.standard_normal(cfg.d_model)).astype(P["final_norm"].dtype)
    return P


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("variant", ["as built", "float32 params", "mixed"])
def test_fused_weights_are_the_definition_bit_for_bit_and_params_are_untouched(tied, dtype, variant):
    cfg = LMConfig(vocab=4096 + 37, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=4, d_ff=24,
                   tied=tied, dtype=dtype)
    P = _params(cfg, variant)
    before = {id(a): a.copy() for a in [P["embed"], P["lm_head"], P["final_norm"]] + [w for L in P["layers"]
                                                                                        for w in L.values()]}
    m = NumpyTransformer(P, cfg)
    layers, head = _reference(P, cfg)
    for got, want in zip(m._layers, layers):
        for g, w in zip(got, want):
            assert g.dtype == np.dtype(dtype) and g.flags["C_CONTIGUOUS"] and np.array_equal(g, w)
    assert m._head.dtype == np.dtype(dtype) and m._head.flags["C_CONTIGUOUS"]
    assert np.array_equal(m._head, head)
    for a in [P["embed"], P["lm_head"], P["final_norm"]] + [w for L in P["layers"] for w in L.values()]:
        assert np.array_equal(a, before[id(a)]), "构造模型改动了 params 里的数组"
