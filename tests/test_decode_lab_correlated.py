"""
decode_lab 的"成片的难度"部分：隐状态模型（regime_models）、平稳状态下的精确值、相邻相关、每轮的起点、
prompt lookup、会照抄的目标（CopyingLM）、草稿长度可变的投机解码。期望值都用手算的小例子或另一条独立的算法得到。
"""
import bisect
import math

import numpy as np
import pytest

from decode_lab import (acceptance_beta, adjust, autoregressive_generate, NGramLM, speculative_generate,
                        speculative_step_probs, TransformerLM)
from spec_math_lab import expected_tokens
from correlated_lab import bigram_chain_stats, exact_tokens_per_call, lag1_correlation, regime_models, round_starts, tokens_if_started_at
from lookup_lab import CopyingLM, induction_token, PromptLookup, speculative_generate_adaptive
from sampler_cases import TINY
from transformer_lab import init_params



@pytest.fixture(scope="module")
def tiny():
    P = init_params(TINY, seed=3)
    return TransformerLM(P, TINY, "tiny")


# ---------------------------------------------------------------------------
# 隐状态模型
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("stay", [0.0, 0.5, 0.9, 0.97])
def test_regime_rows_are_state_move_times_word_distribution(stay):
    """每一行：两半的总质量是 stay 和 1 − stay；两半的形状相同（草稿也一样），所以 β 和 stay 无关。"""
    t, d = regime_models(stay)
    V = t.table.shape[0]
    h = V // 2
    for m in (t, d):
        p = np.exp(m.table)
        assert np.abs(p.sum(1) - 1).max() < 1e-12
        own = np.where(np.arange(V)[:, None] < h, p[:, :h], p[:, h:])
        other = np.where(np.arange(V)[:, None] < h, p[:, h:], p[:, :h])
        assert np.abs(own.sum(1) - stay).max() < 1e-12
        if 0 < stay < 1:
            assert np.abs(own / stay - other / (1 - stay)).max() < 1e-12


def test_regime_beta_does_not_depend_on_stay_and_easy_is_easy():
    b = {}
    for stay in (0.0, 0.5, 0.97):
        t, d = regime_models(stay)
        b[stay] = np.minimum(np.exp(t.table), np.exp(d.table)).sum(1)      # 独立地算 Σ min(p, q)
    assert np.abs(b[0.0] - b[0.5]).max() < 1e-12
    assert np.abs(b[0.97] - b[0.5]).max() < 1e-12
    h = len(b[0.5]) // 2
    assert b[0.5][:h].mean() > 0.93 and b[0.5][h:].mean() < 0.3           # docstring / 脚本里说的"约 0.96 / 0.26"


def _word_stationary(f, steps=400):
    """96 个词的链（不看状态）的平稳分布：从均匀分布出发迭代 π ← πf（词的链混合得很快）。"""
    pi = np.full(f.shape[0], 1.0 / f.shape[0])
    for _ in range(steps):
        pi = (pi[:, None] * f).sum(0)
    return pi


@pytest.mark.parametrize("stay", [0.0, 0.5, 0.8, 0.97])
def test_alpha_is_fixed_as_stay_turns_closed_form(stay):
    """
    闭式（另一条算法）：平稳分布 = 状态各一半 × 词的平稳分布 π_w，所以 α = ½ Σ_w π_w (β_易(w) + β_难(w))；
    E[β_t β_{t+1}] 按"状态和词各自转移"逐项加起来。每个 stay 的 α 都一样，且等于 bigram_chain_stats。
    """
    t, d = regime_models(stay)
    P = np.exp(t.table)
    h = P.shape[0] // 2
    f = P[:h, :h] / stay if stay > 0 else P[:h, h:]                      # 词的转移（易状态那几行）
    pi_w = _word_stationary(f)
    beta = np.minimum(P, np.exp(d.table)).sum(1)
    bs = (beta[:h], beta[h:])
    alpha = 0.5 * (pi_w * (bs[0] + bs[1])).sum()
    move = np.array([[stay, 1 - stay], [1 - stay, stay]])
    pair = sum(0.5 * move[s, s2] * (pi_w * bs[s] * (f * bs[s2]).sum(1)).sum() for s in (0, 1) for s2 in (0, 1))
    st = bigram_chain_stats(t, d)
    assert st["alpha"] == pytest.approx(alpha, abs=1e-10)
    assert st["beta_pair"] == pytest.approx(pair, abs=1e-10)
    t0, d0 = regime_models(0.5)
    assert st["alpha"] == pytest.approx(bigram_chain_stats(t0, d0)["alpha"], abs=1e-10)


def test_bigram_chain_stats_hand_worked_two_token_chain():
    """P = [[0.9, 0.1], [0.2, 0.8]]，π = (2/3, 1/3)；β = (1, 0.7)：α = 0.9，E[ββ'] = 0.824，Var = 0.02，r₁ = 0.7。"""
    t = NGramLM(np.log(np.array([[0.9, 0.1], [0.2, 0.8]])))
    d = NGramLM(np.log(np.array([[0.9, 0.1], [0.5, 0.5]])))
    st = bigram_chain_stats(t, d)
    assert st["alpha"] == pytest.approx(0.9, abs=1e-12)
    assert st["beta_pair"] == pytest.approx(0.824, abs=1e-12)
    assert st["lag1"] == pytest.approx(0.7, abs=1e-9)
    same = bigram_chain_stats(t, t)                                        # β 处处是 1：没有波动
    assert same["alpha"] == pytest.approx(1.0) and same["lag1"] == 0.0


def test_bigram_chain_stats_periodic_chain():
    """周期为 2 的链 0 → 1 → {0, 2} → 1 …：π = (1/4, 1/2, 1/4)，从均匀分布出发的普通幂迭代会来回振荡。
    草稿在 1 之后只猜 2：β = (1, 0.5, 1)，α = 0.75。"""
    with np.errstate(divide="ignore"):
        t = NGramLM(np.log(np.array([[0, 1, 0], [0.5, 0, 0.5], [0, 1, 0]])))
        d = NGramLM(np.log(np.array([[0, 1, 0], [0, 0, 1.0], [0, 1, 0]])))
    st = bigram_chain_stats(t, d)
    assert st["alpha"] == pytest.approx(0.75, abs=1e-12)
    assert st["beta_pair"] == pytest.approx(0.5, abs=1e-12)               # 相邻两个位置总有一个是 0.5、一个是 1


def test_exact_tokens_per_call_hand_worked_two_token_chain():
    """同上面的两 token 链，γ = 1：A = min(p, q) = [[0.9, 0.1], [0.2, 0.5]]，R = max(p − q, 0) = [[0, 0], [0, 0.3]]；
    每轮 E = 1 + A 的行和 = (2, 1.7)；起点的转移 K = R + A·P = [[0.83, 0.17], [0.28, 0.72]]，π_K = (28, 17) / 45；
    每次目标前向 (28·2 + 17·1.7) / 45 = 84.9 / 45 ≈ 1.8867，比式 (1) 的 1 + 0.9 = 1.9 小（α = 0.9，见上）。"""
    t = NGramLM(np.log(np.array([[0.9, 0.1], [0.2, 0.8]])))
    d = NGramLM(np.log(np.array([[0.9, 0.1], [0.5, 0.5]])))
    assert exact_tokens_per_call(t, d, 1) == pytest.approx(84.9 / 45, abs=1e-12)
    assert exact_tokens_per_call(t, t, 3) == pytest.approx(4.0, abs=1e-12)      # 草稿 = 目标：每轮 γ + 1 个


def _per_call_by_enumeration(P, Q, gamma):
    """沿草稿的每条路径逐个 token 展开（深度优先），按定义累加每轮的 token 数和下一轮的起点；平稳分布用线性方程组解。"""
    V = P.shape[0]
    E, K = np.zeros(V), np.zeros((V, V))

    def walk(x, cur, i, prob):                      # 前 i 个草稿都被接受、停在 cur，概率 prob
        if i == gamma:                              # 全部接受：再加目标的一个
            E[x] += prob * (gamma + 1)
            K[x] += prob * P[cur]
            return
        res = np.maximum(P[cur] - Q[cur], 0)
        for y in range(V):
            if Q[cur, y] == 0:
                continue
            acc = min(1.0, P[cur, y] / Q[cur, y])
            if acc < 1:                             # 第 i + 1 个被拒绝：这一轮产出 i + 1 个，改从残差抽
                E[x] += prob * Q[cur, y] * (1 - acc) * (i + 1)
                K[x] += prob * Q[cur, y] * (1 - acc) * res / res.sum()
            walk(x, y, i + 1, prob * Q[cur, y] * acc)

    for x in range(V):
        walk(x, x, 0, 1.0)
    M = np.vstack([K.T - np.eye(V), np.ones(V)])
    pi = np.linalg.lstsq(M, np.r_[np.zeros(V), 1.0], rcond=None)[0]
    return float(pi @ E)


@pytest.mark.parametrize("gamma", [1, 2, 3])
def test_exact_tokens_per_call_equals_enumeration(gamma):
    """随机的 3 token 二元语法表（p、q 各有零），和逐条列举的结果一致；各行相同（各位置独立）时等于式 (1)。"""
    rng = np.random.default_rng(gamma)
    P, Q = rng.random((3, 3)), rng.random((3, 3))
    P[0, 2] = Q[1, 0] = Q[2, 2] = 0.0
    P, Q = P / P.sum(1, keepdims=True), Q / Q.sum(1, keepdims=True)
    with np.errstate(divide="ignore"):
        t, d = NGramLM(np.log(P)), NGramLM(np.log(Q))
        got = exact_tokens_per_call(t, d, gamma)
        assert got == pytest.approx(_per_call_by_enumeration(P, Q, gamma), abs=1e-12)
        row_p, row_q = np.tile(P[0], (3, 1)), np.tile(Q[1], (3, 1))
        a = float(np.minimum(P[0], Q[1]).sum())
        iid = exact_tokens_per_call(NGramLM(np.log(row_p)), NGramLM(np.log(row_q)), gamma)
    assert iid == pytest.approx(expected_tokens(a, gamma), abs=1e-12)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_exact_tokens_per_call_rejects_bad_gamma(bad):
    t, d = regime_models(0.5)
    with pytest.raises(ValueError, match="γ"):
        exact_tokens_per_call(t, d, bad)


def test_exact_lag1_matches_a_long_sampled_chain():
    """
    用自己写的采样（均匀数 + cumsum 反查）抽一条长链，β 的相邻相关和精确值一致。反查用 bisect 在 Python 的 float 列表上
    做（和 np.searchsorted(side="right") 在同一批 float64 上比较，u·总和 也是同一次双精度乘法：抽到的逐个相同），
    3 万步每步少一次 numpy 调用。
    """
    t, d = regime_models(0.9)
    P = np.exp(t.table)
    beta = np.minimum(P, np.exp(d.table)).sum(1)
    rows, last = np.cumsum(P, 1).tolist(), P.shape[0] - 1
    rng = np.random.default_rng(5)
    x, seq = 0, []
    for u in rng.random(30000).tolist():
        row = rows[x]
        x = min(bisect.bisect_right(row, u * row[-1]), last)
        seq.append(x)
    b = beta[np.array(seq)]
    r = np.corrcoef(b[:-1], b[1:])[0, 1]
    assert bigram_chain_stats(t, d)["lag1"] == pytest.approx(r, abs=0.03)
    assert lag1_correlation(b) == pytest.approx(r, abs=1e-9)


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5, float("nan"), "0.5", None, True])
def test_regime_bad_stay_is_a_clear_value_error(bad):
    with pytest.raises(ValueError, match=r"stay.*\[0, 1\)"):
        regime_models(bad)


def test_regime_models_work_with_the_existing_generators():
    """同样的 session() / .table 接口：两个现有的生成器都能用；T = 0 时投机解码 = 目标的贪心；越界的 token 照样报错。"""
    t, d = regime_models(0.9)
    greedy = autoregressive_generate(t, [5], 40, 0.0, np.random.default_rng(0))
    for g in (1, 4):
        out, st = speculative_generate(t, d, [5], 40, g, 0.0, np.random.default_rng(1))
        assert np.array_equal(out, greedy)
        assert sum(st["accepted"]) + st["target_calls"] >= 40
    out = autoregressive_generate(t, [5], 30, 1.0, np.random.default_rng(2))
    assert out.shape == (30,) and out.min() >= 0 and out.max() < 192
    with pytest.raises(ValueError, match="0..191"):
        speculative_generate(t, d, [192], 4, 2, 1.0, np.random.default_rng(0))


# ---------------------------------------------------------------------------
# 相邻相关、每轮起点、逐位置的 Σ∏β
# ---------------------------------------------------------------------------
def test_lag1_correlation_hand_cases_and_rows_are_separate():
    assert lag1_correlation([1, 2, 3, 4]) == pytest.approx(1.0)
    assert lag1_correlation([1, -1, 1, -1, 1]) == pytest.approx(-1.0)
    # 二维：只配对同一行里的相邻两个。两行 [0, 1] 和 [1, 0]：对是 (0, 1)、(1, 0) -> −1；拼成一行会多出 (1, 1) 这一对
    assert lag1_correlation([[0, 1], [1, 0]]) == pytest.approx(-1.0)
    x = np.random.default_rng(0).standard_normal((3, 50))
    a, b = x[:, :-1].ravel(), x[:, 1:].ravel()
    assert lag1_correlation(x) == pytest.approx(np.corrcoef(a, b)[0, 1], abs=1e-12)
    with pytest.raises(ValueError, match="方差为 0"):
        lag1_correlation([2.0, 2.0, 2.0])
    with pytest.raises(ValueError, match="至少要 2 对"):
        lag1_correlation([1.0, 2.0])


def test_round_starts_hand_case():
    """提示 5 个 token；接受 2、0、3 个：第一轮从 5 开始，产出 3 个 -> 8，产出 1 个 -> 9。"""
    assert list(round_starts(5, [2, 0, 3])) == [5, 8, 9]
    assert list(round_starts(0, [4])) == [0]


def test_tokens_if_started_at_hand_case_and_eq1():
    b = np.array([0.5, 0.2, 1.0, 0.3])
    assert tokens_if_started_at(b, [0, 1], 2) == pytest.approx([1 + 0.5 + 0.5 * 0.2, 1 + 0.2 + 0.2 * 1.0])
    for a, g in ((0.7, 4), (0.3, 8), (1.0, 3)):
        assert tokens_if_started_at(np.full(20, a), [0, 5], g) == pytest.approx([expected_tokens(a, g)] * 2)
    with pytest.raises(ValueError, match="起点"):
        tokens_if_started_at(b, [2], 3)


# ---------------------------------------------------------------------------
# prompt lookup 与照抄的目标
# ---------------------------------------------------------------------------
def _naive_lookup(seq, n, k):
    """另一种写法：收集所有匹配的起点，取最大的那个。"""
    L = len(seq)
    hits = [i for i in range(L - n) if tuple(seq[i:i + n]) == tuple(seq[L - n:])]
    return list(seq[max(hits) + n:max(hits) + n + k]) if hits else []


def test_prompt_lookup_hand_cases():
    pl = PromptLookup(2)
    assert pl.propose([5, 1, 2, 7, 8, 1, 2], 2) == [7, 8]
    assert pl.propose([1, 2, 3, 1, 2, 4, 1, 2], 3) == [4, 1, 2]          # 最近的一次匹配
    assert pl.propose([1, 2, 3, 4], 5) == []                               # 找不到：不草稿
    assert pl.propose([1, 2, 1, 2], 5) == [1, 2]                           # 下文不够 k 个：有几个给几个
    assert pl.propose([3, 3, 3], 0) == []
    assert PromptLookup(1).propose([4, 9, 4], 3) == [9, 4]
    rng = np.random.default_rng(1)
    for _ in range(200):
        seq = [int(x) for x in (rng.random(int(rng.random() * 30) + 1) * 4)]
        for n in (1, 2, 3):
            assert PromptLookup(n).propose(seq, 4) == _naive_lookup(seq, n, 4)


@pytest.mark.parametrize("call,msg", [
    (lambda: PromptLookup(0), "n-gram"), (lambda: PromptLookup(1.5), "n-gram"), (lambda: PromptLookup(True), "n-gram"),
    (lambda: PromptLookup(2).propose([], 3), "空"), (lambda: PromptLookup(2).propose([1, 2], -1), "k"),
])
def test_prompt_lookup_bad_arguments(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()


def test_induction_token_is_the_first_prompt_lookup_draft():
    assert induction_token([1, 2, 3, 1, 2], 5) == 3
    assert induction_token([1, 2, 3, 1, 2], 4) is None                     # (3, 1) 之前没出现过
    assert induction_token([1, 2], 2) is None
    rng = np.random.default_rng(2)
    seq = [int(x) for x in rng.random(120) * 5]
    for n in (2, 3):
        for t in range(1, len(seq) + 1):
            got = induction_token(seq, t, n)
            want = PromptLookup(n).propose(seq[:t], 1)
            assert (got is None and want == []) or [got] == want


@pytest.fixture(scope="module")
def copier(tiny):
    return CopyingLM(tiny, 0.8, 2)


def test_copying_lm_is_the_stated_mixture(tiny, copier):
    seq = [1, 2, 3, 4, 1, 2, 5, 0, 1]
    p = adjust(copier.full_logits(np.array([seq]))[0], 1.0)
    base = adjust(tiny.full_logits(np.array([seq]))[0], 1.0)
    # 位置 6（下一个是 seq[6]）：前两个是 (1, 2)，上一次出现在下标 0、1，后面是 3
    want = 0.2 * base[5]
    want[3] += 0.8
    assert p[5] == pytest.approx(want, abs=1e-12)
    # 位置 4：(3, 4) 没出现过 -> 就是 base
    assert p[3] == pytest.approx(base[3], abs=1e-12)
    zero = CopyingLM(tiny, 0.0)
    assert adjust(zero.full_logits(np.array([seq]))[0], 1.0) == pytest.approx(base, abs=1e-12)


def test_copying_session_after_rollbacks_equals_full_logits(copier):
    seq = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4, 0, 1, 2]
    full = copier.full_logits(np.array([seq]))[0]
    s = copier.session()
    assert np.abs(s.logits(seq[:6]) - full[:6]).max() < 1e-12
    assert np.abs(s.logits(seq[:11]) - full[6:11]).max() < 1e-12
    s.truncate(8)
    assert np.abs(s.logits(seq[:15]) - full[8:15]).max() < 1e-12


@pytest.mark.parametrize("bad", [-0.1, 1.1, float("nan"), "0.5"])
def test_copying_lm_bad_lambda(tiny, bad):
    with pytest.raises(ValueError, match="λ"):
        CopyingLM(tiny, bad)


def test_one_hot_draft_step_is_exact():
    """prompt lookup 的草稿 q 是 one-hot：一步接受 / 拒绝的输出分布仍然正好是 p（精确枚举）。"""
    p = np.array([0.1, 0.6, 0.3])
    for x in range(3):
        assert speculative_step_probs(p, np.eye(3)[x]) == pytest.approx(p, abs=1e-15)
        assert acceptance_beta(p, np.eye(3)[x]) == pytest.approx(p[x])


# ---------------------------------------------------------------------------
# 草稿长度可变的投机解码
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("gamma,T,seed", [(1, 1.0, 0), (3, 1.0, 1), (5, 0.7, 2), (2, 0.0, 3)])
def test_constant_gamma_equals_speculative_generate(tiny, gamma, T, seed):
    """gamma_max=None：输出和每轮接受的个数与 speculative_generate 逐位相同（同样的随机数顺序）。"""
    for target, draft, prompt in ((tiny, CopyingLM(tiny, 0.5), [1, 2, 3, 1]), regime_models(0.9) + ([7],)):
        a, sa = speculative_generate(target, draft, prompt, 30, gamma, T, np.random.default_rng(seed))
        b, sb = speculative_generate_adaptive(target, draft, prompt, 30, gamma, T, np.random.default_rng(seed))
        assert np.array_equal(a, b)
        assert sa["accepted"] == sb["accepted"] and sa["target_calls"] == sb["target_calls"]
        assert sb["drafted"] == [gamma] * sb["target_calls"]


def test_heuristic_schedule_follows_the_rule():
    """全部接受 -> 下一轮 γ + 2（不超过上限）；有拒绝 -> γ − 1（不少于 1）。从 stats 逐轮核对。"""
    t, d = regime_models(0.97)
    _, st = speculative_generate_adaptive(t, d, [3], 400, 2, 1.0, np.random.default_rng(4), gamma_max=9)
    dr, acc = st["drafted"], st["accepted"]
    assert dr[0] == 2
    for k in range(len(dr) - 1):
        want = min(dr[k] + 2, 9) if acc[k] == dr[k] else max(dr[k] - 1, 1)
        assert dr[k + 1] == want
    assert max(dr) == 9 and min(dr) == 1                                   # 两头都碰到过


@pytest.mark.parametrize("gamma_max", [None, 6])
def test_greedy_with_any_draft_equals_greedy_target(tiny, gamma_max):
    target = CopyingLM(tiny, 0.9)
    prompt = [1, 2, 3, 4, 5, 1, 2]
    greedy = autoregressive_generate(target, prompt, 25, 0.0, np.random.default_rng(0))
    for draft in (PromptLookup(2), PromptLookup(1), tiny):
        out, _ = speculative_generate_adaptive(target, draft, prompt, 25, 2, 0.0, np.random.default_rng(1),
                                               gamma_max=gamma_max)
        assert np.array_equal(out, greedy)


def test_prompt_lookup_rounds_without_a_match_are_plain_steps(tiny):
    """找不到匹配的轮不草稿：产出 1 个 token（accepted = 0、drafted = 0）；草稿个数不超过 γ。"""
    target = CopyingLM(tiny, 0.9)
    _, st = speculative_generate_adaptive(target, PromptLookup(3), [0, 1, 2, 3, 4, 5], 40, 4, 1.0,
                                          np.random.default_rng(2))
    dr, acc = np.array(st["drafted"]), np.array(st["accepted"])
    assert (dr == 0).any() and (dr > 0).any()
    assert np.all(acc[dr == 0] == 0) and np.all(acc <= dr) and dr.max() <= 4
    assert (acc + 1).sum() >= 40 and st["target_calls"] == len(dr)


def test_adaptive_output_distribution_matches_target_on_first_two_tokens(tiny):
    """
    T = 1：prompt lookup 草稿下前两个 token 的联合分布 = 目标的精确分布（卡方检验，种子固定）。
    抽样的 1000 次里，照抄的目标底下那个 transformer 换成按上下文记住 logits 的版本（tests/context_memo.py：带缓存、
    回滚的每一行 == 一次算完这一行能看到的 token，同一个上下文只算一次）：抽样看到的分布只差舍入；精确分布用原模型算。
    """
    from context_memo import ContextMemoLM
    target = CopyingLM(tiny, 0.7)
    prompt = [1, 2, 3, 1]
    V = TINY.vocab
    p1 = adjust(target.full_logits(np.array([prompt]))[0, -1], 1.0)
    joint = np.zeros((V, V))
    for x in range(V):
        joint[x] = p1[x] * adjust(target.full_logits(np.array([prompt + [x]]))[0, -1], 1.0)
    memo = CopyingLM(ContextMemoLM(tiny), 0.7)
    rng = np.random.default_rng(9)
    counts = np.zeros((V, V))
    for _ in range(1000):
        out, _ = speculative_generate_adaptive(memo, PromptLookup(2), prompt, 2, 3, 1.0, rng)
        counts[out[0], out[1]] += 1
    e = joint.ravel() * counts.sum()
    big = e >= 5
    o_cells = np.append(counts.ravel()[big], counts.ravel()[~big].sum())
    e_cells = np.append(e[big], e[~big].sum())
    stat = float(((o_cells - e_cells) ** 2 / e_cells).sum())
    dof = len(o_cells) - 1
    assert stat < dof + 4 * math.sqrt(2 * dof)                             # 约 4 个标准差以内


@pytest.mark.parametrize("kwargs,msg", [
    (dict(gamma=0), "gamma"), (dict(gamma=2, gamma_max=1), "gamma_max"), (dict(gamma=True), "gamma"),
    (dict(gamma=2, gamma_max=2.5), "gamma_max"),
])
def test_adaptive_bad_arguments(tiny, kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        speculative_generate_adaptive(tiny, tiny, [1, 2], 4, T=1.0, rng=np.random.default_rng(0), **kwargs)


def test_adaptive_context_bound_uses_gamma_max(tiny):
    L = TINY.max_seq
    out, _ = speculative_generate_adaptive(tiny, tiny, [1] * (L - 6), 4, 1, 1.0, np.random.default_rng(0),
                                           gamma_max=3)
    assert len(out) == 4
    with pytest.raises(ValueError, match="max_seq"):
        speculative_generate_adaptive(tiny, tiny, [1] * (L - 6), 4, 1, 1.0, np.random.default_rng(0), gamma_max=4)
