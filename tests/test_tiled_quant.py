"""
lecture03/tiled_quant_lab（只量化权重、一块一块反量化的矩阵）和 03_quantized_decode_speed 的 --time 路径。
对照都是独立的：prereq3/numfmt.quantize_int 的反量化值、一次反量化成 float32 的矩阵和模型。
"""
import numpy as np
import pytest

from conftest import load_script
from numfmt import quantize_int
from tiled_quant_lab import TiledQuantWeight, dequantized_model, model_weight_bytes, quantize_model
from transformer_lab import LMConfig, NumpyTransformer, init_params

EPS32 = float(np.finfo(np.float32).eps)
SCHEMES = [("int8", 8, None), ("int4-g32", 4, 32)]


def _w(K=96, N=200, seed=0):
    w = np.random.default_rng(seed).standard_normal((K, N))
    w[:, 7] = 0.0                                     # 一整列 0：scale = 0 的那一列
    return w


@pytest.mark.parametrize("scheme,bits,group", SCHEMES)
def test_stored_codes_and_scales_dequantize_to_numfmt(scheme, bits, group):
    """存着的整数码 × FP16 scale == numfmt.quantize_int 的反量化值（q·s 在 float32 里精确：≤ 8 位 × 11 位）。"""
    w = _w()
    W = TiledQuantWeight(w, scheme, buffer_bytes=96 * 4 * 64)
    assert len(W.tiles) == 4 and W.tiles[-1].shape[1] == 200 - 3 * 64          # 最后一块不满
    ref = quantize_int(w, bits, "group" if group else "channel", group)[0]
    assert np.array_equal(W.dequantize(), ref.astype(np.float32))


@pytest.mark.parametrize("scheme,bits,group", SCHEMES)
def test_tiled_product_equals_dequantized_once_to_float_rounding(scheme, bits, group):
    """
    x @ W（一块一块反量化）和 x @ W 一次反量化的矩阵只差 float32 的舍入：
    |差| ≤ 2·K·eps32·(|x| @ |W'|)（两种求和顺序各自的误差界相加；INT8 还多一次乘 scale 的舍入）。
    """
    w = _w()
    W = TiledQuantWeight(w, scheme, buffer_bytes=96 * 4 * 64)
    D = quantize_int(w, bits, "group" if group else "channel", group)[0]
    x = np.random.default_rng(1).standard_normal((5, 96)).astype(np.float32)
    got = x @ W
    exact = x.astype(np.float64) @ D
    bound = 2 * 96 * EPS32 * (np.abs(x).astype(np.float64) @ np.abs(D)) + 1e-30
    assert got.shape == (5, 200) and got.dtype == np.float32
    assert np.all(np.abs(got - exact) <= bound)


def test_stored_bytes_are_codes_plus_fp16_scales():
    """INT8：K·N + 2N 字节；INT4-g32：K·N/2 + 2·N·K/32（每个权重 0.5625 字节）。"""
    w = _w(K=64, N=96)
    assert TiledQuantWeight(w, "int8").nbytes == 64 * 96 + 2 * 96
    assert TiledQuantWeight(w, "int4-g32").nbytes == 64 * 96 // 2 + 2 * 96 * 2


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="方案"):
        TiledQuantWeight(_w(), "int2")
    with pytest.raises(ValueError, match="32 的倍数"):
        TiledQuantWeight(_w(K=40), "int4-g32")
    with pytest.raises(ValueError, match="\\[M, 96\\]"):
        np.ones((2, 95), dtype=np.float32) @ TiledQuantWeight(_w(), "int8")


CFG = LMConfig(vocab=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128, max_seq=32,
               dtype="float32")


@pytest.mark.parametrize("scheme", ["int8", "int4-g32"])
def test_quantized_model_logits_equal_dequantized_once_model(scheme):
    """
    整个模型：linear 直接乘 TiledQuantWeight（模型的数学不抄）的 logits == 同样的整数码一次反量化的模型的，
    差在 float32 舍入的量级（相对最大 logit 1e-4：两层、几十次求和的舍入，远小于量化本身带来的差）。
    """
    m = NumpyTransformer(init_params(CFG, 3), CFG)
    q = quantize_model(m, scheme, buffer_bytes=64 * 4 * 32)
    d = dequantized_model(q)
    toks = np.array([[1, 5, 9, 2, 7], [3, 3, 8, 0, 1]])
    lq, ld, lf = q.forward(toks), d.forward(toks), m.forward(toks)
    scale = np.abs(ld).max()
    assert np.abs(lq - ld).max() <= 1e-4 * scale
    assert np.abs(lf - ld).max() > 10 * np.abs(lq - ld).max()      # 量化确实改了模型（不是把原矩阵又乘了一遍）
    assert m._layers[0][0] is not q._layers[0][0]                   # 原模型没被改
    assert model_weight_bytes(q) < model_weight_bytes(m)


def test_03_time_path_on_a_small_model(capsys):
    """03/03 的 --time 演示：给一个小模型（不装 SmolLM2），表里每个批三种权重都量了，加速比 = 时间之比。"""
    s03 = load_script("lecture03/03_quantized_decode_speed.py")
    m = NumpyTransformer(init_params(CFG, 3), CFG)
    r = s03.demo4_measured(model=m, batches=(1, 2), ctx=4, steps=1)
    out = capsys.readouterr().out
    assert "演示 4" in out
    for b in (1, 2):
        t = r["t"][b]
        assert r["x8"][b] == pytest.approx(t["float32"] / t["int8"])
        assert r["x4"][b] == pytest.approx(t["float32"] / t["int4-g32"])
    assert r["bytes"]["int8"] < r["bytes"]["float32"] / 3
    assert r["cross8"] is None or r["cross8"] in (1, 2)
