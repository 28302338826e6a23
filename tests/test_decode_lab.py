"""
decode_lab：投机采样的精确性（精确枚举 + 有种子的统计检验 + T = 0 逐 token 相同）、回滚后的缓存、
目标模型的账本 == 公式、Leviathan 的公式（表 1 逐格、最优 γ、推论 3.9、α = 1 的极限）、边界上的 ValueError。
"""
import math
import warnings

import numpy as np
import pytest

from decode_lab import (acceptance_rate, adjust, autoregressive_generate, NGramLM, residual_distribution,
                        speculative_generate, speculative_step_probs, TransformerLM)
from spec_math_lab import best_gamma, expected_tokens, ops_factor, truncated_geometric, walltime_speedup
from stats_lab import chi2_gof, chi2_sf
from context_memo import ContextMemoLM
from sampler_cases import HAND_CASES, TINY, dist as _dist
from transformer_lab import MATMUL_OPS, Counter, analytic_ops, config_like, init_params, sum_rows



# ---------------------------------------------------------------------------
# 一步接受 / 拒绝：精确枚举
# ---------------------------------------------------------------------------
HAND = HAND_CASES


@pytest.mark.parametrize("name", list(HAND))
def test_one_step_output_distribution_is_exactly_the_target(name):
    p, q = HAND[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = speculative_step_probs(p, q)
    assert not np.isnan(out).any()
    assert np.abs(out - p).max() < 1e-15


def test_one_step_exact_on_random_pairs():
    rng = np.random.default_rng(0)
    for _ in range(200):
        V = 2 + int(rng.random() * 10)
        p = rng.random(V) ** 3 * (rng.random(V) > 0.3)
        q = rng.random(V) ** 3 * (rng.random(V) > 0.3)
        if p.sum() == 0 or q.sum() == 0:
            continue
        p, q = p / p.sum(), q / q.sum()
        assert np.abs(speculative_step_probs(p, q) - p).max() < 1e-14


def test_residual_guard_when_p_equals_q():
    p = _dist([1, 2, 3])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = residual_distribution(p, p.copy())
    assert np.array_equal(r, p)
    assert np.allclose(residual_distribution(_dist([3, 1, 0]), _dist([1, 1, 1])), [1.0, 0, 0])


def test_acceptance_rate_is_one_minus_total_variation():
    rng = np.random.default_rng(1)
    for _ in range(20):
        p, q = _dist(rng.random(7)), _dist(rng.random(7))
        assert acceptance_rate(p, q) == pytest.approx(1 - 0.5 * np.abs(p - q).sum(), abs=1e-15)


# ---------------------------------------------------------------------------
# 整个生成器：有种子的统计检验、T = 0、回滚、账本
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_models():
    P = init_params(TINY, seed=0)
    target = TransformerLM(P, TINY, "目标")
    other = TransformerLM(init_params(TINY, seed=5), TINY, "另一个")
    pk = dict(P)
    pk["layers"] = P["layers"][:1]
    shallow = TransformerLM(pk, config_like(TINY, n_layers=1), "前1层")
    rng = np.random.default_rng(3)
    bigram = NGramLM.fit((rng.random((4, 30)) * 6).astype(int), 6)
    return target, {"另一个模型": other, "前 1 层": shallow, "二元语法表": bigram}


@pytest.fixture(scope="module")
def memo_models(tiny_models):
    """
    tiny_models 的同一组模型，transformer 换成按上下文记住 logits 的版本（tests/context_memo.py：带缓存的每一行 ==
    一次算完这一行能看到的 token，同一个上下文只算一次；带缓存和一次算完的相等由 test_cached_rolled_back_decoding_
    equals_full_logits 核对）。统计检验要抽几千次，这样前向只算几百次；抽样的每一步看到的分布和原模型的只差舍入。
    """
    target, drafts = tiny_models
    return ContextMemoLM(target), {k: d if isinstance(d, NGramLM) else ContextMemoLM(d) for k, d in drafts.items()}


def _tempered(logits, T):  # [..., V] -> [..., V]
    """
    温度 T > 0 下的分布，直接写出来（不调用 adjust）：exp(l/T) / Σ exp(l/T)，先减去每行的最大值防溢出。
    logits 可以是 −inf（概率为 0 的 token）。
    """
    z = np.asarray(logits, dtype=float) / T
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _exact_joint(target, prompt, T):
    """目标模型前两个新 token 的精确联合分布 [V, V]（用 full_logits 和上面独立写的 _tempered 算，不用 adjust）。"""
    V = target.cfg.vocab
    p1 = _tempered(target.full_logits(np.array([prompt]))[0, -1], T)
    seqs = np.array([list(prompt) + [a] for a in range(V)])
    p2 = _tempered(target.full_logits(seqs)[:, -1], T)
    return p1[:, None] * p2


# 每个情形抽几次。检出力（算出来的，不是估的）：两种典型的错——不做拒绝（输出就是草稿的分布）、拒绝后从 p 重抽
# （不用残差）——只看第一个 token 的边缘分布，它离目标的 χ² 距离 D 就已经给出非中心参数 λ = N·D 的下界（χ² 是
# f-散度：边缘的不超过联合的）。自由度按最多的 35 算（临界值 66.6，p = 1e-3），N = 2000 时四个情形、两种错的 λ 最小
# 100（"另一个模型"、T = 0.7、从 p 重抽），非中心 χ²₃₅(100) 超过 66.6 的机会 ≥ 0.9999（numpy 的 noncentral_chisquare
# 抽 20 万次）；N = 3000（以前）时 λ ≥ 150，也是 ≥ 0.9999。少抽三分之一，这两种错照样几乎必被抓住；更小的偏差
# 检出力按 λ ∝ N 降，那是少抽的代价。
N_JOINT = 2000


@pytest.mark.parametrize("draft_name,gamma,T", [("另一个模型", 2, 1.0), ("前 1 层", 1, 1.0), ("二元语法表", 3, 1.0),
                                                ("另一个模型", 3, 0.7)])
def test_speculative_joint_distribution_matches_target(memo_models, draft_name, gamma, T):
    target, drafts = memo_models
    prompt = [1, 4, 2]
    exact = _exact_joint(target, prompt, T)
    rng = np.random.default_rng(42)
    counts = np.zeros((6, 6))
    for _ in range(N_JOINT):
        out, _ = speculative_generate(target, drafts[draft_name], prompt, 2, gamma, T, rng)
        counts[out[0], out[1]] += 1
    stat, dof, pval = chi2_gof(counts, exact)
    assert pval > 1e-3, (stat, dof, pval)


def test_a_biased_sampler_is_caught_by_the_same_statistic(memo_models):
    """回归保护：检验要有检出力——直接用草稿的分布抽样（不做拒绝）必须被判为不一致。"""
    target, drafts = memo_models
    prompt = [1, 4, 2]
    exact = _exact_joint(target, prompt, 1.0)
    rng = np.random.default_rng(42)
    counts = np.zeros((6, 6))
    for _ in range(3000):
        out = autoregressive_generate(drafts["另一个模型"], prompt, 2, 1.0, rng)
        counts[out[0], out[1]] += 1
    assert chi2_gof(counts, exact)[2] < 1e-6


def _context_free(probs):
    """
    上下文无关的模型：每一行都是 log probs 的 NGramLM（前一个 token 是什么都一样）。概率为 0 的 token 是 −inf。
    这样每个位置的分布都一样，生成的 token 独立同分布，检验很有力。
    """
    probs = np.asarray(probs, dtype=float)
    row = np.full(len(probs), -np.inf)
    row[probs > 0] = np.log(probs[probs > 0])
    return NGramLM(np.tile(row, (len(probs), 1)))


CHI2_3DOF_1E3 = 16.266   # 自由度 3 的 χ² 分布的 0.999 分位点（查表；scipy.stats.chi2.isf(1e-3, 3) = 16.2662）


def _pearson_by_hand(counts, probs):
    """Pearson χ² = Σ (观测 − 期望)² / 期望，每个格子的期望都够大时不用合并（这里 4 个格子，期望都上千）。"""
    n = float(np.sum(counts))
    return sum((o - n * p) ** 2 / (n * p) for o, p in zip(counts, probs))


def test_speculative_on_context_free_tables_at_T07_matches_tempered_target():
    """
    回归保护（issue 8）：T = 0.7 时输出要服从**独立地**按温度调过的目标分布 p^(1/T) / Σ p^(1/T)。
    p = [.4, .3, .2, .1]、q 倒过来，γ = 3，约 2 万个 token。这个检验抓得住两个不动其它测试的错误：
    adjust 用 logits·T 代替 logits / T（目标变成 p^0.7：χ² 上千），以及草稿按 T 抽、接受 / 残差却用 T = 1 的 q
    （输出的 TV 约 0.017：期望 χ² 约 50）。
    """
    p = [0.4, 0.3, 0.2, 0.1]
    T = 0.7
    want = np.array([x ** (1 / T) for x in p])
    want = want / want.sum()
    target, draft = _context_free(p), _context_free(p[::-1])
    rng = np.random.default_rng(8)
    counts = np.zeros(4)
    while counts.sum() < 20000:
        out, _ = speculative_generate(target, draft, [0], 250, 3, T, rng)
        counts += np.bincount(out, minlength=4)
    assert _pearson_by_hand(counts, want) < CHI2_3DOF_1E3, counts


def test_adjust_at_fractional_temperatures_is_softmax_of_logits_over_T():
    """回归保护：adjust 把温度用成 logits·T（而不是 logits / T）时，只测 T = 0、1 的测试都看不出来。"""
    lg = np.array([[2.0, 1.0, 0.5, -1.0], [0.0, 0.3, -0.2, 4.0]])
    for T in (0.5, 0.7, 2.0):
        for row, got in zip(lg, adjust(lg, T)):
            w = [math.exp(x / T) for x in row]
            assert got == pytest.approx([x / sum(w) for x in w], rel=1e-12)
    # 手算的一格：T = 0.5 时 logits [1, 0] 的概率 = e² / (e² + 1)
    assert adjust(np.array([1.0, 0.0]), 0.5)[0] == pytest.approx(math.e ** 2 / (math.e ** 2 + 1), rel=1e-14)


class _ZeroRng:
    """每次 random() 都返回 0.0 的"随机数"：r = 0 时才分得清 r·q(x) < p(x) 和 r·q(x) <= p(x)。"""

    def random(self):
        return 0.0


def test_draft_token_the_target_cannot_produce_is_rejected_even_when_r_is_zero():
    """
    回归保护：接受条件是 r·q(x) < p(x)（严格小于）。p(x) = 0 的草稿 token 在 r = 0 时若用 <= 就会被接受，
    输出了目标永远不会产生的 token。r 恒为 0：草稿总抽到 token 0（CDF 反查取第一个正概率），目标在 0 上概率为 0，
    必须拒绝，残差 max(0, p − q) 只在 token 1 上有质量。
    """
    target = _context_free([0.0, 0.5, 0.5, 0.0])
    draft = _context_free([0.5, 0.0, 0.0, 0.5])
    out, st = speculative_generate(target, draft, [2], 6, 2, 1.0, _ZeroRng())
    assert out.tolist() == [1] * 6
    assert st["accepted"] == [0] * 6
    # 同样的 r = 0，但草稿抽到的 token 目标也有：p(x) > 0 = r·q(x)，一定接受
    out, st = speculative_generate(target, _context_free([0.0, 1.0, 0.0, 0.0]), [2], 6, 2, 1.0, _ZeroRng())
    assert out.tolist() == [1] * 6 and st["accepted"] == [2, 2]


@pytest.fixture(scope="module")
def tiny_greedy(tiny_models):
    """tiny_models 的目标在提示 [0, 3] 上自己的贪心解码（40 个 token）：下面 5 个 γ 共用这一份。"""
    return autoregressive_generate(tiny_models[0], [0, 3], 40, 0, np.random.default_rng(0))


@pytest.mark.parametrize("gamma", [1, 2, 3, 5, 8])
def test_greedy_speculative_equals_greedy_target(tiny_models, tiny_greedy, gamma):
    target, drafts = tiny_models
    want = tiny_greedy
    for d in drafts.values():
        got, st = speculative_generate(target, d, [0, 3], 40, gamma, 0, np.random.default_rng(1))
        assert np.array_equal(got, want)
        assert all(0 <= a <= gamma for a in st["accepted"])


def test_greedy_speculative_on_qcfg_equals_greedy_target():
    from quant_lab import QCFG, quantize_params
    P = init_params(QCFG, seed=0)
    target = TransformerLM(P, QCFG)
    draft = TransformerLM(quantize_params(P, "int4-g32", include_lm_head=True)[0], QCFG)
    prompt = [5, 17, 99]
    want = autoregressive_generate(target, prompt, 60, 0, np.random.default_rng(0))
    for g in (1, 4, 8):
        got, _ = speculative_generate(target, draft, prompt, 60, g, 0.0, np.random.default_rng(0))
        assert np.array_equal(got, want)


class _SpyLM(TransformerLM):
    """记下目标模型每次前向喂进去的 token（连同上下文）和得到的 logits。"""

    def __init__(self, *a):
        super().__init__(*a)
        self.log = []

    def forward(self, toks, cache=None, counter=None):
        past = 0 if cache is None else cache.pos
        out = super().forward(toks, cache, counter)
        if cache is not None:
            self.log.append((past, np.asarray(toks)[0].copy(), out[0].copy()))
        return out


def test_cached_rolled_back_decoding_equals_full_logits(tiny_models):
    target, drafts = tiny_models
    spy = _SpyLM(target.params, target.cfg, "spy")
    prompt = [2, 2, 5]
    out, st = speculative_generate(spy, drafts["另一个模型"], prompt, 30, 4, 1.0, np.random.default_rng(7))
    final = prompt + [int(t) for t in out]
    full = target.full_logits(np.array([final]))[0]
    context = []
    checked = 0
    for past, toks, rows in spy.log:
        context = context[:past] + list(toks)     # 回滚后缓存里只有前 past 个位置
        for j in range(len(toks)):
            pos = past + j
            if pos < len(final) and context[:pos + 1] == final[:pos + 1]:
                assert np.abs(rows[j] - full[pos]).max() < 1e-12
                checked += 1
    assert checked >= len(final) - 1
    assert sum(st["accepted"]) < 4 * len(st["accepted"])   # 确实发生过拒绝和回滚


def test_target_ledger_equals_analytic_sum_over_rounds(tiny_models):
    target, drafts = tiny_models
    prompt = [1, 2, 3, 4]
    c = Counter()
    gamma = 3
    out, st = speculative_generate(target, drafts["前 1 层"], prompt, 25, gamma, 1.0, np.random.default_rng(3),
                                   counter_t=c)
    rows, seq_len = [], len(prompt)
    for r, a in enumerate(st["accepted"]):
        past = 0 if r == 0 else seq_len - 1
        n = seq_len + gamma - past
        rows += analytic_ops(TINY, 1, n, past)
        seq_len += a + 1
    assert st["target_calls"] == len(st["accepted"])
    for field in ("flops", "useful", "w", "kv"):
        assert c.total(field) == sum_rows(rows, field)
    assert c.total("w", MATMUL_OPS) == st["target_calls"] * 2 * TINY.to_model_config().matmul_params()


def test_autoregressive_first_pass_covers_prompt(tiny_models):
    target, _ = tiny_models
    c = Counter()
    out = autoregressive_generate(target, [1, 2, 3], 5, 1.0, np.random.default_rng(0), counter=c)
    assert len(out) == 5
    per_tok = 2 * TINY.to_model_config().matmul_params()
    assert c.total("flops", MATMUL_OPS) == (3 + 4) * per_tok


def test_output_is_cut_at_n_new_and_draws_are_reproducible(tiny_models):
    target, drafts = tiny_models
    a, sa = speculative_generate(target, drafts["二元语法表"], [1], 13, 8, 1.0, np.random.default_rng(9))
    b, sb = speculative_generate(target, drafts["二元语法表"], [1], 13, 8, 1.0, np.random.default_rng(9))
    assert len(a) == 13 and np.array_equal(a, b) and sa == sb


def test_adjust_temperature_zero_is_one_hot_and_negative_is_error():
    lg = np.array([[1.0, 3.0, 3.0], [0.0, -1.0, 5.0]])
    assert np.array_equal(adjust(lg, 0), [[0, 1, 0], [0, 0, 1]])
    assert np.allclose(adjust(lg, 1).sum(-1), 1)
    with pytest.raises(ValueError, match="T = 0"):
        adjust(lg, -0.5)


def test_ngram_fit_is_add_k_smoothed_log_probs():
    toks = np.array([[0, 1, 0, 1, 2]])
    m = NGramLM.fit(toks, 3, k=0.1)
    assert np.allclose(np.exp(m.table).sum(1), 1)
    assert np.exp(m.table[0, 1]) == pytest.approx((2 + 0.1) / (2 + 0.3))
    assert m.table[np.array([[0, 1]])].shape == (1, 2, 3)


@pytest.mark.parametrize("kwargs,msg", [
    (dict(gamma=0), "γ 必须是 ≥ 1"), (dict(gamma=-2), "γ"), (dict(gamma=1.5), "γ"),
    (dict(T=-1.0), "T"), (dict(n_new=0), "n_new"), (dict(prompt=list(range(6)) * 11), "上下文"),
])
def test_generation_bad_arguments(tiny_models, kwargs, msg):
    target, drafts = tiny_models
    args = dict(prompt=[1, 2], n_new=4, gamma=2, T=1.0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=msg):
        speculative_generate(target, drafts["二元语法表"], args["prompt"], args["n_new"], args["gamma"], args["T"],
                             np.random.default_rng(0))


def test_autoregressive_bad_arguments(tiny_models):
    target, _ = tiny_models
    with pytest.raises(ValueError, match="T"):
        autoregressive_generate(target, [1], 3, -0.1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="上下文"):
        autoregressive_generate(target, [1] * 60, 10, 1.0, np.random.default_rng(0))


# ---------------------------------------------------------------------------
# 公式
# ---------------------------------------------------------------------------
TABLE1 = [(0.6, 2, 1.53, 1.96), (0.7, 3, 1.58, 2.53), (0.8, 2, 1.23, 2.44),
          (0.8, 5, 1.63, 3.69), (0.9, 2, 1.11, 2.71), (0.9, 10, 1.60, 6.86)]


@pytest.mark.parametrize("a,g,ops,speed", TABLE1)
def test_leviathan_table1_cell_for_cell(a, g, ops, speed):
    assert round(ops_factor(a, g, 0), 2) == ops
    assert round(walltime_speedup(a, g, 0), 2) == speed
    assert round(expected_tokens(a, g), 2) == speed


def test_optimal_gamma_grid_of_seed04():
    g, s = best_gamma(0.9, 0.01)
    assert (g, round(s, 1)) == (24, 7.5)
    assert best_gamma(0.9, 0.05)[0] == 13
    g, s = best_gamma(0.9, 0.5)
    assert (g, round(s, 1)) == (3, 1.4)
    assert best_gamma(0.5, 0.5) == (0, 1.0)          # α = c：不划算
    assert best_gamma(0.4, 0.5) == (0, 1.0)


@pytest.mark.parametrize("a,c", [(0.6, 0.5), (0.3, 0.2), (0.8, 0.05), (0.5, 0.5)])
def test_corollary_3_9_bound_equals_gamma_1_speedup(a, c):
    assert walltime_speedup(a, 1, c) == pytest.approx((1 + a) / (1 + c), rel=1e-14)
    if a > c:
        assert best_gamma(a, c)[1] >= (1 + a) / (1 + c) - 1e-12


def test_alpha_one_and_gamma_zero_limits():
    assert expected_tokens(1.0, 7) == 8.0
    assert walltime_speedup(1.0, 3, 0.1) == pytest.approx(4 / 1.3)
    assert ops_factor(1.0, 4, 0.5) == pytest.approx((2 + 4 + 1) / 5)
    assert expected_tokens(0.7, 0) == 1.0 and walltime_speedup(0.7, 0, 0.3) == 1.0 and ops_factor(0.7, 0, 0.2) == 1.0
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1 - 1e-9, 5) == pytest.approx(6.0, rel=1e-6)


def test_truncated_geometric_sums_to_one_and_matches_eq1():
    for a, g in ((0.8, 8), (0.3, 2), (1.0, 4)):
        p = truncated_geometric(a, g)
        assert p.sum() == pytest.approx(1.0)
        assert (p * (np.arange(g + 1) + 1)).sum() == pytest.approx(expected_tokens(a, g))


@pytest.mark.parametrize("call,msg", [
    (lambda: expected_tokens(1.2, 3), "α"), (lambda: expected_tokens(-0.1, 3), "α"),
    (lambda: expected_tokens(0.5, -1), "γ"), (lambda: walltime_speedup(0.5, 2, -0.1), "c"),
    (lambda: ops_factor(0.5, 2, -1), "ĉ"), (lambda: best_gamma(0.5, 0), "没有有限的最优"),
    (lambda: best_gamma(1.0, 0.1), "没有有限的最优"), (lambda: best_gamma(1.5, 0.1), "α"),
])
def test_formula_bad_arguments(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()


# ---------------------------------------------------------------------------
# 拟合优度
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("x,dof,p", [(3.841458820694124, 1, 0.05), (18.307038053275146, 10, 0.05),
                                     (2.0, 2, math.exp(-1)), (0.5, 3, 0.9188914117), (100.0, 50, 3.4549314e-05),
                                     (1000.0, 900, 0.0109946089)])
def test_chi2_sf_known_values(x, dof, p):
    assert chi2_sf(x, dof) == pytest.approx(p, rel=1e-7)  # 参考值：scipy.stats.chi2.sf


def test_chi2_gof_pools_small_cells_and_flags_impossible_outcomes():
    stat, dof, pval = chi2_gof([50, 50, 0, 0], [0.5, 0.5, 0.0, 0.0])
    assert stat == 0 and pval == 1.0
    assert chi2_gof([50, 49, 1], [0.5, 0.5, 0.0])[2] == 0.0


def test_acceptance_beta_per_position_and_its_mean():
    from decode_lab import acceptance_beta
    p = np.array([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    q = np.array([[0.25, 0.25, 0.5], [0.0, 1.0, 0.0]])
    assert np.allclose(acceptance_beta(p, q), [0.5, 0.0])
    assert acceptance_rate(p, q) == pytest.approx(0.25)


def test_more_bad_arguments_are_clear_value_errors(tiny_models):
    target, drafts = tiny_models
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="γ"):
        speculative_generate(target, drafts["二元语法表"], [1, 2], 4, True, 1.0, rng)
    with pytest.raises(ValueError, match="0..5"):
        speculative_generate(target, drafts["二元语法表"], [1, 7], 4, 2, 1.0, rng)
    with pytest.raises(ValueError, match="0..5"):
        autoregressive_generate(target, [-1, 2], 4, 1.0, rng)
    with pytest.raises(ValueError, match="c"):
        walltime_speedup(0.5, 2, float("nan"))
    with pytest.raises(ValueError, match="c"):
        best_gamma(0.9, float("nan"))
    with pytest.raises(ValueError, match="max_gamma"):
        best_gamma(0.999, 1e-4)
    with pytest.raises(ValueError, match="分布"):
        chi2_gof([1, 2], [0.5, 0.6])
    with pytest.raises(ValueError, match="至少有一次观测"):
        chi2_gof([0, 0], [0.5, 0.5])


def test_context_bound_is_exact(tiny_models):
    """模型最多喂 len(prompt) + n_new − 1 个位置；投机解码的目标再多 γ 个。正好放得下的不该被拒绝。"""
    target, drafts = tiny_models
    L = TINY.max_seq
    out = autoregressive_generate(target, [1] * (L - 4), 5, 1.0, np.random.default_rng(0))
    assert len(out) == 5
    out, _ = speculative_generate(target, drafts["前 1 层"], [1] * (L - 6), 4, 3, 1.0, np.random.default_rng(0))
    assert len(out) == 4
    with pytest.raises(ValueError, match="max_seq"):
        speculative_generate(target, drafts["前 1 层"], [1] * (L - 6), 4, 4, 1.0, np.random.default_rng(0))


def test_draft_cache_after_rollbacks_equals_full_logits(tiny_models):
    """草稿的缓存也要回滚对：草稿每次前向得到的 logits 等于对同一个上下文一次算完的结果。"""
    target, drafts = tiny_models
    d = drafts["另一个模型"]
    spy = _SpyLM(d.params, d.cfg, "spy-draft")
    speculative_generate(target, spy, [3, 1], 30, 4, 1.0, np.random.default_rng(11))
    context, checked = [], 0
    for past, toks, rows in spy.log:
        context = context[:past] + list(toks)
        full = d.full_logits(np.array([context]))[0]
        assert np.abs(rows - full[past:past + len(toks)]).max() < 1e-12
        checked += len(toks)
    assert checked > 30 and any(past < prev_end for (past, _, _), prev_end in
                                zip(spy.log[1:], [p + len(t) for p, t, _ in spy.log[:-1]]))   # 确实回滚过
