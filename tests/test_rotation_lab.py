"""
rotation_lab：Hadamard 矩阵的构造（正交、元素 ±1/√n、选的底和 QuaRot 的 get_hadK 相同）、计算不变性（折叠、旋转以后
logits 只差舍入），以及每个能让不变性坏掉的错误都真的让它坏掉（漏转一个矩阵、漏折一个 norm、漏了在线的那一半）。

【容差从哪来】float64 的单位舍入 u = 2⁻⁵³ ≈ 1.1e-16。一个 k 维内积的舍入误差 ≤ γ_k·Σ|a_i||b_i|，γ_k ≈ k·u
（Higham 2002，定理 3.1）；旋转一个矩阵是每个元素一个 d 维内积，相对误差 ≤ d·u。玩具模型 d = 64、4 层：
词嵌入、lm_head 和每层 7 个矩阵共 30 个被改写的矩阵，一阶误差 ≤ 30·64·u ≈ 2e-13（相对 max|logit|），前向本身的
舍入同量级；再给 50 倍给网络对扰动的放大，断言相对误差 < TOL = 1e-11。漏转一个矩阵、漏折一个 norm 让 logits 差 1e-2
以上（下面的反例测试断言 > 1e-4），和 TOL 隔着七个数量级，所以容差的选择不影响测试能不能变红。
"""
import math

import numpy as np
import pytest

from actquant_lab import MatmulInputHook
from quant_lab import QCFG
from rotation_lab import (Kron, fold_norms, hadamard, hadamard_base, hadamard_kron, random_orthogonal,
                          rotate_down_input, rotate_heads, rotate_params)
from transformer_lab import NumpyTransformer, config_like, init_params

TOL = 1e-11
ORDERS = (1, 2, 4, 8, 12, 20, 24, 28, 36, 60, 64, 72, 576, 1536)


@pytest.mark.parametrize("n", ORDERS)
@pytest.mark.parametrize("signed", [False, True])
def test_hadamard_is_orthogonal_with_entries_plus_minus_one_over_sqrt_n(n, signed):
    """
    H Hᵀ = I 在 n ≤ 72 时直接用 float64 乘出来看（差 < 1e-13）。n = 576、1536 时改成看符号矩阵 S = sign(H)：
    元素已断言是 ±1/√n（相对差 < 1e-14），所以 H Hᵀ = S Sᵀ / n + E，E 的每个元素是 n 项、每项 < 3e-14 / n 之和，
    |E| < 3e-14；S Sᵀ = n·I 就推出 |H Hᵀ − I| < 1e-13。S 的元素是 ±1、内积的绝对值 ≤ 1536 < 2²⁴，float32 的乘加
    每一步都是精确的整数，所以 S Sᵀ == n·I 可以逐位比较（比 float64 的 H Hᵀ 少一半的时间）。
    """
    H = hadamard(n, np.random.default_rng(n) if signed else None)
    assert H.shape == (n, n)
    assert np.all(np.abs(np.abs(H) * math.sqrt(n) - 1) < 1e-14)
    if n <= 72:
        assert np.abs(H @ H.T - np.eye(n)).max() < 1e-13
    else:
        S = np.sign(H).astype(np.float32)
        assert np.array_equal(S @ S.T, n * np.eye(n, dtype=np.float32))


def test_random_signs_multiply_whole_rows():
    H0, H = hadamard(36), hadamard(36, np.random.default_rng(5))
    r = H / H0
    assert np.all(r == r[:, :1]) and set(np.unique(r)) <= {-1.0, 1.0} and len(np.unique(r)) == 2


def test_bases_are_the_ones_quarot_get_hadK_picks():
    """spcl/QuaRot fake_quant/hadamard_utils.py：576 % 36 == 0、576/36 = 16 → K = 36；1536 → K = 12；2 的幂 → K = 1。"""
    assert hadamard_base(576) == (36, 16)
    assert hadamard_base(1536) == (12, 128)
    assert hadamard_base(64) == (1, 64)
    assert hadamard_base(12) == (12, 1)


def test_order_4_is_sylvester_and_order_12_by_hand():
    H4 = hadamard(4) * 2
    assert np.array_equal(H4, [[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]])
    H12 = np.rint(hadamard(12) * math.sqrt(12)).astype(int)
    # Paley I, q = 11：二次剩余 {1, 3, 4, 5, 9}；第 0 行全 1，第 1 行 = [−1, 1, χ(1), χ(2), …, χ(10)]（I + S 的第 1 行）
    chi = [1 if a in (1, 3, 4, 5, 9) else -1 for a in range(1, 11)]
    assert list(H12[0]) == [1] * 12
    assert list(H12[1]) == [-1, 1] + chi
    assert np.array_equal(H12 @ H12.T, 12 * np.eye(12, dtype=int))


@pytest.mark.parametrize("n", [0, -4, 3, 6, 10, 92, 2.5, True, "12"])
def test_orders_it_cannot_build_raise_a_clear_value_error(n):
    with pytest.raises(ValueError, match="Hadamard|阶"):
        hadamard(n)


@pytest.mark.parametrize("n", [12, 64, 576, 1536])
def test_kron_form_is_the_same_matrix(n):
    K = hadamard_kron(n, np.random.default_rng(1))
    H = hadamard(n, np.random.default_rng(1))
    assert np.abs(K.dense() - H).max() < 1e-16          # 1/√K·1/√p 和 1/√n 只差舍入
    x = np.random.default_rng(2).standard_normal((3, 2, n))
    assert np.abs(K.right(x) - x @ H).max() < 1e-13
    assert np.abs(K.left_t(x[0].T) - H.T @ x[0].T).max() < 1e-13


def test_random_orthogonal_is_orthogonal():
    R = random_orthogonal(50, np.random.default_rng(0))
    assert np.abs(R @ R.T - np.eye(50)).max() < 1e-13


# ---------------------------------------------------------------------------
# 计算不变性（玩具模型：QCFG 的形状，norm 的权重随机，不是 1）
# ---------------------------------------------------------------------------
def toy(tied=False, unit_final=False, seed=0):
    cfg = config_like(QCFG, tied=tied)
    P = init_params(cfg, seed=seed)
    rng = np.random.default_rng(100 + seed)
    for L in P["layers"]:
        L["attn_norm"] = rng.uniform(0.2, 3.0, cfg.d_model)
        L["mlp_norm"] = rng.uniform(0.2, 3.0, cfg.d_model)
    P["final_norm"] = np.ones(cfg.d_model) if unit_final else rng.uniform(0.2, 3.0, cfg.d_model)
    if tied:
        P["lm_head"] = P["embed"].T
    toks = np.floor(np.random.default_rng(7).random((3, 20)) * cfg.vocab).astype(np.int64)
    return P, cfg, toks


def logits(P, cfg, toks, hook=None):
    m = NumpyTransformer(P, cfg)
    m.matmul_hook = hook
    return m.forward(toks)


def rel_diff(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("which", ["random", "hadamard", "kron"])
@pytest.mark.parametrize("tied", [False, True])
def test_fold_then_rotate_gives_the_same_logits(which, tied):
    P, cfg, toks = toy(tied=tied)
    ref = logits(P, cfg, toks)
    Pf, cf = fold_norms(P, cfg)
    assert rel_diff(logits(Pf, cf, toks), ref) < TOL
    Q = {"random": random_orthogonal(cfg.d_model, np.random.default_rng(3)),
         "hadamard": hadamard(cfg.d_model, np.random.default_rng(3)),
         "kron": hadamard_kron(cfg.d_model, np.random.default_rng(3))}[which]
    Pr, cr = rotate_params(Pf, cf, Q)
    assert rel_diff(logits(Pr, cr, toks), ref) < TOL
    # 残差流真的转了：词嵌入变了
    assert np.abs(Pr["embed"] - P["embed"]).max() > 0.1


def test_fold_does_not_touch_its_input_and_unties_a_tied_head():
    P, cfg, toks = toy(tied=True)
    before = {k: P["layers"][0][k].copy() for k in P["layers"][0]}
    Pf, cf = fold_norms(P, cfg)
    assert cfg.tied and not cf.tied
    assert all(np.array_equal(P["layers"][0][k], v) for k, v in before.items())
    assert np.all(Pf["final_norm"] == 1) and all(np.all(L[n] == 1) for L in Pf["layers"] for n in ("attn_norm", "mlp_norm"))
    assert np.array_equal(Pf["lm_head"], P["final_norm"][:, None] * P["embed"].T)


def test_a_tied_head_with_unit_final_norm_stays_tied_through_the_rotation():
    P, cfg, toks = toy(tied=True, unit_final=True)
    Pf, cf = fold_norms(P, cfg)
    Pr, cr = rotate_params(Pf, cf, hadamard(cfg.d_model, np.random.default_rng(0)))
    assert cr.tied and np.shares_memory(Pr["lm_head"], Pr["embed"])
    assert rel_diff(logits(Pr, cr, toks), logits(P, cfg, toks)) < TOL


def test_float32_model_keeps_its_dtype():
    P, cfg, toks = toy()
    cfg32 = config_like(cfg, dtype="float32")
    P32 = {"embed": P["embed"].astype(np.float32), "final_norm": P["final_norm"].astype(np.float32),
           "lm_head": P["lm_head"].astype(np.float32),
           "layers": [{k: v.astype(np.float32) for k, v in L.items()} for L in P["layers"]]}
    Pr, cr = rotate_params(*fold_norms(P32, cfg32), hadamard(cfg.d_model))
    assert all(v.dtype == np.float32 for L in Pr["layers"] for v in L.values()) and Pr["embed"].dtype == np.float32
    assert rel_diff(logits(Pr, cr, toks), logits(P32, cfg32, toks)) < 1e-4     # float32：u ≈ 6e-8


MATS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


@pytest.mark.parametrize("name", MATS + ("embed", "lm_head"))
def test_leaving_one_matrix_unrotated_breaks_the_model(name):
    """反例：第 1 层的一个矩阵（或词嵌入、lm_head）用旋转前的——不变性的断言必须看得出来。"""
    P, cfg, toks = toy()
    ref = logits(P, cfg, toks)
    Pf, cf = fold_norms(P, cfg)
    Pr, cr = rotate_params(Pf, cf, hadamard(cfg.d_model, np.random.default_rng(0)))
    bad = dict(Pr)
    if name in ("embed", "lm_head"):
        bad[name] = Pf[name]
    else:
        bad["layers"] = list(Pr["layers"])
        bad["layers"][1] = dict(Pr["layers"][1], **{name: Pf["layers"][1][name]})
    assert rel_diff(logits(bad, cr, toks), ref) > 1e-4


@pytest.mark.parametrize("name", ["wq", "wk", "wv", "w_gate", "w_up", "lm_head"])
def test_leaving_one_norm_weight_unfolded_breaks_the_model(name):
    """反例：norm 的权重置成 1 了、却没乘进这个矩阵（fold_norms 漏了一个）。"""
    P, cfg, toks = toy()
    ref = logits(P, cfg, toks)
    Pf, cf = fold_norms(P, cfg)
    bad = dict(Pf)
    if name == "lm_head":
        bad["lm_head"] = P["lm_head"]
    else:
        bad["layers"] = list(Pf["layers"])
        bad["layers"][2] = dict(Pf["layers"][2], **{name: P["layers"][2][name]})
    assert rel_diff(logits(bad, cf, toks), ref) > 1e-4


def test_rotating_an_unfolded_model_is_refused():
    P, cfg, _ = toy()
    with pytest.raises(ValueError, match="fold_norms"):
        rotate_params(P, cfg, hadamard(cfg.d_model))


@pytest.mark.parametrize("Q", [2 * np.eye(64), np.eye(32), np.ones((64, 64)) / 8, hadamard(64) * (1 + 1e-7)])
def test_a_matrix_that_is_not_orthogonal_or_the_wrong_shape_is_refused(Q):
    P, cfg, _ = toy()
    with pytest.raises(ValueError, match="Q"):
        rotate_params(*fold_norms(P, cfg), Q)


def test_online_down_hadamard_is_exact_only_with_its_online_half():
    P, cfg, toks = toy()
    ref = logits(P, cfg, toks)
    Hd = hadamard_kron(cfg.d_ff, np.random.default_rng(4))        # 192 = 12·16
    Pd, cd = rotate_down_input(P, cfg, Hd)
    assert rel_diff(logits(Pd, cd, toks, MatmulInputHook(online={"down": Hd})), ref) < TOL
    assert rel_diff(logits(Pd, cd, toks, MatmulInputHook(online={"down": Hd.dense()})), ref) < TOL
    assert rel_diff(logits(Pd, cd, toks), ref) > 1e-4


def test_head_wise_value_output_rotation_is_exact_and_changes_the_o_proj_input():
    P, cfg, toks = toy()
    ref = logits(P, cfg, toks)
    Hh = hadamard(cfg.head_dim, np.random.default_rng(9))
    Pv, cv = rotate_heads(P, cfg, Hh)
    rec0, rec1 = {}, {}
    assert rel_diff(logits(P, cfg, toks, MatmulInputHook(record=rec0)), ref) == 0
    assert rel_diff(logits(Pv, cv, toks, MatmulInputHook(record=rec1)), ref) < TOL
    a0, a1 = rec0[("o_proj", 0)][0], rec1[("o_proj", 0)][0]
    blk = np.kron(np.eye(cfg.n_heads), Hh)
    assert np.abs(a1 - a0 @ blk).max() < 1e-12 * np.abs(a0).max()
    # 只转 V、不转 O（wo 还是原来的）就错了
    bad = dict(Pv)
    bad["layers"] = [dict(L, wo=L0["wo"]) for L, L0 in zip(Pv["layers"], P["layers"])]
    assert rel_diff(logits(bad, cv, toks), ref) > 1e-4


def test_rotated_residual_inputs_are_the_original_ones_times_q():
    """演示 2 用 (x/rms)·Q 代替旋转模型自己的输入：在玩具上核对它们就是旋转模型的钩子看到的。"""
    P, cfg, toks = toy()
    Pf, cf = fold_norms(P, cfg)
    Q = hadamard(cfg.d_model, np.random.default_rng(0))
    Pr, cr = rotate_params(Pf, cf, Q)
    r0, r1 = {}, {}
    logits(Pf, cf, toks, MatmulInputHook(record=r0))
    logits(Pr, cr, toks, MatmulInputHook(record=r1))
    for key in (("qkv", 0), ("gate_up", 3)):
        x0, x1 = r0[key][0], r1[key][0]
        assert np.abs(x1 - x0 @ Q).max() < 1e-12 * np.abs(x0).max()


def test_kron_with_bad_factors_is_refused():
    P, cfg, _ = toy()
    with pytest.raises(ValueError):
        rotate_params(*fold_norms(P, cfg), Kron(2 * np.eye(8), np.eye(8)))
    with pytest.raises(ValueError):
        rotate_down_input(P, cfg, hadamard_kron(64))
