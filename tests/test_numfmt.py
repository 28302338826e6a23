"""numfmt：各格式的极值等于规范；就近取偶的舍入在边界值上（最大正规数、最小次正规数、一样近、溢出、0、−0）。"""
import numpy as np
import pytest

from numfmt import (BF16, FP16, FP32, FP4_E2M1, FP8_E4M3, FP8_E5M2, bits_per_value, encode_bits, quantize_fp8,
                    quantize_int, quantize_mx, quantize_nvfp4, round_to)

# (格式, 最大有限值, 最小正规数, 最小次正规数, ε)：IEEE 754、OCP FP8 规范（E4M3 的 "FN" 版本）、OCP MX 规范（E2M1）
SPECS = [
    (FP32, 3.4028234663852886e38, 2.0 ** -126, 2.0 ** -149, 2.0 ** -23),
    (FP16, 65504.0, 2.0 ** -14, 2.0 ** -24, 2.0 ** -10),
    (BF16, 3.3895313892515355e38, 2.0 ** -126, 2.0 ** -133, 2.0 ** -7),
    (FP8_E4M3, 448.0, 2.0 ** -6, 2.0 ** -9, 2.0 ** -3),
    (FP8_E5M2, 57344.0, 2.0 ** -14, 2.0 ** -16, 2.0 ** -2),
    (FP4_E2M1, 6.0, 1.0, 0.5, 0.5),
]


@pytest.mark.parametrize("fmt,mx,mn,sub,eps", SPECS, ids=[s[0].name for s in SPECS])
def test_extremes_equal_the_spec(fmt, mx, mn, sub, eps):
    assert (fmt.max_value, fmt.min_normal, fmt.min_subnormal, fmt.epsilon) == (mx, mn, sub, eps)
    assert round_to(mx, fmt) == mx and round_to(sub, fmt) == sub and round_to(mn, fmt) == mn


def test_fp16_and_fp32_rounding_equal_numpy_casts():
    x = np.random.default_rng(0).standard_normal(200_000) * np.exp2(np.random.default_rng(1).random(200_000) * 40 - 30)
    with np.errstate(over="ignore"):
        assert np.array_equal(round_to(x, FP16), x.astype(np.float16).astype(np.float64))
    assert np.array_equal(round_to(x, FP32), x.astype(np.float32).astype(np.float64))


def test_ties_go_to_even():
    assert round_to(1 + 2 ** -11, FP16) == 1.0                    # 正好一半：取偶数（尾数 0）
    assert round_to(1 + 3 * 2 ** -11, FP16) == 1 + 2 ** -9         # 正好一半：进位到偶数
    assert list(round_to([0.25, 0.75, 2.5, 3.5, 5.0], FP4_E2M1)) == [0.0, 1.0, 2.0, 4.0, 4.0]
    assert round_to(2 ** -25, FP16) == 0.0                         # 最小次正规数的一半：取偶数 0


def test_overflow_ieee_to_inf_and_e4m3_e2m1_saturate():
    assert round_to(65519.99, FP16) == 65504.0
    assert round_to(65520.0, FP16) == np.inf                       # 正好在 65504 和 65536 中间：进位 → inf
    assert round_to(-1e6, FP8_E5M2) == -np.inf
    assert round_to(1e6, FP8_E4M3) == 448.0 and round_to(-np.inf, FP8_E4M3) == -448.0
    assert round_to(7.0, FP4_E2M1) == 6.0 and round_to(-100.0, FP4_E2M1) == -6.0


def test_zero_negative_zero_and_nan():
    r = round_to([0.0, -0.0, -1e-30], FP8_E4M3)
    assert list(np.signbit(r)) == [False, True, True] and (r == 0).all()
    assert np.isnan(round_to(np.nan, BF16))


def test_encode_bits():
    assert encode_bits(448.0, FP8_E4M3) == ("0", "1111", "110")
    assert encode_bits(-2.0, FP16) == ("1", "10000", "0000000000")
    assert encode_bits(2 ** -24, FP16) == ("0", "00000", "0000000001")
    assert encode_bits(6.0, FP4_E2M1) == ("0", "11", "1")
    assert encode_bits(np.nan, FP8_E4M3) == ("0", "1111", "111")
    with pytest.raises(ValueError, match="精确表示"):
        encode_bits(0.1, FP16)
    with pytest.raises(ValueError, match="没有 inf"):
        encode_bits(np.inf, FP8_E4M3)


def test_int_quantization_granularities_and_zero_group():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 8))
    w[:32, 3] = 0.0                                                 # 一个全 0 的组
    for gran, g in (("tensor", None), ("channel", None), ("group", 32)):
        wq, scale = quantize_int(w, 4, gran, g)
        assert wq.shape == w.shape and np.isfinite(wq).all()
    wq, _ = quantize_int(w, 4, "group", 32)
    assert (wq[:32, 3] == 0).all()
    errs = [np.linalg.norm(quantize_int(w, 4, gr, g)[0] - w) for gr, g in (("tensor", None), ("channel", None),
                                                                             ("group", 16))]
    assert errs[0] > errs[1] > errs[2]
    with pytest.raises(ValueError, match="整除"):
        quantize_int(w, 4, "group", 48)
    with pytest.raises(ValueError, match="只支持 8、4、3 位"):
        quantize_int(w, 2)


def test_int8_per_channel_error_is_within_half_a_step():
    w = np.random.default_rng(2).standard_normal((128, 16))
    wq, scale = quantize_int(w, 8, "channel")
    assert (np.abs(wq - w) <= scale[None, :] / 2 + 1e-12).all()


def test_mx_scale_is_a_power_of_two_and_elements_fit():
    w = np.random.default_rng(3).standard_normal((64, 4)) * 10
    wq, scale = quantize_mx(w, FP4_E2M1, 32)
    assert np.array_equal(scale, np.exp2(np.round(np.log2(scale))))
    ratio = (wq.T.reshape(-1, 32) / scale.reshape(-1, 1))
    assert np.abs(ratio).max() <= 6.0
    assert np.array_equal(round_to(ratio, FP4_E2M1), ratio)


def test_bits_per_value_include_scales():
    assert bits_per_value("mxfp4") == 4.25
    assert bits_per_value("mxfp8") == 8.25
    assert bits_per_value("int4", group=32) == 4.5
    assert bits_per_value("int4", group=128) == 4.125
    assert bits_per_value("int8", n_in=64) == 8.25
    with pytest.raises(ValueError, match="可用"):
        bits_per_value("int2")


def test_fp8_scale_is_fp32_and_column_max_maps_to_448():
    w = np.random.default_rng(4).standard_normal((64, 5))
    w[:, 2] = 0.0
    wq, scale = quantize_fp8(w)
    assert np.array_equal(round_to(scale, FP32), scale) and scale[2] == 1.0 and (wq[:, 2] == 0).all()
    elems = wq / scale
    assert np.array_equal(round_to(elems, FP8_E4M3), elems) and np.abs(elems).max() <= 448.0
    assert np.abs(wq - w).max() <= np.abs(w).max() * 2 ** -4 + 1e-12      # 相对误差 ≤ ε/2 = 2⁻⁴（正规数区间）


def test_int_scale_underflow_and_overflow():
    w = np.full((32, 2), 1e-9)
    wq, scale = quantize_int(w, 8, "channel")
    assert (scale > 0).all() and np.isfinite(wq).all()
    with pytest.raises(ValueError, match="FP16 的最大值"):
        quantize_int(np.full((4, 1), 1e7), 8, "channel")


def test_mx_scale_exponent_is_clamped_to_e8m0():
    wq, scale = quantize_mx(np.full((32, 1), 1e-45), FP4_E2M1, 32)
    assert scale.min() >= 2.0 ** -127
    with pytest.raises(ValueError, match="块大小"):
        quantize_mx(np.ones((32, 1)), FP4_E2M1, 0)


def test_every_fp16_bit_pattern_round_trips():
    vals = np.arange(2 ** 16, dtype=np.uint16).view(np.float16).astype(np.float64)
    finite = np.isfinite(vals)
    assert np.array_equal(round_to(vals[finite], FP16), vals[finite])
    # 溢出区：在 65504 和 inf 之间，和 numpy 的 float16 转换一致
    x = np.linspace(65000, 70000, 5001)
    with np.errstate(over="ignore"):
        assert np.array_equal(round_to(x, FP16), x.astype(np.float16).astype(np.float64))


@pytest.mark.parametrize("fmt", [FP8_E4M3, FP8_E5M2, FP4_E2M1], ids=lambda f: f.name)
def test_every_small_format_bit_pattern_decodes_and_round_trips(fmt):
    """从位直接算出每个码的值（独立于 round_to），检查它能被精确表示、encode_bits 还原出同样的位。"""
    E, M, bias = fmt.exp_bits, fmt.man_bits, fmt.bias
    for code in range(2 ** (1 + E + M)):
        s, e, m = code >> (E + M), (code >> M) & (2 ** E - 1), code & (2 ** M - 1)
        if fmt.has_inf and e == 2 ** E - 1:
            continue                                                   # inf / NaN
        if fmt.nan_in_top and e == 2 ** E - 1 and m == 2 ** M - 1:
            continue                                                   # E4M3 的 NaN
        v = (m / 2 ** M) * 2.0 ** (1 - bias) if e == 0 else (1 + m / 2 ** M) * 2.0 ** (e - bias)
        v = -v if s else v
        assert round_to(v, fmt) == v
        bits = encode_bits(v, fmt)
        assert bits == (str(s), format(e, f"0{E}b"), format(m, f"0{M}b"))


def test_nvfp4_hand_worked_block():
    """NVFP4 手算：张量 max = 12 → s_t = 12/2688（FP32）；第一块 max 12 → s_b = 448；第二块 max 0.75 → s_b = 28。"""
    w = np.zeros((32, 1))
    w[:16, 0] = [12, -5, 2.9, 0.1] + [0.0] * 12
    w[16:, 0] = [0.75, 0.2] + [0.0] * 14
    deq, scale = quantize_nvfp4(w)
    s_t = float(np.float32(12 / 2688))
    assert scale[0, 0] == 448 * s_t and scale[0, 1] == 28 * s_t       # 0.75 / 6 / s_t = 28 正好可表示
    x = 448 * s_t                                                      # ≈ 2：元素网格 ±{0, .5, 1, 1.5, 2, 3, 4, 6}
    assert np.allclose(deq[:4, 0], [6 * x, -2 * x, 1.5 * x, 0.0])   # −2.5 在 2 和 3 正中：取偶 → 2
    y = 28 * s_t                                                       # 0.125：0.75 → 6，0.2 → 1.6 → 1.5
    assert np.allclose(deq[16:18, 0], [6 * y, 1.5 * y])
    assert bits_per_value("nvfp4") == 4.5


def test_nvfp4_beats_mxfp4_and_int4_g32_on_gaussian_weights():
    """N(0,1) 权重：更细的块（16）和非 2 的幂的 scale 让 NVFP4 的相对误差（约 0.095）低于 INT4-g32 和 MXFP4。"""
    w = np.random.default_rng(0).standard_normal((1024, 256))
    rel = lambda d: np.linalg.norm(d - w) / np.linalg.norm(w)
    nv, mx = rel(quantize_nvfp4(w)[0]), rel(quantize_mx(w)[0])
    i4 = rel(quantize_int(w, 4, "group", 32)[0])
    assert 0.090 < nv < 0.100 and nv < i4 < mx
    with pytest.raises(ValueError, match="块大小"):
        quantize_nvfp4(w[:20])
    assert np.array_equal(quantize_nvfp4(np.zeros((16, 2)))[0], np.zeros((16, 2)))


def test_e2m1_fp16_control_by_hand():
    """E2M1 + FP16 scale：一组 max 12 → scale 2（FP16 精确）；5/2 = 2.5 取偶到 2，2.9/2 = 1.45 → 1.5，0.1/2 → 0。"""
    from numfmt import quantize_e2m1_fp16
    w = np.zeros((32, 1))
    w[:4, 0] = [12, -5, 2.9, 0.1]
    deq, scale = quantize_e2m1_fp16(w)
    assert scale[0, 0] == 2.0 and list(deq[:4, 0]) == [12.0, -4.0, 3.0, 0.0]
    assert np.array_equal(quantize_e2m1_fp16(np.zeros((32, 2)))[0], np.zeros((32, 2)))
    with pytest.raises(ValueError, match="整除"):
        quantize_e2m1_fp16(np.ones((20, 1)))
