"""
采样器测试共用的手工用例（不是测试文件：名字不以 test_ 开头）：一个小词表的 transformer 配置，
和一组强迫接受 / 拒绝 / one-hot 残差的 (p, q)（p = 目标，q = 草稿）。test_decode_lab*.py 共用。
"""
import numpy as np

from transformer_lab import LMConfig

# 6 个 token 的小模型：词表小到可以精确枚举两个 token 的联合分布
TINY = LMConfig(name="tiny6", vocab=6, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=32,
                max_seq=64, head_gain=3.0)


def dist(v):
    """非负权重 -> 归一化的概率向量。"""
    v = np.asarray(v, dtype=float)
    return v / v.sum()


HAND_CASES = {
    "p == q": (dist([1, 2, 3, 4]), dist([1, 2, 3, 4])),
    "不相交的支撑": (dist([1, 1, 0, 0]), dist([0, 0, 1, 1])),
    "q 在 p 有的地方为 0": (dist([1, 2, 3, 4]), dist([0, 0, 1, 1])),
    "p 在 q 有的地方为 0": (dist([0, 0, 1, 1]), dist([1, 2, 3, 4])),
    "p 是 one-hot（T = 0）": (np.array([0.0, 0, 1, 0]), dist([4, 3, 2, 1])),
    "q 是 one-hot": (dist([4, 3, 2, 1]), np.array([0.0, 1, 0, 0])),
    "两个都是 one-hot，不同": (np.array([1.0, 0, 0, 0]), np.array([0.0, 0, 0, 1])),
    "舍入后几乎相等": (dist([1, 2, 3, 4]), dist([1, 2, 3, 4 + 1e-15])),
}
