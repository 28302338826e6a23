"""
numfmt 新增的整数格式：INT3（qmax = 3）和非对称的 quantize_int_asym（每组 FP16 scale + 整数零点），
用只靠 numpy 的独立实现（np.float16 做 scale 的舍入）和手算的例子核对；每个数的位数用闭式公式核对。
"""
import numpy as np
import pytest

from numfmt import bits_per_value, quantize_int, quantize_int_asym


def fp16(x):
    return np.asarray(x, dtype=np.float64).astype(np.float16).astype(np.float64)


def test_int3_group_matches_independent_implementation():
    w = np.random.default_rng(3).standard_normal((64, 5))
    got, scale = quantize_int(w, 3, "group", 32)
    b = w.T.reshape(5, 2, 32)
    s = fp16(np.abs(b).max(axis=-1, keepdims=True) / 3)
    want = (np.clip(np.round(b / s), -3, 3) * s).reshape(5, 64).T
    assert np.array_equal(got, want)
    assert np.array_equal(scale, s[..., 0])
    assert len(np.unique(np.round(got[:32, 0] / s[0, 0, 0]))) <= 7          # 7 个刻度 −3..3


def test_asym_hand_worked_group():
    # 组 [-1, 0, 0.5, 2]：范围 3，scale = fp16(3 / 15) = 0.199951171875，零点 round(1 / scale) = 5
    w = np.array([[-1.0], [0.0], [0.5], [2.0]])
    got, scale, zero = quantize_int_asym(w, 4, 4)
    s = 0.199951171875
    assert scale[0, 0] == s and zero[0, 0] == 5
    q = np.clip(np.round(w[:, 0] / s) + 5, 0, 15)                            # [0, 5, 8, 15]
    assert list(q) == [0, 5, 8, 15]
    assert np.array_equal(got[:, 0], (q - 5) * s)


def test_asym_uses_all_levels_on_one_sided_data_and_beats_symmetric():
    w = np.abs(np.random.default_rng(4).standard_normal((32, 8))) + 0.5      # 全为正
    asym, scale, zero = quantize_int_asym(w, 4, 32)
    sym, _ = quantize_int(w, 4, "group", 32)
    assert np.all(np.abs(asym - w) <= scale.T / 2 + 1e-12)                  # 范围内误差不超过半个刻度
    assert np.linalg.norm(asym - w) < 0.6 * np.linalg.norm(sym - w)


def test_asym_zero_group_and_bad_arguments():
    got, scale, zero = quantize_int_asym(np.zeros((4, 2)), 4, 4)
    assert not got.any() and not scale.any()
    with pytest.raises(ValueError, match="位"):
        quantize_int_asym(np.ones((4, 2)), 5, 4)
    with pytest.raises(ValueError, match="整除"):
        quantize_int_asym(np.ones((6, 2)), 4, 4)
    with pytest.raises(ValueError, match="8、4、3"):
        quantize_int(np.ones((4, 2)), 2)


def test_bits_per_value_new_formats():
    assert bits_per_value("int3", n_in=64, group=32) == 3 + 16 / 32
    assert bits_per_value("int4-zp", group=32) == 4.625 == 4 + 20 / 32
    with pytest.raises(ValueError):
        bits_per_value("int4-zp")
