"""
quant_lab 的激活量化、SmoothQuant 和 KV cache 量化（第 3 讲 06 用），以及 transformer_lab.KVCache 的 quant 选项。

核对：激活 INT8（每张量 / 每 token）和 KV 的每头 / 每组 INT 量化用只靠 numpy 的独立实现（np.float16 做 scale）；
E4M3 用手算的值；SmoothQuant 的 s 按论文式 (4) 手算、X·W 不变；量化的缓存里存的正好是量化后的值，
一次算完和逐个 token 写入结果相同；不给 quant 时缓存还是普通的 float64 数组。
"""
import numpy as np
import pytest

from quant_lab import (QCFG, kv_bits, kv_quantizer, quantize_activations, sample_tokens, smooth_scales,
                       w8a8_error)
from transformer_lab import NumpyTransformer, init_params
from kvcache_lab import KVCache


def fp16(x):
    return np.asarray(x, dtype=np.float64).astype(np.float16).astype(np.float64)


def int_rows(x, qmax):
    """每行一个 scale 的对称整数量化（scale 舍入到 FP16）。"""
    s = fp16(np.abs(x).max(axis=-1, keepdims=True) / qmax)
    return np.clip(np.round(x / s), -qmax, qmax) * s


def test_activation_int8_per_token_and_per_tensor():
    x = np.random.default_rng(0).standard_normal((10, 16)) * np.arange(1, 11)[:, None]
    assert np.array_equal(quantize_activations(x, "token"), int_rows(x, 127))
    assert np.array_equal(quantize_activations(x, "tensor"), int_rows(x.reshape(1, -1), 127).reshape(x.shape))
    with pytest.raises(ValueError, match="粒度"):
        quantize_activations(x, "channel")


def test_smooth_scales_formula_and_invariance():
    x = np.array([[1.0, -8.0], [0.5, 2.0]])
    w = np.array([[0.5, -0.25], [0.125, 0.0625]])
    s = smooth_scales(x, w, 0.5)
    assert np.allclose(s, [np.sqrt(1.0) / np.sqrt(0.5), np.sqrt(8.0) / np.sqrt(0.125)])
    assert np.allclose((x / s) @ (w * s[:, None]), x @ w)
    assert np.allclose(smooth_scales(x, w, 1.0), [1.0, 8.0])
    with pytest.raises(ValueError, match="α"):
        smooth_scales(x, w, 1.5)


def test_w8a8_error_matches_independent_computation():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 16))
    x[:, 3] *= 30.0
    w = rng.standard_normal((16, 8)) * 0.1
    wq = int_rows(w.T, 127).T
    y = x @ w
    assert w8a8_error(x, w, "token") == pytest.approx(np.linalg.norm(int_rows(x, 127) @ wq - y) / np.linalg.norm(y))
    s = np.abs(x).max(0) ** 0.5 / np.abs(w).max(1) ** 0.5
    want = int_rows(x / s, 127) @ int_rows((w * s[:, None]).T, 127).T
    assert w8a8_error(x, w, "tensor", 0.5) == pytest.approx(
        np.linalg.norm(int_rows((x / s).reshape(1, -1), 127).reshape(x.shape) @ int_rows((w * s[:, None]).T, 127).T - y)
        / np.linalg.norm(y))
    assert w8a8_error(x, w, "token", 0.5) == pytest.approx(np.linalg.norm(want - y) / np.linalg.norm(y))


def test_kv_quantizers_by_hand_and_independent():
    f8 = kv_quantizer("fp8-e4m3")
    # [1, 2) 里 E4M3 的间隔 1/8：1.0625 是 1 和 1.125 的中点，取尾数为偶的 1.0；1.07 → 1.125；0.3 → 0.3125（[0.25, 0.5) 间隔 1/32）
    assert list(f8(np.array([1.0625, 1.07, 0.3, -500.0]))) == [1.0, 1.125, 0.3125, -448.0]
    v = np.random.default_rng(2).standard_normal((2, 3, 5, 16))
    flat = v.reshape(-1, 16)
    assert np.array_equal(kv_quantizer("int8-head")(v), int_rows(flat, 127).reshape(v.shape))
    assert np.array_equal(kv_quantizer("int4-g8")(v), int_rows(flat.reshape(-1, 8), 7).reshape(v.shape))
    assert (kv_bits("fp8-e4m3", 16), kv_bits("int8-head", 16), kv_bits("int4-g8", 16)) == (8.0, 9.0, 6.0)
    assert kv_bits("int8-head", 128) == 8.125
    with pytest.raises(ValueError, match="KV cache 格式"):
        kv_quantizer("int2")


def test_kvcache_quant_option():
    P = init_params(QCFG, seed=0)
    toks = sample_tokens(P, QCFG, n_seq=3, length=20, seed=5)
    model = NumpyTransformer(P, QCFG)
    plain = KVCache(QCFG, 3, 20)
    assert type(plain.k) is np.ndarray and type(plain.v) is np.ndarray          # 默认：普通的 float64 数组
    ref = model.forward(toks, plain)
    q = kv_quantizer("int4-g8")
    full = KVCache(QCFG, 3, 20, quant=q)
    lq = model.forward(toks, full)
    # 第 0 层的输入和 float 模型相同：缓存里存的正好是 float 缓存的值量化以后（后面的层的输入已经被改变了）
    assert np.array_equal(np.asarray(full.k)[0], q(plain.k[0])) and np.array_equal(np.asarray(full.v)[0], q(plain.v[0]))
    step = KVCache(QCFG, 3, 20, quant=q)
    parts = [model.forward(toks[:, :7], step)] + [model.forward(toks[:, t:t + 1], step) for t in range(7, 20)]
    assert np.abs(np.concatenate(parts, axis=1) - lq).max() < 1e-12              # 逐个写入 = 一次写入
    assert np.abs(lq - ref).max() > 1e-3                                          # 量化确实改变了输出
    step.rollback(5)
    assert step.pos == 15
    with pytest.raises(ValueError, match="quant"):
        KVCache(QCFG, 1, 4, quant="int8")


@pytest.mark.parametrize("fmt", ["fp8-e4m3", "int8-head", "int4-g8"])
def test_kv_quantizers_are_idempotent_so_keep_can_move_quantized_values(fmt):
    q = kv_quantizer(fmt)
    v = np.random.default_rng(7).standard_normal((2, 2, 9, 16)) * 3
    once = q(v)
    assert np.array_equal(q(once), once)
    P = init_params(QCFG, seed=0)
    toks = sample_tokens(P, QCFG, n_seq=1, length=12, seed=3)
    cache = KVCache(QCFG, 1, 12, quant=q)
    NumpyTransformer(P, QCFG).forward(toks, cache)
    before = np.asarray(cache.k)[:, :, :, [0, 1, 2, 3, 5, 8]].copy()
    cache.keep(4, [1, 4])                          # 留下第 5、8 个位置，挪到 4、5
    assert cache.pos == 6 and np.array_equal(np.asarray(cache.k)[:, :, :, :6], before)
