"""
outlier_lab（capture 和离群的统计量）、kvquant_lab（每 token / KIVI 的布局）、quant_lab 的两个加速（分块 GPTQ、
AWQ 用 X 算误差）：在 QCFG 和手算的小例子上核对，不需要真实模型。
容差：都是 float64 的两种写法之比，只差加法的顺序。单位舍入 1.1e-16，QCFG 的点积最长 d_ff = 192，激活和 logits
的绝对值不到 10：一次点积的误差上界 192 × 1.1e-16 × 10 ≈ 2e-13（最坏情形，不靠随机抵消），4 层累积仍在 1e-12 上下；
断言 1e-12（同一个数组的重排、一层）到 1e-10（整个前向），和哪台机器、哪个 BLAS 无关；写错一处差的是 O(1)。
"""
import dataclasses

import numpy as np
import pytest

from kvcache_lab import KVCache
from kvquant_lab import kv_cache, kv_layout_bits, kv_quantizer_layout, quantize_along
from outlier_lab import capture, massive_activations, outlier_ratio, recurring_channels, top_channels
from quant_lab import (QCFG, SCHEMES, _gptq_rows, awq_search, gptq_factor, gptq_rows_lazy, layer_inputs, quantize_matrix,
                       sample_tokens)
from transformer_lab import NumpyTransformer, init_params


@pytest.fixture(scope="module")
def toy():
    P = init_params(QCFG, seed=0)
    toks = sample_tokens(P, QCFG, n_seq=3, length=20, seed=2)
    return P, toks


# ---------------------------------------------------------------------------
# capture：同一个模型的第三种写法
# ---------------------------------------------------------------------------
def test_capture_logits_and_acts_match_the_two_other_forwards(toy):
    P, toks = toy
    logits, acts = capture(P, QCFG, toks)
    ref = NumpyTransformer(P, QCFG).forward(toks)
    assert np.abs(logits - ref).max() < 1e-10
    l2, acts2 = layer_inputs(P, QCFG, toks)
    for li in range(QCFG.n_layers):
        for k in ("attn_in", "attn_out", "mlp_in", "mlp_act"):
            assert np.abs(acts[li][k] - acts2[li][k]).max() < 1e-10, (li, k)


def test_capture_keys_and_values_are_the_cache_of_the_fast_forward(toy):
    """缓存里的 K 是每个头的列重排过的（第 2i、2i+1 列 = 第 i、i + hd/2 维）：按同样的重排，capture 的 K 要和它相等。"""
    P, toks = toy
    _, acts = capture(P, QCFG, toks)
    model = NumpyTransformer(P, QCFG)
    cache = model.new_cache(toks.shape[0], toks.shape[1])
    model.forward(toks, cache)
    half = QCFG.head_dim // 2
    perm = np.stack([np.arange(half), np.arange(half) + half], axis=1).ravel()
    for li in range(QCFG.n_layers):
        assert np.abs(acts[li]["k"][..., perm] - cache.k[li]).max() < 1e-10
        assert np.abs(acts[li]["v"] - cache.v[li]).max() < 1e-10


def test_capture_resid_is_the_embedding_then_the_running_sum(toy):
    P, toks = toy
    _, acts = capture(P, QCFG, toks)
    B, n = toks.shape
    assert np.array_equal(acts[0]["resid"], P["embed"][toks].reshape(B * n, -1))
    L = P["layers"][0]
    x1 = acts[0]["resid"] + acts[0]["attn_out"] @ L["wo"] + acts[0]["mlp_act"] @ L["w_down"]
    assert np.abs(x1 - acts[1]["resid"]).max() < 1e-12


def test_capture_from_a_middle_layer_equals_the_full_pass(toy):
    P, toks = toy
    logits, acts = capture(P, QCFG, toks)
    l2, a2 = capture(P, QCFG, toks, layers=(3,), start=2, resid=acts[2]["resid"])
    assert np.abs(l2 - logits).max() < 1e-12
    assert set(a2) == {3} and np.abs(a2[3]["mlp_act"] - acts[3]["mlp_act"]).max() < 1e-12


def test_capture_keeps_float32_float32():
    cfg = dataclasses.replace(QCFG, dtype="float32")
    P = init_params(QCFG, seed=0)
    P32 = {k: (v.astype(np.float32) if isinstance(v, np.ndarray) else [{a: b.astype(np.float32) for a, b in L.items()}
                                                                       for L in v]) for k, v in P.items()}
    logits, acts = capture(P32, cfg, np.array([[1, 2, 3]]))
    assert logits.dtype == np.float32 and acts[0]["mlp_act"].dtype == np.float32


def test_capture_rejects_bad_arguments(toy):
    P, toks = toy
    with pytest.raises(ValueError, match="toks"):
        capture(P, QCFG, toks[0])
    with pytest.raises(ValueError, match="token"):
        capture(P, QCFG, toks + QCFG.vocab)
    with pytest.raises(ValueError, match="resid"):
        capture(P, QCFG, toks, start=2)
    with pytest.raises(ValueError, match="start"):
        capture(P, QCFG, toks, start=QCFG.n_layers)
    with pytest.raises(ValueError, match="resid"):
        capture(P, QCFG, toks, start=1, resid=np.zeros((3, QCFG.d_model)))


# ---------------------------------------------------------------------------
# 统计量
# ---------------------------------------------------------------------------
def test_outlier_ratio_by_hand():
    x = np.array([[1.0, -2.0, 0.5, 4.0, 0.0],
                  [0.5, 1.0, -3.0, 1.0, -100.0]])          # 每个通道的 max|x|：1, 2, 3, 4, 100；中位数 3
    assert outlier_ratio(x) == pytest.approx(100 / 3)
    assert outlier_ratio(np.array([[0.0, 0.0, 1.0]])) == float("inf")
    assert list(top_channels(x, 2)) == [4, 3]
    with pytest.raises(ValueError):
        outlier_ratio(np.zeros(4))
    with pytest.raises(ValueError):
        top_channels(x, 6)


def test_recurring_channels_by_hand():
    tops = [[5, 1, 2], [5, 2, 9], [2, 7, 5], [8, 0, 3]]
    assert recurring_channels(tops, 2) == [(2, 3), (5, 3)]
    assert recurring_channels(tops, 3) == [(2, 3), (5, 3)]
    assert recurring_channels(tops, 4) == []
    with pytest.raises(ValueError):
        recurring_channels(tops, 0)


def test_massive_activations_by_hand():
    r = np.ones((2 * 4, 3)) * 0.5                    # 2 条 × 4 个位置，3 维
    r[4, 1] = -900.0                                   # 第 2 条的第一个位置、第 1 维
    r[6, 2] = 7.0
    m = massive_activations(r, 2)
    assert (m["max"], m["pos"], m["channel"], m["first_max"], m["rest_max"]) == (900.0, 0, 1, 900.0, 7.0)
    assert m["median"] == 0.5 and m["ratio"] == 1800.0
    with pytest.raises(ValueError):
        massive_activations(r, 3)


# ---------------------------------------------------------------------------
# kvquant_lab
# ---------------------------------------------------------------------------
def asym_group(v, bits):
    """一组数的非对称量化，手写（区间包含 0，FP16 的 scale，零点 round(−lo / s)）。"""
    lo, hi = min(v.min(), 0.0), max(v.max(), 0.0)
    levels = 2 ** bits - 1
    s = float(np.float16((hi - lo) / levels))
    z = np.clip(np.round(-lo / s), 0, levels)
    return (np.clip(np.round(v / s) + z, 0, levels) - z) * s


def test_per_token_and_kivi_layouts_group_along_the_right_axis():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 40, 8))                     # [批, 头, token, head_dim]
    tok = quantize_along(x, -1, 4, 4)
    ch = quantize_along(x, -2, 4, 16)
    b, h = 1, 2
    assert np.allclose(tok[b, h, 5, 4:8], asym_group(x[b, h, 5, 4:8], 4))
    assert np.allclose(ch[b, h, 16:32, 3], asym_group(x[b, h, 16:32, 3], 4))
    # 40 = 2 × 16 + 8：最后一组是 8 个 token（补的 0 不改变 scale 和零点）
    assert np.allclose(ch[b, h, 32:40, 6], asym_group(x[b, h, 32:40, 6], 4))
    fk, fv = kv_quantizer_layout("kivi", 4, 16)
    assert np.array_equal(fk(x), ch) and np.array_equal(fv(x), quantize_along(x, -1, 4, 16))
    fk, fv = kv_quantizer_layout("token", 4, 4)
    assert np.array_equal(fk(x), tok) and np.array_equal(fv(x), tok)
    assert quantize_along(x.astype(np.float32), -1, 4, 4).dtype == np.float32


def test_kivi_layout_spares_the_other_channels_of_an_outlier_channel():
    """K 的一个通道在所有 token 上都大：每 token 的 scale 被它撑大，按通道分组时它自己一组。"""
    rng = np.random.default_rng(1)
    k = rng.standard_normal((1, 1, 64, 32))
    k[..., 7] *= 30
    others = np.arange(32) != 7
    e_tok = np.abs(quantize_along(k, -1, 4, 32) - k)[..., others].mean()
    e_ch = np.abs(quantize_along(k, -2, 4, 32) - k)[..., others].mean()
    assert e_ch < e_tok / 5


def test_kv_layout_bits_and_errors():
    assert kv_layout_bits(4, 32) == 4 + 20 / 32 == 4.625
    assert kv_layout_bits(8, 64) == 8 + 24 / 64
    with pytest.raises(ValueError, match="位数"):
        kv_layout_bits(2, 32)
    with pytest.raises(ValueError, match="分组"):
        quantize_along(np.zeros((2, 4)), -1, 4, 0)
    with pytest.raises(ValueError, match="axis"):
        quantize_along(np.zeros((2, 4)), 2, 4, 2)
    with pytest.raises(ValueError, match="布局"):
        kv_quantizer_layout("channel")


def test_kv_cache_writes_k_and_v_through_their_own_quantizers(toy):
    P, toks = toy
    model = NumpyTransformer(P, QCFG)
    B, n = toks.shape
    ref = model.new_cache(B, n)
    model.forward(toks, ref)
    fk, fv = kv_quantizer_layout("kivi", 4, 8)
    c = kv_cache(QCFG, B, n, fk, fv)
    model.forward(toks, c)
    # 第 0 层的 K、V 写进去之前和不量化的一样（它的输入只有词嵌入）
    assert np.array_equal(c.k[0], fk(ref.k[0])) and np.array_equal(c.v[0], fv(ref.v[0]))
    only_v = kv_cache(QCFG, B, n, None, fv)
    model.forward(toks, only_v)
    assert np.array_equal(only_v.k[0], ref.k[0])
    assert isinstance(c, KVCache)


# ---------------------------------------------------------------------------
# quant_lab 的两个加速：结果和原来的写法一样
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["int4-g32", "int3-g32", "int8", "int4-g32-zp", "mxfp4", "nvfp4"])
def test_lazy_gptq_equals_the_row_by_row_loop(scheme):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((300, 256)) * (1 + 5 * (rng.random(256) < 0.05))
    w = rng.standard_normal((256, 48)) * 0.05
    U = gptq_factor(x)
    a = _gptq_rows(w, U, scheme)
    for block in (32, 128, 96 if SCHEMES[scheme][2] else 100):
        b = gptq_rows_lazy(w, U, scheme, block=block)
        assert np.abs(a - b).max() < 1e-12, block


def test_lazy_gptq_rejects_a_block_that_splits_a_group():
    w = np.zeros((64, 4))
    U = np.eye(64)
    with pytest.raises(ValueError, match="block"):
        gptq_rows_lazy(w, U, "int4-g32", block=48)


def test_awq_error_with_fewer_rows_than_inputs_is_the_same_number():
    """样本比输入维少时 awq_search 直接算 ‖X·D‖²：每个 a 的误差按定义手算核对。"""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((40, 128)) * (1 + 20 * (np.arange(128) == 9))
    w = rng.standard_normal((128, 16)) * 0.1
    wq, a, errs = awq_search(w, x, "int4-g32", grid=5)
    m = np.abs(x).mean(axis=0)
    for k in range(5):
        s = m ** (k / 5)
        s = s / np.sqrt(s.max() * s.min())
        d = quantize_matrix(w * s[:, None], "int4-g32")[0] / s[:, None] - w
        assert errs[k] == pytest.approx(np.linalg.norm(x @ d) ** 2 / np.linalg.norm(x @ w) ** 2, rel=1e-10)
    assert a == np.argmin(errs) / 5
