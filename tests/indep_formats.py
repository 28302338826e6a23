"""
测试用的独立实现（只用 numpy，不经过 numfmt）：从位的定义枚举 E4M3 / E2M1 的码表，就近舍入、平局取尾数最低位为 0 的。
第 3 讲的脚本测试（test_lecture03_01、test_lecture03_scripts）拿它们核对 quant_lab / numfmt 的量化结果。
"""
import numpy as np

E2M1_GRID = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6.0])     # E2M1 的全部非负值
E2M1_LSB = np.array([0, 1, 0, 1, 0, 1, 0, 1])             # 每个值的尾数最低位


def e4m3_grid():
    """E4M3 的全部非负有限值（从位的定义枚举）和每个值的尾数最低位。"""
    vals, lsb = [], []
    for E in range(16):
        for M in range(8):
            if E == 15 and M == 7:
                continue                                     # NaN
            vals.append(M / 8 * 2.0 ** -6 if E == 0 else (1 + M / 8) * 2.0 ** (E - 7))
            lsb.append(M & 1)
    return np.array(vals), np.array(lsb)


def nearest_even(v, grid, lsb):
    """|v| 在 grid 上就近取，平局取尾数最低位为 0 的那个，超过最大值饱和；保留符号。"""
    a = np.minimum(np.abs(v), grid[-1])
    i = np.clip(np.searchsorted(grid, a), 1, len(grid) - 1)
    lo, hi = grid[i - 1], grid[i]
    dlo, dhi = a - lo, hi - a
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lsb[i - 1] == 0, lo, hi)))
    return np.sign(v) * pick
