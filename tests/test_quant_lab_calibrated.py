"""
quant_lab 的"看数据的量化"（第 3 讲 05 用）：新方案（int3-g32、int4-g32-zp、nvfp4）、校准激活的采集、GPTQ、AWQ。

核对的方法：GPTQ 用两个输入维的闭式补偿手算；XᵀX 是对角阵时没有可补偿的，GPTQ 必须逐位等于就近舍入（每个方案的
"量化一行"的代码和 numfmt 的整块量化是两条独立的路）；AWQ 在 a = 0 时就是就近舍入，独立地算出就近舍入的校准误差；
采集激活的朴素前向和 NumpyTransformer（融合、并进 norm、复数 RoPE 的写法）比 logits。
"""
import numpy as np
import pytest

from quant_lab import (INPUT_OF, LAYER_MATRICES, QCFG, SCHEMES, awq_quantize, awq_search, compare_logits, gptq_quantize,
                       layer_inputs, output_error, quantize_matrix, sample_tokens, with_salient_channels)
from transformer_lab import NumpyTransformer, init_params


def fp16(x):
    return np.asarray(x, dtype=np.float64).astype(np.float16).astype(np.float64)


@pytest.fixture(scope="module")
def qcfg():
    P = init_params(QCFG, seed=0)
    calib = sample_tokens(P, QCFG, n_seq=8, length=64, seed=1)
    held = sample_tokens(P, QCFG, n_seq=8, length=64, seed=2)
    return P, calib, layer_inputs(P, QCFG, calib), layer_inputs(P, QCFG, held)[1]


def test_new_schemes_bits_and_values():
    w = np.random.default_rng(0).standard_normal((64, 6))
    wq, bits = quantize_matrix(w, "int3-g32")
    b = w.T.reshape(6, 2, 32)
    s = fp16(np.abs(b).max(axis=-1, keepdims=True) / 3)
    assert np.array_equal(wq, (np.clip(np.round(b / s), -3, 3) * s).reshape(6, 64).T) and bits == 3.5
    wz, bits = quantize_matrix(w, "int4-g32-zp")
    lo, hi = np.minimum(b.min(-1, keepdims=True), 0), np.maximum(b.max(-1, keepdims=True), 0)
    s = fp16((hi - lo) / 15)
    z = np.round(-lo / s)
    assert np.array_equal(wz, ((np.clip(np.round(b / s) + z, 0, 15) - z) * s).reshape(6, 64).T) and bits == 4.625
    assert quantize_matrix(w, "nvfp4")[1] == 4.5


def test_layer_inputs_are_the_same_model(qcfg):
    P, calib, (logits, acts), _ = qcfg
    assert np.abs(logits - NumpyTransformer(P, QCFG).forward(calib)).max() < 1e-12
    # 残差流 = 词嵌入 + 每层两条支路的输出：用采到的 attn_out、mlp_act 重建最后的 logits
    x = P["embed"][calib].reshape(-1, QCFG.d_model)
    for L, A in zip(P["layers"], acts):
        x = x + A["attn_out"] @ L["wo"] + A["mlp_act"] @ L["w_down"]
    h = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + QCFG.norm_eps)
    assert np.abs(h @ P["lm_head"] - logits.reshape(h.shape[0], -1)).max() < 1e-10
    e = P["embed"][calib].reshape(-1, QCFG.d_model)
    assert np.abs(acts[0]["attn_in"] - e / np.sqrt((e ** 2).mean(-1, keepdims=True) + QCFG.norm_eps)).max() < 1e-12


def test_gptq_two_inputs_closed_form():
    # int4 每通道：scale = 0.875 / 7 = 0.125。第 0 行 0.3 → 0.25，δ₀ = 0.05；H₀₁ / H₁₁ = 0.5 / 0.25 = 2，
    # 第 1 行先补偿成 −0.875 + 2 × 0.05 = −0.775，再舍入 → −0.75（就近舍入是 −0.875）
    w = np.array([[0.3], [-0.875]])
    x = np.array([[1.0, 0.0], [1.0, 0.5]])
    got = gptq_quantize(w, x, "int4", damp=0)
    assert np.allclose(got, [[0.25], [-0.75]], rtol=0, atol=1e-15)
    rtn = quantize_matrix(w, "int4")[0]
    assert np.allclose(rtn, [[0.25], [-0.875]], rtol=0, atol=1e-15)
    assert np.allclose(x @ (w - got), [[0.05], [-0.0125]], rtol=0, atol=1e-15)      # 误差 [0.05, −0.0125]
    assert np.allclose(x @ (w - rtn), [[0.05], [0.05]], rtol=0, atol=1e-15)


def gptq_obs(w, x, qmax, g, damp):
    """
    GPTQ 的第二种写法（论文式 (2)(3) 的 OBS 形式，不用 Cholesky）：H = 2XᵀX + λI，λ = damp · mean(diag(2XᵀX))；
    每量化一行，用 H⁻¹ 的第 i 列补偿后面的行，再从 H⁻¹ 里消去第 i 个输入维；分组的 scale 在走到每组的第一行时定。
    """
    n = w.shape[0]
    H = 2 * x.T @ x
    H = H + damp * np.mean(np.diag(H)) * np.eye(n)
    Hinv = np.linalg.inv(H)
    W, Q = w.copy(), np.zeros_like(w)
    for i in range(n):
        if i % g == 0:
            s = fp16(np.abs(W[i:i + g]).max(axis=0) / qmax)
        Q[i] = np.clip(np.round(W[i] / s), -qmax, qmax) * s
        W[i + 1:] -= np.outer(Hinv[i + 1:, i], (W[i] - Q[i]) / Hinv[i, i])
        Hinv = Hinv - np.outer(Hinv[:, i], Hinv[i, :]) / Hinv[i, i]
    return Q


@pytest.mark.parametrize("scheme,qmax,g,damp", [("int4-g32", 7, 32, 0.01), ("int3-g32", 3, 32, 0.5),
                                                ("int4", 7, 64, 0.1)])
def test_gptq_matches_obs_form_with_damping_and_group_scales(scheme, qmax, g, damp):
    """λ = damp × mean(diag H)、分组 scale 在走到每组时用补偿过的权重定：和不用 Cholesky 的 OBS 写法逐个比。"""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((200, 64)) @ (np.eye(64) + 0.3 * rng.standard_normal((64, 64)))   # 输入之间相关
    w = rng.standard_normal((64, 24)) * 0.1
    got = gptq_quantize(w, x, scheme, damp=damp)
    assert np.allclose(got, gptq_obs(w, x, qmax, g, damp), rtol=0, atol=1e-12)
    assert not np.allclose(got, quantize_matrix(w, scheme)[0])                  # 补偿确实改变了结果


@pytest.mark.parametrize("scheme", sorted(s for s in SCHEMES if s != "int4-g128"))
def test_gptq_equals_rtn_when_inputs_are_uncorrelated(scheme):
    w = np.random.default_rng(1).standard_normal((64, 48)) * 0.1
    x = 3.0 * np.eye(64)                       # XᵀX 对角：没有可以补偿的方向
    assert np.array_equal(gptq_quantize(w, x, scheme), quantize_matrix(w, scheme)[0])


@pytest.mark.parametrize("scheme", ["int4-g32", "int3-g32"])
def test_gptq_beats_rtn_on_every_qcfg_matrix_held_out(qcfg, scheme):
    P, _, (_, acts), held = qcfg
    for li, L in enumerate(P["layers"]):
        for m in LAYER_MATRICES:
            x, xh = acts[li][INPUT_OF[m]], held[li][INPUT_OF[m]]
            rtn = output_error(xh, L[m], quantize_matrix(L[m], scheme)[0])
            assert output_error(xh, L[m], gptq_quantize(L[m], x, scheme)) < rtn, (li, m)


@pytest.mark.parametrize("scheme", ["int4-g32", "int3-g32"])
def test_awq_never_worse_than_rtn_on_calibration_data(qcfg, scheme):
    P, _, (_, acts), _ = qcfg
    for li, L in enumerate(P["layers"]):
        for m in LAYER_MATRICES:
            x = acts[li][INPUT_OF[m]]
            wq, a, errs = awq_search(L[m], x, scheme)
            rtn = quantize_matrix(L[m], scheme)[0]
            e_rtn = np.linalg.norm(x @ (rtn - L[m])) ** 2 / np.linalg.norm(x @ L[m]) ** 2
            assert errs[0] == pytest.approx(e_rtn, rel=1e-9)                     # a = 0 就是就近舍入
            assert np.linalg.norm(x @ (wq - L[m])) ** 2 / np.linalg.norm(x @ L[m]) ** 2 <= e_rtn * (1 + 1e-9)
            assert errs.min() == pytest.approx(errs[int(round(a * 20))]) and len(errs) == 20


def test_awq_helps_where_channels_are_salient(qcfg):
    P, calib, _, _ = qcfg
    P2 = with_salient_channels(P, [3, 17, 40, 55], 10.0)
    logits2, acts2 = layer_inputs(P2, QCFG, calib)
    assert np.abs(logits2 - qcfg[2][0]).max() < 1e-10                             # 同一个函数
    x, w = acts2[0]["attn_in"], P2["layers"][0]["wq"]
    assert np.allclose(x[:, 3], 10.0 * qcfg[2][1][0]["attn_in"][:, 3])
    rtn = output_error(x, w, quantize_matrix(w, "int4-g32")[0])
    assert output_error(x, w, awq_quantize(w, x, "int4-g32")) < 0.7 * rtn


def test_bad_inputs_raise_clear_errors():
    w = np.random.default_rng(2).standard_normal((4, 3))
    x = np.random.default_rng(3).standard_normal((20, 4))
    with pytest.raises(ValueError, match="校准激活"):
        gptq_quantize(w, x[:, :3], "int4")
    with pytest.raises(ValueError, match="校准激活"):
        awq_quantize(w, x.T, "int4")
    x0 = x.copy()
    x0[:, 2] = 0.0
    with pytest.raises(ValueError, match="奇异"):
        gptq_quantize(w, x0, "int4", damp=0)
    assert np.all(np.isfinite(gptq_quantize(w, x0, "int4", damp=0.01)))          # 加阻尼就可以
    with pytest.raises(ValueError, match="未知的量化方案"):
        gptq_quantize(w, x, "int5")
    with pytest.raises(ValueError, match="未知的量化方案"):
        awq_quantize(w, x, "int5")
    with pytest.raises(ValueError, match="damp"):
        gptq_quantize(w, x, "int4", damp=-1)
    with pytest.raises(ValueError, match="grid"):
        awq_quantize(w, x, "int4", grid=0)


def test_compare_logits_hand_case():
    # 一条序列两个位置、词表 2：只算第一个位置 p = (0.6, 0.4)、q = (0.3, 0.7)，下一个 token 是 1
    ref = np.log(np.array([[[0.6, 0.4], [0.9, 0.1]]]))
    q = np.log(np.array([[[0.3, 0.7], [0.1, 0.9]]]))
    r = compare_logits(ref, q, np.array([[0, 1]]))
    assert r["kl"] == pytest.approx(0.6 * np.log(0.6 / 0.3) + 0.4 * np.log(0.4 / 0.7))
    assert r["agree"] == 0.0
    assert r["ppl_ref"] == pytest.approx(1 / 0.4) and r["ppl"] == pytest.approx(1 / 0.7)
    same = compare_logits(ref, ref, np.array([[0, 1]]))
    assert same["kl"] == 0.0 and same["agree"] == 1.0
