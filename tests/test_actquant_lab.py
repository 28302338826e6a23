"""
actquant_lab：每 token 的量化、LLM.int8() 的离群维和分解按手算核对；钩子把输入乘回真正的尺度再量化、再除回去，
用钩子量化的前向 == 一个照 Llama 的式子手写、在每个矩阵乘的输入上量化的前向（第二种写法，不经过钩子）。
"""
import numpy as np
import pytest

from actquant_lab import (Int8Decomposition, MatmulInputHook, PerToken, input_scales, int8_decompose,
                          outlier_dims, quantize_per_token, systematic_dims)
from quant_lab import QCFG
from transformer_lab import NumpyTransformer, init_params


def fp16(x):
    return np.asarray(x, dtype=np.float64).astype(np.float16).astype(np.float64)


def test_per_token_int4_round_trip_by_hand():
    x = np.array([[1.0, -2.0, 3.5, 7.0], [0.0, 0.0, 0.0, 0.0], [0.1, 0.2, -0.7, 0.05]])
    got = quantize_per_token(x, 4)
    # 第 1 行 scale = 7/7 = 1：3.5 舍入到偶数 4
    assert list(got[0]) == [1.0, -2.0, 4.0, 7.0]
    assert list(got[1]) == [0.0, 0.0, 0.0, 0.0]
    s = fp16(0.7 / 7)                                    # 0.0999755859375
    assert s == 0.0999755859375
    # 0.1/s = 1.0002 → 1；0.2/s = 2.0005 → 2；−0.7/s = −7.0017 → 截到 −7；0.05/s = 0.50012 → 1
    assert np.array_equal(got[2], np.array([1, 2, -7, 1]) * s)


def test_per_token_int8_keeps_leading_dims_and_rejects_other_bits():
    x = np.random.default_rng(0).standard_normal((2, 3, 16))
    got = quantize_per_token(x, 8)
    s = fp16(np.abs(x).max(axis=-1, keepdims=True) / 127)
    assert got.shape == x.shape and np.array_equal(got, np.clip(np.round(x / s), -127, 127) * s)
    with pytest.raises(ValueError):
        quantize_per_token(x, 3)


def test_outlier_dims_by_hand():
    x = np.array([[1.0, 7.0, 0.5, -6.0], [-3.0, 2.0, 5.99, 0.0]])
    assert list(outlier_dims(x)) == [False, True, False, True]       # |x| ≥ 6：等于 6 也算
    assert list(outlier_dims(x, 5.5)) == [False, True, True, True]


def test_systematic_dims_by_hand():
    """8 层、50 个位置：第 0 维只在 1 层里（< 25%），第 1 维 2 层、3 个位置（≥ 25%、≥ 6%），第 2 维 4 层但只 1 个位置。"""
    layers = [np.zeros((50, 4)) for _ in range(8)]
    layers[0][0, 0] = 9
    layers[1][[0, 1], 1] = 7
    layers[5][2, 1] = -6
    for li in (1, 2, 3, 4):
        layers[li][10, 2] = 8
    assert systematic_dims(layers) == [1]
    assert systematic_dims(layers, min_tokens=0.02) == [1, 2]
    with pytest.raises(ValueError):
        systematic_dims([np.zeros((5, 4)), np.zeros((5, 3))])


def test_int8_decomposition_by_hand():
    x = np.array([[0.5, 10.0, -1.27], [2.54, -0.01, 1.0]])
    got, O = int8_decompose(x)
    assert list(O) == [False, True, False]
    assert np.array_equal(got[:, 1], fp16(x[:, 1]))                   # 离群的列：FP16
    # 其余的列每行一个 scale，只在非离群的列上取最大：第 0 行 1.27/127 = 0.01，第 1 行 2.54/127 = 0.02
    for r, amax in ((0, 1.27), (1, 2.54)):
        s = fp16(amax / 127)
        assert np.array_equal(got[r, [0, 2]], np.round(x[r, [0, 2]] / s) * s)
    # 不分解时第 0 行的 scale 被 10 撑大：0.5 的误差大得多
    plain = quantize_per_token(x, 8)
    assert abs(plain[0, 0] - 0.5) > 10 * abs(got[0, 0] - 0.5)


def test_hook_rescales_records_and_passes_other_ops_through():
    c = np.array([2.0, 0.0, 0.5])
    rec = {}
    hook = MatmulInputHook({("qkv", 0): c}, quant=lambda op, li, x: x + 1.0, record=rec)
    x = np.array([[[1.0, 3.0, 4.0]]])
    out = hook("qkv", 0, x)
    assert np.array_equal(rec[("qkv", 0)][0], [[2.0, 0.0, 2.0]])           # 真正的输入 = x·c
    assert np.array_equal(out, [[[1.5, 0.0, 6.0]]])                         # (x·c + 1)/c，c = 0 处给 0
    assert hook("lm_head", -1, x) is x
    with pytest.raises(ValueError):
        MatmulInputHook(ops=("qkv", "lm_head"))


def test_llm_int8_with_a_huge_threshold_is_plain_per_token_int8():
    P = init_params(QCFG, seed=0)
    toks = np.floor(np.random.default_rng(1).random((2, 16)) * QCFG.vocab).astype(np.int64)
    m = NumpyTransformer(P, QCFG)
    sc = input_scales(P, QCFG)
    m.matmul_hook = MatmulInputHook(sc, quant=PerToken(8))
    a = m.forward(toks)
    dec = Int8Decomposition(threshold=1e9)
    m.matmul_hook = MatmulInputHook(sc, quant=dec)
    assert np.array_equal(m.forward(toks), a)
    assert len(dec.log) == 4 * QCFG.n_layers and all(e[4] == 0 for e in dec.log)


def _rms(x, g, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * g


def hand_forward_quantized(P, cfg, toks, bits):
    """Llama 的式子照抄（Hugging Face 的 RoPE 写法），每个矩阵乘的输入（真正的输入）先每 token 量化：第二种写法。"""
    q = (lambda x: quantize_per_token(x, bits)) if bits else (lambda x: x)
    n = toks.shape[1]
    H, Hkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    half, G = hd // 2, cfg.n_heads // cfg.n_kv_heads
    ang = np.arange(n)[:, None] * (cfg.rope_theta ** (-np.arange(half) / half))[None, :]
    cos, sin = np.cos(ang), np.sin(ang)

    def rope(t):  # [B, h, n, hd]
        return np.concatenate([t[..., :half] * cos - t[..., half:] * sin, t[..., :half] * sin + t[..., half:] * cos], -1)

    x = P["embed"][toks]
    B = x.shape[0]
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for L in P["layers"]:
        h = q(_rms(x, L["attn_norm"], cfg.norm_eps))
        qh = rope((h @ L["wq"]).reshape(B, n, H, hd).transpose(0, 2, 1, 3))
        kh = rope((h @ L["wk"]).reshape(B, n, Hkv, hd).transpose(0, 2, 1, 3))
        vh = (h @ L["wv"]).reshape(B, n, Hkv, hd).transpose(0, 2, 1, 3)
        kh, vh = np.repeat(kh, G, axis=1), np.repeat(vh, G, axis=1)
        s = qh @ kh.transpose(0, 1, 3, 2) / np.sqrt(hd) + mask
        p = np.exp(s - s.max(-1, keepdims=True))
        a = ((p / p.sum(-1, keepdims=True)) @ vh).transpose(0, 2, 1, 3).reshape(B, n, H * hd)
        x = x + q(a) @ L["wo"]
        h2 = q(_rms(x, L["mlp_norm"], cfg.norm_eps))
        g = h2 @ L["w_gate"]
        x = x + q(g / (1 + np.exp(-g)) * (h2 @ L["w_up"])) @ L["w_down"]
    return _rms(x, P["final_norm"], cfg.norm_eps) @ P["lm_head"]


@pytest.mark.parametrize("bits", [None, 8, 4])
def test_hook_quantized_forward_equals_a_hand_written_quantized_forward(bits):
    """
    norm 的权重随机（不是 1）：钩子必须乘回 √d·g 才是真正的输入。float64 两种写法的激活只差 ~1e-15（相对）；
    量化把恰在刻度正中的数舍到两边的概率 ~ 每个数 1e-14，这里几万个数，几乎不会发生：断言 logits 差 < 1e-9。
    """
    P = init_params(QCFG, seed=0)
    rng = np.random.default_rng(2)
    for L in P["layers"]:
        L["attn_norm"], L["mlp_norm"] = rng.uniform(0.3, 3, QCFG.d_model), rng.uniform(0.3, 3, QCFG.d_model)
    P["final_norm"] = rng.uniform(0.3, 3, QCFG.d_model)
    toks = np.floor(np.random.default_rng(3).random((2, 24)) * QCFG.vocab).astype(np.int64)
    m = NumpyTransformer(P, QCFG)
    if bits:
        m.matmul_hook = MatmulInputHook(input_scales(P, QCFG), quant=PerToken(bits))
    ours = m.forward(toks)
    hand = hand_forward_quantized(P, QCFG, toks, bits)
    assert np.abs(ours - hand).max() < 1e-9
    if bits == 4:   # 量化真的起了作用
        assert np.abs(ours - hand_forward_quantized(P, QCFG, toks, None)).max() > 1e-2
