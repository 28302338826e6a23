"""quant_lab：QCFG 的设定、各方案的位数（含 scale）与误差的顺序、坏输入、sample_tokens 可复现。"""
import numpy as np
import pytest

from quant_lab import LAYER_MATRICES, QCFG, SCHEMES, quantize_matrix, quantize_params, sample_tokens
from transformer_lab import config_like, init_params


@pytest.fixture(scope="module")
def P():
    return init_params(QCFG, seed=0)


def test_qcfg_is_the_documented_setting():
    c = QCFG
    assert (c.vocab, c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.d_ff) == (192, 64, 4, 4, 2, 16, 192)
    assert c.max_seq >= 256
    assert (c.emb_std, c.in_gain, c.wo_gain, c.down_gain, c.head_gain) == (1.0, 1.0, 0.29, 0.44, 1.78)


def test_quantized_params_keep_structure_and_leave_p_untouched(P):
    before = P["layers"][0]["wq"].copy()
    Pq, rep = quantize_params(P, "int4-g32", include_lm_head=True)
    assert np.array_equal(P["layers"][0]["wq"], before)
    assert len(Pq["layers"]) == 4 and set(Pq["layers"][0]) == set(P["layers"][0])
    assert Pq["embed"] is P["embed"]
    assert not np.array_equal(Pq["lm_head"], P["lm_head"])
    assert len(rep["matrices"]) == 4 * len(LAYER_MATRICES) + 1
    Pq2, rep2 = quantize_params(P, "int4-g32")
    assert Pq2["lm_head"] is P["lm_head"] and len(rep2["matrices"]) == 4 * len(LAYER_MATRICES)


@pytest.mark.parametrize("scheme,bits", [("int4-g32", 4.5), ("int4-g64", 4.25), ("mxfp4", 4.25), ("mxfp8", 8.25)])
def test_bits_per_param_include_scales(P, scheme, bits):
    assert quantize_params(P, scheme)[1]["bits_per_param"] == pytest.approx(bits)


def test_per_channel_bits_depend_on_input_dim(P):
    rep = quantize_params(P, "int8")[1]
    by = {m["name"]: m["bits"] for m in rep["matrices"]}
    assert by["layers[0].wq"] == 8 + 16 / 64 and by["layers[0].w_down"] == 8 + 16 / 192


def test_error_order_matches_precision(P):
    err = {s: np.mean([m["rel_err"] for m in quantize_params(P, s)[1]["matrices"]]) for s in SCHEMES
           if s != "int4-g128"}  # QCFG 的输入维 64 不能被 128 整除
    assert err["int8"] < err["fp8-e4m3"] < err["int4-g32"] < err["int4-g64"] < err["int4"]
    assert err["mxfp8"] < err["mxfp4"]
    assert err["int8"] < 0.01


def test_unknown_scheme_lists_the_valid_ones(P):
    with pytest.raises(ValueError, match="int8, int4, int4-g128"):
        quantize_params(P, "int3")


def test_group_that_does_not_divide_names_the_matrix():
    cfg = config_like(QCFG, d_model=48, d_ff=96)
    P = init_params(cfg, seed=0)
    with pytest.raises(ValueError, match=r"layers\[0\]\.wq"):
        quantize_params(P, "int4-g32" if 48 % 32 else "int4-g128")
    with pytest.raises(ValueError, match="w_down"):
        quantize_matrix(np.ones((100, 4)), "int4-g64", "w_down")


def test_sample_tokens_is_reproducible_and_in_range(P):
    a = sample_tokens(P, QCFG, n_seq=3, length=20, seed=5)
    b = sample_tokens(P, QCFG, n_seq=3, length=20, seed=5)
    assert a.shape == (3, 20) and np.array_equal(a, b)
    assert a.min() >= 0 and a.max() < QCFG.vocab
    assert not np.array_equal(a, sample_tokens(P, QCFG, n_seq=3, length=20, seed=6))
    with pytest.raises(ValueError, match="max_seq"):
        sample_tokens(P, QCFG, 1, QCFG.max_seq + 1, 0)


def test_target_entropy_is_language_like(P):
    """QCFG 的设定说目标模型的熵约 3.8 nats（均匀分布是 ln 192 ≈ 5.26）。"""
    from decode_lab import adjust, TransformerLM
    toks = sample_tokens(P, QCFG, 8, 64, seed=0)
    p = adjust(TransformerLM(P, QCFG).full_logits(toks), 1.0)
    H = float(-(p * np.log(p)).sum(-1).mean())
    assert 3.5 < H < 4.1


def test_sample_tokens_greedy_and_bad_temperature(P):
    from decode_lab import autoregressive_generate, TransformerLM
    g = sample_tokens(P, QCFG, n_seq=2, length=12, seed=3, T=0)
    m = TransformerLM(P, QCFG)
    for row in g:
        want = autoregressive_generate(m, row[:1], 11, 0, np.random.default_rng(0))
        assert np.array_equal(row[1:], want)
    with pytest.raises(ValueError, match="T = 0"):
        sample_tokens(P, QCFG, 1, 5, 0, T=-1)


@pytest.mark.parametrize("T", [None, 1.0, 0.5, 2.0])
def test_sample_tokens_follow_tempered_softmax_of_a_full_pass(P, T):
    """
    sample_tokens 抽的每个 token = 用同一串均匀数，在 softmax(logits / T) 上做 CDF 反查；logits 来自不带 KV cache 的
    整段前向（另一条计算路径），softmax 和反查在这里手写。T = None 表示不传（默认必须是温度 1）。
    以前的测试只拿默认值和 T = 1.0 比（同一个函数比自己），logits * T 这种错也抓不住。
    """
    from decode_lab import TransformerLM
    n_seq, length, seed = 2, 9, 4
    toks = sample_tokens(P, QCFG, n_seq, length, seed) if T is None else sample_tokens(P, QCFG, n_seq, length, seed, T=T)
    temp = 1.0 if T is None else T
    full = TransformerLM(P, QCFG).full_logits(toks)            # [n_seq, length, V]：位置 t 的 logits 预测 t + 1
    rng = np.random.default_rng(seed)
    u0 = rng.random(n_seq)
    assert np.array_equal(toks[:, 0], np.floor(u0 * QCFG.vocab).astype(int))   # 第一个 token：均匀分布的反查
    for t in range(1, length):
        u = rng.random(n_seq)
        for i in range(n_seq):
            z = full[i, t - 1] / temp
            p = np.exp(z - z.max())
            c = np.cumsum(p / p.sum())
            want = int(np.argmax(c > u[i]))                     # 第一个累积概率 > u 的下标
            assert toks[i, t] == want, (T, i, t)
