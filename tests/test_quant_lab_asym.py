"""
quant_lab 的非对称 INT4（"int4-g32-zp"，每 32 个一组、FP16 scale + 4 位零点）在偏向负数的组上：零点大于 7。
对称的直觉（零点在 7、8 附近）在这里是错的；把零点限制在 0..7，或者把 q 限制在有符号的 −8..7，都会把组里最负的数
截掉。就近舍入（quantize_matrix）和 GPTQ 量化一行的代码（输入不相关时 GPTQ 就是就近舍入）是两条路，都用手算的数核对。
"""
import numpy as np
import pytest

from numfmt import quantize_int_asym
from quant_lab import gptq_quantize, quantize_matrix

# 两列、每列 32 个数 = 一组（8 个数重复 4 遍）。scale 都是 0.25（FP16 里精确）：
# 第 0 列 lo = −3、hi = 0.75：scale = 3.75 / 15 = 0.25，零点 round(3 / 0.25) = 12；
# 第 1 列全 ≤ 0，lo = −3.75、hi = 0：scale = 0.25，零点 15（最大的 4 位整数）。
COL0 = [-3.0, -2.6, -1.9, -1.0, -0.3, -0.1, 0.3, 0.75]
COL1 = [-3.75, -3.0, -2.6, -1.1, -0.6, -0.2, -0.1, 0.0]
# 手算：q = clip(round(w / 0.25) + z, 0, 15)，w' = (q − z) · 0.25（round 是就近、平局取偶；这里没有平局）
#   第 0 列：w/0.25 = −12、−10.4、−7.6、−4、−1.2、−0.4、1.2、3 → q = 0、2、4、8、11、12、13、15
#   第 1 列：w/0.25 = −15、−12、−10.4、−4.4、−2.4、−0.8、−0.4、0 → q = 0、3、5、11、13、14、15、15
Q0, Q1 = [0, 2, 4, 8, 11, 12, 13, 15], [0, 3, 5, 11, 13, 14, 15, 15]
DEQ0 = [-3.0, -2.5, -2.0, -1.0, -0.25, 0.0, 0.25, 0.75]
DEQ1 = [-3.75, -3.0, -2.5, -1.0, -0.5, -0.25, 0.0, 0.0]


def _weights():
    return np.array([COL0 * 4, COL1 * 4]).T                     # [32 输入维, 2 输出维]


def test_hand_numbers_are_consistent():
    """手算的表自己对得上：w' = (q − z) · 0.25。"""
    assert [(q - 12) * 0.25 for q in Q0] == DEQ0 and [(q - 15) * 0.25 for q in Q1] == DEQ1


def test_mostly_negative_group_has_zero_point_above_7():
    wq, scale, zero = quantize_int_asym(_weights(), 4, 32)
    assert scale.tolist() == [[0.25], [0.25]]
    assert zero.tolist() == [[12.0], [15.0]]
    assert np.array_equal(wq, np.array([DEQ0 * 4, DEQ1 * 4]).T)


@pytest.mark.parametrize("path", ["rtn", "gptq"])
def test_int4_zp_scheme_dequantizes_the_mostly_negative_group_by_hand(path):
    w = _weights()
    if path == "rtn":
        wq, bits = quantize_matrix(w, "int4-g32-zp")
        assert bits == 4 + 20 / 32
    else:
        wq = gptq_quantize(w, 3.0 * np.eye(32), "int4-g32-zp")  # XᵀX 对角：没有可补偿的，逐行量化 = 就近舍入
    assert np.array_equal(wq, np.array([DEQ0 * 4, DEQ1 * 4]).T)
    assert wq.min() == -3.75                                      # 最负的数没有被截掉
