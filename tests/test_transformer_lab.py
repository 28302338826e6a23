"""
transformer_lab：缓存 == 一次算完（float64，断言最大绝对误差 < 1e-12）；回滚后再喂 == 新算；
真实运行的账本 == analytic_ops（逐算子、逐字段，预填充和 decode，GQA / MHA / MQA）。
"""
import numpy as np
import pytest

from transformer_lab import (ATTN_CORE_OPS, MATMUL_OPS, Counter, LMConfig, NumpyTransformer, analytic_ops,
                             config_like, init_params, sample_inverse_cdf, softmax, sum_rows)

CONFIGS = [LMConfig(name="gqa"), LMConfig(name="mha", n_kv_heads=4), LMConfig(name="mqa", n_kv_heads=1),
           LMConfig(name="odd", vocab=37, d_model=24, n_layers=3, n_heads=6, n_kv_heads=3, head_dim=4, d_ff=40)]
TOL = 1e-12  # float64：缓存与一次算完只差舍入（实测约 3e-15）


def _model(cfg, seed=0):
    return NumpyTransformer(init_params(cfg, seed), cfg)


def _toks(cfg, B, n, seed=1):
    return (np.random.default_rng(seed).random((B, n)) * cfg.vocab).astype(int)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
def test_kv_cache_decode_equals_full_forward(cfg):
    m = _model(cfg)
    toks = _toks(cfg, 3, 24)
    full = m.forward(toks)
    cache = m.new_cache(3)
    parts = [m.forward(toks[:, :7], cache)]
    for i in range(7, 24):
        parts.append(m.forward(toks[:, i:i + 1], cache))
    inc = np.concatenate(parts, axis=1)
    assert full.dtype == np.float64
    assert np.abs(inc - full).max() < TOL
    assert (inc.argmax(-1) == full.argmax(-1)).all()


@pytest.mark.parametrize("cfg", CONFIGS[:2], ids=lambda c: c.name)
def test_rollback_then_refeed_matches_fresh_pass(cfg):
    m = _model(cfg)
    toks = _toks(cfg, 2, 30)
    other = _toks(cfg, 2, 30, seed=9)
    full = m.forward(toks)
    cache = m.new_cache(2)
    m.forward(toks[:, :20], cache)
    m.forward(other[:, 20:26], cache)          # 6 个会被拒绝的位置
    cache.rollback(6)
    assert cache.pos == 20
    out = m.forward(toks[:, 20:30], cache)
    assert np.abs(out - full[:, 20:30]).max() < TOL
    # 缓存里的 K、V 也和新算一遍完全一样（前 30 个位置）
    fresh = m.new_cache(2)
    m.forward(toks, fresh)
    assert np.abs(cache.k[:, :, :, :30] - fresh.k[:, :, :, :30]).max() < TOL
    assert np.abs(cache.v[:, :, :, :30] - fresh.v[:, :, :, :30]).max() < TOL


def test_repeated_prompt_cache_equals_feeding_every_row():
    """KVCache.repeat：提示喂一次（批 1）、复制成 3 条，再各喂不同的后续 == 3 条各自从头喂（float64，1e-12）。"""
    cfg = CONFIGS[0]
    m = _model(cfg)
    prompt, tails = _toks(cfg, 1, 9), _toks(cfg, 3, 5, seed=4)
    one = m.new_cache(1, 14)
    m.forward(prompt, one)
    rep = one.repeat(3)
    assert (rep.batch, rep.pos, rep.max_len) == (3, 9, 14) and one.batch == 1
    got = m.forward(tails, rep)
    full = m.forward(np.concatenate([np.repeat(prompt, 3, axis=0), tails], axis=1))
    assert np.abs(got - full[:, 9:]).max() < TOL
    assert not np.shares_memory(rep.k, one.k) and not np.shares_memory(rep.v, one.v)   # 独立的数组
    with pytest.raises(ValueError, match="批为 1"):
        rep.repeat(2)
    with pytest.raises(ValueError, match="n 必须"):
        one.repeat(0)


def test_rollback_past_start_is_an_error():
    m = _model(CONFIGS[0])
    cache = m.new_cache(1)
    m.forward(_toks(CONFIGS[0], 1, 5), cache)
    with pytest.raises(ValueError, match="回滚 6 个位置超出范围"):
        cache.rollback(6)
    with pytest.raises(ValueError):
        cache.rollback(-1)


def test_sequence_longer_than_context_is_an_error():
    cfg = config_like(CONFIGS[0], max_seq=16)
    m = _model(cfg)
    with pytest.raises(ValueError, match="超过"):
        m.forward(_toks(cfg, 1, 17))
    cache = m.new_cache(1)
    m.forward(_toks(cfg, 1, 10), cache)
    with pytest.raises(ValueError, match="max_seq = 16"):
        m.forward(_toks(cfg, 1, 7), cache)
    with pytest.raises(ValueError, match="max_seq"):
        m.new_cache(1, 17)


def test_bad_config_is_an_error():
    with pytest.raises(ValueError, match="整数倍"):
        LMConfig(n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="偶数"):
        LMConfig(head_dim=7)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("B,n_new,n_past", [(1, 12, 0), (3, 1, 11), (2, 5, 9), (1, 1, 0)])
def test_ledger_of_real_run_equals_analytic_ops(cfg, B, n_new, n_past):
    m = _model(cfg)
    toks = _toks(cfg, B, n_past + n_new)
    cache = m.new_cache(B)
    if n_past:
        m.forward(toks[:, :n_past], cache)
    c = Counter()
    m.forward(toks[:, n_past:], cache, counter=c)
    counted = c.rows()
    formula = analytic_ops(cfg, B, n_new, n_past)
    assert [r["op"] for r in counted] == [r["op"] for r in formula]
    for a, b in zip(counted, formula):
        assert a == b, a["op"]


def test_ledger_accumulates_over_calls_and_after_rollback():
    cfg = CONFIGS[0]
    m = _model(cfg)
    toks = _toks(cfg, 1, 20)
    cache, c = m.new_cache(1), Counter()
    m.forward(toks[:, :10], cache, c)
    m.forward(toks[:, 10:14], cache, c)
    cache.rollback(2)
    m.forward(toks[:, 12:15], cache, c)
    for field in ("flops", "useful", "w", "kv"):
        want = sum(sum_rows(analytic_ops(cfg, 1, n, p), field) for n, p in ((10, 0), (4, 10), (3, 12)))
        assert c.total(field) == want


def test_useful_excludes_masked_half_and_softmax():
    cfg = CONFIGS[1]
    rows = analytic_ops(cfg, 1, 8, 0)
    by = {r["op"]: r for r in rows}
    hd, H = cfg.head_dim, cfg.n_heads
    assert by["attn_scores"]["flops"] == cfg.n_layers * 2 * H * 8 * 8 * hd
    assert by["attn_scores"]["useful"] == cfg.n_layers * 2 * H * (8 * 9 // 2) * hd
    assert by["attn_softmax"]["useful"] == 0


def test_matmul_flops_equal_two_times_matmul_params_per_token():
    cfg = CONFIGS[0]
    rows = analytic_ops(cfg, 2, 5, 3)
    assert sum_rows(rows, "flops", MATMUL_OPS) == 2 * 10 * cfg.to_model_config().matmul_params()
    assert sum_rows(rows, "w", MATMUL_OPS) == 2 * cfg.to_model_config().matmul_params()


def test_last_only_counts_lm_head_once_per_sequence():
    from llm_math import LLAMA31_70B
    a = analytic_ops(LLAMA31_70B, 4, 3, 10, last_only=True)
    b = analytic_ops(LLAMA31_70B, 4, 3, 10, last_only=False)
    la = [r for r in a if r["op"] == "lm_head"][0]
    lb = [r for r in b if r["op"] == "lm_head"][0]
    assert lb["flops"] == 3 * la["flops"]


def test_decode_attention_intensity_is_the_gqa_group():
    from llm_math import LLAMA31_70B
    for B in (1, 16, 1024):
        a = analytic_ops(LLAMA31_70B, B, 1, 4095, last_only=True)
        assert sum_rows(a, "useful", ATTN_CORE_OPS) / sum_rows(a, "kv", ATTN_CORE_OPS) == 8


def test_init_params_shapes_and_scales_come_from_config():
    cfg = LMConfig(d_model=64, d_ff=128, head_gain=2.0, wo_gain=0.5)
    P = init_params(cfg, seed=3)
    L = P["layers"][0]
    assert P["embed"].shape == (cfg.vocab, 64) and P["lm_head"].shape == (64, cfg.vocab)
    assert L["wq"].shape == (64, 32) and L["wk"].shape == (64, 16) and L["w_down"].shape == (128, 64)
    assert abs(P["lm_head"].std() - 2.0 / 8) < 0.03
    assert abs(L["wo"].std() - 0.5 / np.sqrt(32)) < 0.02
    P2 = init_params(cfg, seed=3)
    assert np.array_equal(P["lm_head"], P2["lm_head"])


def test_first_k_layers_make_a_shallower_model():
    cfg = CONFIGS[0]
    P = init_params(cfg, 0)
    pk = dict(P)
    pk["layers"] = P["layers"][:1]
    m = NumpyTransformer(pk, config_like(cfg, n_layers=1))
    assert m.forward(_toks(cfg, 1, 4)).shape == (1, 4, cfg.vocab)
    with pytest.raises(ValueError, match="层"):
        NumpyTransformer(pk, cfg)


def test_sample_inverse_cdf_never_picks_zero_probability():
    p = np.array([0.0, 0.5, 0.0, 0.5, 0.0])
    u = np.array([0.0, 0.25, 0.4999999, 0.5, 0.75, 1 - 1e-16])
    got = sample_inverse_cdf(np.broadcast_to(p, (6, 5)), u)
    assert list(got) == [1, 1, 1, 3, 3, 3]


def test_softmax_rows_sum_to_one():
    x = np.array([[1000.0, 0.0], [-np.inf, 0.0]])
    s = softmax(x)
    assert np.allclose(s.sum(-1), 1) and s[1, 0] == 0


# ---------------------------------------------------------------------------
# 和一个"照着公式写"的参考实现比（不融合矩阵、不用复数 RoPE、GQA 逐头循环、norm 权重不是 1）
# ---------------------------------------------------------------------------
def _reference_forward(P, cfg, toks):  # [B, n] -> [B, n, V]
    def rms(x, g):
        return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + cfg.norm_eps) * g

    def rope(x, pos):  # x: [n, hd]；HF 的 rotate_half 写法：第 i 和 i + hd/2 维成对旋转
        half = cfg.head_dim // 2
        freq = cfg.rope_theta ** (-np.arange(half) / half)
        ang = pos[:, None] * freq[None, :]
        cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
        rot = np.concatenate([-x[:, half:], x[:, :half]], -1)
        return x * cos + rot * sin

    B, n = toks.shape
    hd, H, Hkv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    pos = np.arange(n, dtype=np.float64)
    out = np.zeros((B, n, cfg.vocab))
    for b in range(B):
        x = P["embed"][toks[b]]
        for L in P["layers"]:
            h = rms(x, L["attn_norm"])
            q, k, v = h @ L["wq"], h @ L["wk"], h @ L["wv"]
            heads = []
            for i in range(H):
                j = i // (H // Hkv)                         # 第 i 个 query 头用第 j 个 KV 头
                qi = rope(q[:, i * hd:(i + 1) * hd], pos)
                kj = rope(k[:, j * hd:(j + 1) * hd], pos)
                s = qi @ kj.T / np.sqrt(hd)
                s = np.where(np.tril(np.ones((n, n))) > 0, s, -np.inf)
                w = np.exp(s - s.max(-1, keepdims=True))
                heads.append((w / w.sum(-1, keepdims=True)) @ v[:, j * hd:(j + 1) * hd])
            x = x + np.concatenate(heads, -1) @ L["wo"]
            h = rms(x, L["mlp_norm"])
            g = h @ L["w_gate"]
            x = x + (g / (1 + np.exp(-g)) * (h @ L["w_up"])) @ L["w_down"]
        out[b] = rms(x, P["final_norm"]) @ P["lm_head"]
    return out


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
def test_model_equals_a_plain_reference_implementation(cfg):
    P = init_params(cfg, seed=4)
    rng = np.random.default_rng(5)
    for L in P["layers"]:                                  # 不是 1 的 norm 权重：检查它们被正确地并进了矩阵
        L["attn_norm"] = 0.5 + rng.random(cfg.d_model)
        L["mlp_norm"] = 0.5 + rng.random(cfg.d_model)
    P["final_norm"] = 0.5 + rng.random(cfg.d_model)
    toks = _toks(cfg, 2, 13)
    want = _reference_forward(P, cfg, toks)
    got = NumpyTransformer(P, cfg).forward(toks)
    assert np.abs(got - want).max() < 1e-12


def test_sample_inverse_cdf_single_distribution_fast_path():
    p = np.array([0.0, 0.0, 0.3, 0.0, 0.7, 0.0])
    assert sample_inverse_cdf(p, 0.0) == 2
    assert sample_inverse_cdf(p, 0.2999) == 2
    assert sample_inverse_cdf(p, 0.3) == 4
    assert sample_inverse_cdf(p, 1 - 1e-17) == 4
    batch = sample_inverse_cdf(np.broadcast_to(p, (4, 6)), np.array([0.0, 0.2999, 0.3, 1 - 1e-17]))
    assert list(batch) == [2, 2, 4, 4]


# ---------------------------------------------------------------------------
# 手算的账：不经过 ELEMENTWISE_FLOPS、Counter.add 和 analytic_ops，每个数按定义写出来
# ---------------------------------------------------------------------------
HAND_CFG = LMConfig(name="hand", vocab=8, d_model=4, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=2, d_ff=6)
# B = 1 个序列，缓存里已有 n_past = 1 个位置，这次喂 n_new = 2 个：t = B·n_new = 2 个 token，被看的位置 S = 3。
# 约定（transformer_lab 的模块说明）：矩阵乘 2·行·入·出；norm 每元素 4、RoPE 3、softmax 5、SwiGLU 5、残差 1；
# 字节按 BF16（2 字节 / 数）。因果：新位置 0 看 2 个位置、新位置 1 看 3 个，共 5 对（矩形是 2 × 3 = 6 对）。
HAND_LEDGER = {           # op: (flops, useful, w, kv)
    "embed": (0, 0, 16, 0),             # 读 t·d = 2·4 = 8 个数 × 2 字节
    "attn_norm": (32, 0, 8, 0),         # 4 × t·d = 4·8；权重 d = 4 个 × 2
    "q_proj": (64, 64, 32, 0),          # 2·t·d·(H·hd) = 2·2·4·4；权重 4·4 = 16 个 × 2
    "k_proj": (32, 32, 16, 0),          # 2·2·4·(1·2)；权重 4·2 = 8 个 × 2
    "v_proj": (32, 32, 16, 0),          # 同 k_proj
    "rope": (36, 0, 0, 0),              # 3 × t·(H + Hkv)·hd = 3·2·3·2
    "attn_scores": (48, 40, 0, 12),     # 矩形 2·H·6 对·hd = 2·2·6·2；有用 2·2·5·2；读 K：S·Hkv·hd = 6 个 × 2
    "attn_softmax": (60, 0, 0, 0),      # 5 × H·n_new·S = 5·2·2·3
    "attn_av": (48, 40, 0, 12),         # 同打分；读 V 6 个 × 2
    "o_proj": (64, 64, 32, 0),          # 2·t·(H·hd)·d = 2·2·4·4
    "attn_residual": (8, 0, 0, 0),      # 1 × t·d
    "mlp_norm": (32, 0, 8, 0),
    "mlp_gate": (96, 96, 48, 0),        # 2·t·d·ff = 2·2·4·6；权重 4·6 = 24 个 × 2
    "mlp_up": (96, 96, 48, 0),
    "mlp_act": (60, 0, 0, 0),           # 5 × t·ff = 5·2·6
    "mlp_down": (96, 96, 48, 0),        # 2·t·ff·d
    "mlp_residual": (8, 0, 0, 0),
    "final_norm": (32, 0, 8, 0),
    "lm_head": (128, 128, 64, 0),       # 每个位置都算：2·t·d·V = 2·2·4·8；权重 4·8 = 32 个 × 2
}


def test_ledger_equals_a_hand_worked_closed_form():
    """真实运行的账本和 analytic_ops 共用 ELEMENTWISE_FLOPS 和 Counter.add：改错其中一个，两边一起错、仍然相等。
    这里拿一个 1 层的小配置（B = 1，n_past = 1，n_new = 2）逐格手算，两边都和手算的数比。"""
    m = _model(HAND_CFG)
    toks = _toks(HAND_CFG, 1, 3)
    cache = m.new_cache(1)
    m.forward(toks[:, :1], cache)
    c = Counter()
    m.forward(toks[:, 1:], cache, counter=c)
    hand = [dict(op=op, flops=f, useful=u, w=w, kv=kv) for op, (f, u, w, kv) in HAND_LEDGER.items()]
    assert c.rows() == hand
    assert analytic_ops(HAND_CFG, 1, 2, 1) == hand
