"""
transformer_lab 的分块注意力：结果和一个独立写的普通注意力（这里逐个 query 头、逐行地写）相差 < 1e-12（float64），
因果 / 非因果、GQA、长度不是块的整数倍、query 是最后 n_q 个位置；HBM 计数和手算的小例子、和公式逐个相等；
IO 的阶随 N、d、M 的变化；坏输入报错。以及第 2 讲 05 脚本观察里的数。
"""
import math

import numpy as np
import pytest

from conftest import load_script
from flash_lab import attention_io, flash_attention, flash_blocks, naive_attention, online_softmax


def reference_attention(q, k, v, causal):
    """一行一行地算 softmax(q·kᵀ/√d + 遮罩)·v（不和 lab 共用任何代码）。"""
    H, n_q, d = q.shape
    H_kv, n_k, _ = k.shape
    out = np.zeros_like(q)
    for h in range(H):
        kv = h // (H // H_kv)
        for i in range(n_q):
            last = n_k - n_q + i if causal else n_k - 1
            s = np.array([q[h, i] @ k[kv, j] / math.sqrt(d) for j in range(last + 1)])
            w = np.exp(s - s.max())
            w /= w.sum()
            out[h, i] = w @ v[kv, :last + 1]
    return out


CASES = [(4, 2, 37, 37, 16, 8, 16, True), (4, 2, 37, 37, 16, 8, 16, False), (4, 1, 5, 37, 8, 4, 16, True),
         (2, 2, 9, 9, 8, 16, 32, True), (3, 3, 1, 13, 4, 1, 5, True), (2, 1, 12, 12, 4, 5, 7, False)]


@pytest.mark.parametrize("H,Hk,nq,nk,d,bq,bk,causal", CASES)
def test_flash_attention_equals_plain_softmax_attention(H, Hk, nq, nk, d, bq, bk, causal):
    rng = np.random.default_rng(H * 100 + nq)
    q, k, v = rng.standard_normal((H, nq, d)), rng.standard_normal((Hk, nk, d)), rng.standard_normal((Hk, nk, d))
    ref = reference_attention(q, k, v, causal)
    out, io = flash_attention(q, k, v, bq, bk, causal)
    assert np.abs(out - ref).max() < 1e-12
    assert np.abs(naive_attention(q, k, v, causal)[0] - ref).max() < 1e-12
    assert io == attention_io("flash", H, Hk, nq, nk, d, bq, bk, causal)
    assert naive_attention(q, k, v, causal)[1] == attention_io("naive", H, Hk, nq, nk, d, causal=causal)


def test_io_counts_by_hand():
    """一个头，N = 4，d = 2，块 2×2。非因果：读 Q 8 + 两个 query 块 × 两个 key 块 × (K 4 + V 4) = 40，写 8。
    因果：第一个 query 块只看第一个 key 块：读 8 + (1 + 2) × 8 = 32。普通：读 8 + 16 + 2·16 = 56，写 2·16 + 8 = 40。"""
    x = np.ones((1, 4, 2))
    assert flash_attention(x, x, x, 2, 2, causal=False)[1] == {"read": 40, "written": 8}
    assert flash_attention(x, x, x, 2, 2, causal=True)[1] == {"read": 32, "written": 8}
    assert naive_attention(x, x, x, causal=True)[1] == {"read": 56, "written": 40}


@pytest.mark.parametrize("d,M", [(64, 16384), (32, 2048), (128, 65536)])
def test_flash_io_scales_as_n2_d2_over_m(d, M):
    """M ≤ 4d² 时 B_r = B_c = M/4d：分块的计数 = 8N²d²/M + 2Nd（非因果，一个头），N → ∞ 时比值趋于 8。"""
    br, bc = flash_blocks(M, d)
    assert br == bc == M // (4 * d)
    for N in (1024, 4096, 16384):
        io = attention_io("flash", 1, 1, N, N, d, br, bc, causal=False)
        assert io["read"] + io["written"] == 8 * N * N * d * d // M + 2 * N * d
        assert attention_io("naive", 1, 1, N, N, d, causal=False) == {"read": N * d + 2 * N * d + 2 * N * N,
                                                                      "written": 2 * N * N + N * d}


def test_blocks_follow_the_paper_rule():
    assert flash_blocks(116736, 128) == (128, 228)       # H100 一个 SM 的 228 KB（BF16）
    assert flash_blocks(4096, 64) == (16, 16)


def test_online_softmax_matches_the_direct_sum():
    s = np.random.default_rng(3).standard_normal(50) * 3
    m, l = online_softmax(s, 7)[-1][1:]
    assert m == s.max() and abs(l - np.exp(s - s.max()).sum()) < 1e-12


@pytest.mark.parametrize("args,kw,match", [
    (((2, 4, 3), (2, 4, 3), (2, 5, 3)), {}, "形状"), (((3, 4, 3), (2, 4, 3), (2, 4, 3)), {}, "整数倍"),
    (((2, 6, 3), (2, 4, 3), (2, 4, 3)), {}, "不能超过"), (((2, 4, 3), (2, 4, 3), (2, 4, 3)), {"block_q": 0}, "块大小")])
def test_bad_attention_input_is_a_clear_error(args, kw, match):
    q, k, v = (np.zeros(s) for s in args)
    kw = {"block_q": 2, "block_k": 2, **kw}
    with pytest.raises(ValueError, match=match):
        flash_attention(q, k, v, kw["block_q"], kw["block_k"], causal=True)


def test_bad_io_arguments():
    with pytest.raises(ValueError, match="未知"):
        attention_io("tiled", 1, 1, 4, 4, 2)
    with pytest.raises(ValueError, match="至少"):
        flash_blocks(16, 64)


# ---- 第 2 讲 05 脚本 ----
@pytest.fixture(scope="module")
def s5():
    import contextlib
    import io
    mod = load_script("lecture02/05_flash_attention.py")
    with contextlib.redirect_stdout(io.StringIO()):
        return {name: getattr(mod, name)() for name in ("demo1_exact", "demo2_online_softmax", "demo3_io_complexity",
                                                        "demo4_h100_prefill", "demo5_decode")}


def test_script_demo1_and_2(s5):
    assert s5["demo1_exact"]["worst"] < 1e-12
    d2 = s5["demo2_online_softmax"]
    assert d2["m"] == 3.4 and abs(d2["l"] - sum(math.exp(x - 3.4) for x in
                                              [0.3, 1.2, -0.5, 0.8, 2.9, 0.1, -1.0, 2.2, 0.7, 3.4, -0.2, 1.5])) < 1e-12
    assert [t[1] for t in d2["trace"]] == [1.2, 2.9, 3.4]


def test_script_demo3_ratios(s5):
    d3 = s5["demo3_io_complexity"]
    assert d3["c_naive"] == (4.0, 4.0)
    assert 8 < d3["c_flash"][0] and d3["c_flash"][1] == pytest.approx(10.0)   # 8 + 2Nd/(N²d²/M) = 8 + 2M/(Nd)
    assert d3["ratio_4096"] == pytest.approx([(4 * 4096 ** 2 + 4 * 4096 * d) / (8 * 4096 ** 2 * d * d / M + 2 * 4096 * d)
                                              for d, M in ((64, 16384), (64, 4096), (128, 65536))])


def test_script_demo4_h100_bytes(s5):
    d4 = s5["demo4_h100_prefill"]
    assert d4["blocks"] == (128, 228)
    N, H, Hk, d = 32768, 32, 8, 128
    r = d4["res"][N]
    assert r["s_bytes"] == H * N * N * 2 == 68_719_476_736
    assert r["naive"] == H * 2 * (N * d + 2 * N * d + 2 * N * N + 2 * N * N + N * d)
    assert r["low"] == 2 * (2 * H * N * d + 2 * Hk * N * d)
    # 因果分块：第 i 个 query 块（128 行）读 min(⌈128(i+1)/228⌉ · 228, N) 行 K 和 V
    rows = sum(min(((128 * (i + 1) - 1) // 228 + 1) * 228, N) for i in range(N // 128))
    assert r["flash"] == 2 * H * (N * d + 2 * rows * d + N * d)
    assert r["flops"] == 4 * H * d * N * (N + 1) // 2
    assert d4["kv_head_bytes"] == 2 * N * d * 2


def test_script_demo5_decode_intensity(s5):
    d5 = s5["demo5_decode"]
    assert d5["group"] == 4
    r = d5["res"][32768]
    assert r["flops"] / r["kv"] == pytest.approx(4.0)
    assert r["flops"] / r["flash"] == pytest.approx(4 * 32 * 128 * 32768 / (2 * 32 * (128 + 2 * 32768 * 128 + 128)))


def test_script_demo1_io_counts_by_hand(s5):
    """演示 1 的四行 io（手算，每个头再乘头数）。
    因果 37×37、d 16、块 8×16：普通 每头 读 37·16 + 2·37·16 + 2·37² = 4514、写 2·37² + 37·16 = 3330；
    分块 五个 query 块能看到的最后一个 key 是 7、15、23、31、36 → 读 16、16、32、32、37 行 K 和 V，
    每头 2·133·16 + 2·37·16 = 5440。非因果：五块各读 37 行，每头 2·185·16 + 1184 = 7104。
    最后 5 个 query（位置 32..36）、块 4×16：两块各读 37 行，每头 2·2·37·16 + 2·5·16 = 2528；
    普通 每头 5·16 + 2·37·16 + 4·5·37 + 5·16 = 2084。9×9、d 8、一个块：分块每头 2·9·8 + 2·9·8 = 288，
    普通每头 9·8 + 2·9·8 + 4·81 + 9·8 = 612。"""
    assert s5["demo1_exact"]["io"] == [(4 * 7844, 4 * 5440), (4 * 7844, 4 * 7104), (4 * 2084, 4 * 2528),
                                       (2 * 612, 2 * 288)]


def test_script_demo3_small_block_and_demo4_shares(s5):
    assert s5["demo3_io_complexity"]["small_block"] == 16                  # ⌈4096 / (4·64)⌉
    d4 = s5["demo4_h100_prefill"]
    N, H, d = 32768, 32, 128
    rows = sum(min(((128 * (i + 1) - 1) // 228 + 1) * 228, N) for i in range(N // 128))
    assert d4["kv_share"] == pytest.approx(2 * rows / (2 * rows + 2 * N), rel=1e-12)   # 每头：K、V 行 vs Q、O 行
    r = d4["res"][N]
    assert 4 * r["s_bytes"] / r["naive"] == pytest.approx(4 * N / (4 * N + 4 * d), rel=1e-12)


def test_script_demo5_naive_minus_flash_share(s5):
    """decode：每头 普通 = 2d + 2Nd + 4N 个元素，分块 = 2d + 2Nd，差 4N。"""
    r = s5["demo5_decode"]["res"][32768]
    N, d = 32768, 128
    assert (r["naive"] - r["flash"]) / r["flash"] == pytest.approx(4 * N / (2 * d + 2 * N * d), rel=1e-12)
