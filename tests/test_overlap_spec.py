"""
overlap_spec_lab：重叠的投机解码（PEARL 的 post-verify）精确吗？——精确枚举 == 目标自己的自回归联合分布；
两个故意的错误（提交过时的草稿、额外的 token 和预先的草稿都要）改变枚举；抽样的生成器 == 一份独立写的参考；
抽样的频率符合枚举出来的分布；tree_lab 的 budget = γ、top_k = 1、depth = γ 真的是链。

【浮点的界】枚举把每条路径的概率连乘（≤ 3 个输出 token，每轮 ≤ 2γ + 2 个因子，每个因子有 ~1e-16 的相对误差），
再把 ≤ 几千条路径加到 ≤ 64 个输出上；参照（target_joint_distribution）用整段前向、按前缀连乘。
两边的 softmax 各差几个 ulp，路径和的误差远小于 1e-12：断言 1e-12（故意的错误差 1e-2 量级）。
"""
import functools

import numpy as np
import pytest

import overlap_spec_lab
import tree_lab
from context_memo import ContextMemoLM
from decode_lab import _stop_set, adjust, autoregressive_generate, residual_distribution
from overlap_spec_lab import overlap_output_distribution, overlap_speculative_generate
from split_models_lab import build_split_model
from stats_lab import chi2_gof
from transformer_lab import sample_inverse_cdf

FLOAT_BOUND = 1e-12
PROMPT = [1, 2]
N_SEEDS = 500


@pytest.fixture(scope="module")
def tiny():
    return build_split_model("tiny4:0"), build_split_model("tiny4-layers:1:0")


@pytest.fixture(scope="module")
def qcfg():
    return build_split_model("qcfg:0"), build_split_model("qcfg-layers:1:0")


@functools.lru_cache(maxsize=None)
def _joint(n_new, T, stop=None):
    """参照：tiny4:0 自己的自回归联合分布（target_joint_distribution）。好几个测试要同一份（n_new = 3、T = 1 的七次），
    每种只算一次。"""
    target = build_split_model("tiny4:0")
    return overlap_spec_lab.target_joint_distribution(target, PROMPT, n_new, T, stop=stop)


def target_joint_distribution(target, prompt, n_new, T, stop=None):
    assert target is build_split_model("tiny4:0") and prompt == PROMPT, "记住的参照只给 tiny4:0 和 PROMPT"
    return _joint(n_new, T, stop)


def _maxdiff(a, b):
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


@pytest.mark.parametrize("T", [1.0, 0.7])
@pytest.mark.parametrize("point_mass", [False, True])
def test_enumeration_equals_target_autoregressive_joint(tiny, T, point_mass):
    target, draft = tiny
    ref = target_joint_distribution(target, PROMPT, 3, T)
    got = overlap_output_distribution(target, draft, PROMPT, 3, 1, T, point_mass=point_mass)
    assert abs(sum(got.values()) - 1.0) < FLOAT_BOUND and len(ref) == 64
    assert _maxdiff(got, ref) < FLOAT_BOUND


def test_enumeration_equals_target_joint_with_gamma_2(tiny):
    """γ = 2：每轮的预先草稿有 16 种，n_new = 2（枚举里最大的一个）。"""
    target, draft = tiny
    for pm in (False, True):
        got = overlap_output_distribution(target, draft, PROMPT, 2, 2, 1.0, point_mass=pm)
        assert _maxdiff(got, target_joint_distribution(target, PROMPT, 2, 1.0)) < FLOAT_BOUND


def test_enumeration_with_a_stop_token_equals_the_target_stopped_there(tiny):
    target, draft = tiny
    got = overlap_output_distribution(target, draft, PROMPT, 3, 1, 1.0, stop=0)
    ref = target_joint_distribution(target, PROMPT, 3, 1.0, stop=0)
    assert (0,) in ref and _maxdiff(got, ref) < FLOAT_BOUND


@pytest.mark.parametrize("point_mass", [False, True])
@pytest.mark.parametrize("mutation", ["stale", "bonus"])
def test_a_stale_draft_or_a_bonus_plus_predraft_changes_the_enumeration(tiny, mutation, point_mass):
    """变异：'stale' = 拒绝后留着 y、按它草稿时的上下文验证再提交；'bonus' = 全部接受时既抽额外的 token 又验证 y。"""
    target, draft = tiny
    ref = target_joint_distribution(target, PROMPT, 3, 1.0)
    bad = overlap_output_distribution(target, draft, PROMPT, 3, 1, 1.0, point_mass=point_mass, mutation=mutation)
    assert abs(sum(bad.values()) - 1.0) < FLOAT_BOUND   # 还是一个分布，只是不是 p
    assert _maxdiff(bad, ref) > 1e-3


def test_keeping_y_but_reverifying_it_in_the_new_context_is_still_exact(tiny):
    """y 是从已知的 q 抽的、和验证的随机数独立：在新的上下文里重新验证它，分布不变（只是接受得少）。"""
    target, draft = tiny
    got = overlap_output_distribution(target, draft, PROMPT, 3, 1, 1.0, mutation="keep_y")
    assert _maxdiff(got, target_joint_distribution(target, PROMPT, 3, 1.0)) < FLOAT_BOUND


def _plain_reference(target, draft, prompt, n_new, gamma, T, seed, stop=None):
    """按模块说明逐字写的一份（不用 _round、不用原语）：生成器必须和它逐个 token 相同。"""
    rng_d, rng_t = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2)]
    stop = _stop_set(stop)

    def chain(ctx):
        toks, qs = [], []
        for _ in range(gamma):
            q = adjust(draft.full_logits([ctx + toks])[0][-1], T)
            toks.append(int(sample_inverse_cdf(q, rng_d.random())))
            qs.append(q)
        return toks, qs

    seq = list(prompt)
    n0 = len(seq)
    x, qx = chain(seq)
    while len(seq) - n0 < n_new and not any(t in stop for t in seq[n0:]):
        y, qy = chain(seq + x)
        ps = adjust(target.full_logits([seq + x])[0][-(gamma + 1):], T)
        n = 0
        while n < gamma and rng_t.random() * qx[n][x[n]] < ps[n][x[n]]:
            n += 1
        if n < gamma:
            seq = seq + x[:n] + [int(sample_inverse_cdf(residual_distribution(ps[n], qx[n]), rng_t.random()))]
            x, qx = chain(seq)
        else:
            seq, x, qx = seq + x, y, qy
    out = seq[n0:n0 + n_new]
    for i, t in enumerate(out):
        if t in stop:
            return out[:i + 1]
    return out


@pytest.mark.parametrize("gamma", [1, 3])
def test_generator_equals_a_plain_transcription_of_the_rule(qcfg, gamma):
    target, draft = qcfg
    for seed in (0, 1):
        got, st = overlap_speculative_generate(target, draft, [5, 9, 3], 12, gamma, 1.0, seed)
        assert got.tolist() == _plain_reference(target, draft, [5, 9, 3], 12, gamma, 1.0, seed)
        assert st["target_calls"] == len(st["accepted"]) and st["draft_wasted"] >= 0
    got, _ = overlap_speculative_generate(target, draft, [5, 9, 3], 12, gamma, 1.0, 3, stop=[7, 11])
    assert got.tolist() == _plain_reference(target, draft, [5, 9, 3], 12, gamma, 1.0, 3, stop=[7, 11])


@pytest.mark.parametrize("point_mass", [False, True])
def test_greedy_equals_the_target_greedy_sequence(qcfg, point_mass):
    target, draft = qcfg
    ref = autoregressive_generate(target, [5, 9, 3], 16, 0.0, np.random.default_rng(0))
    for gamma in (1, 2, 4):
        got, st = overlap_speculative_generate(target, draft, [5, 9, 3], 16, gamma, 0.0, 0, point_mass=point_mass)
        assert got.tolist() == ref.tolist()


def test_sampled_outputs_fit_the_enumerated_distribution(tiny):
    """
    N_SEEDS = 500 个种子各跑一次（γ = 1，n_new = 2，16 种输出）：每个输出在枚举里概率 > 0；χ² 拟合优度的 p 值 > 1e-3
    （正确的生成器下 p 值在 [0, 1] 上均匀，p < 1e-3 的概率是 1e-3；种子固定，所以结果确定）。
    同样的检验拿 mutation="stale" 的生成器跑，p 值 < 1e-3（这个检验看得出这个错）。
    抽样用按上下文记住 logits 的同一对模型（tests/context_memo.py：logits 只取决于看到的 token，和带缓存的路只差舍入；
    这 1000 次的输出和用原模型时逐个相同，22 种上下文各算一次前向而不是几千次）；枚举用原模型。
    """
    target, draft = tiny
    exact = overlap_output_distribution(target, draft, PROMPT, 2, 1, 1.0)
    target, draft = ContextMemoLM(target), ContextMemoLM(draft)
    keys = sorted(exact)
    probs = np.array([exact[k] for k in keys])
    pvals = {}
    for mutation in (None, "stale"):
        counts = dict.fromkeys(keys, 0)
        for seed in range(N_SEEDS):
            out, _ = overlap_speculative_generate(target, draft, PROMPT, 2, 1, 1.0, seed, mutation=mutation)
            assert exact.get(tuple(out.tolist()), 0.0) > 0
            counts[tuple(out.tolist())] += 1
        pvals[mutation] = chi2_gof([counts[k] for k in keys], probs)[2]
    assert pvals[None] > 1e-3
    assert pvals["stale"] < 1e-3


def test_dynamic_tree_with_top_k_1_and_depth_gamma_is_a_chain(qcfg, monkeypatch):
    """
    budget = γ、top_k = 1、depth = γ：每轮验证 γ 个节点；每个节点只有一个孩子（点质量规则每次只试一个候选）；
    这 γ 个节点是草稿的贪心链（和草稿自己 T = 0 自回归的 token 相同）。
    """
    target, draft = qcfg
    seen = []
    real = tree_lab.topk_draft_verify

    def spy(p, candidates, rng):
        seen.append(len(candidates))
        return real(p, candidates, rng)

    monkeypatch.setattr(tree_lab, "topk_draft_verify", spy)
    gamma, prompt = 3, [5, 9, 3]
    out, st = tree_lab.dynamic_tree_generate(target, draft, prompt, 12, gamma, 1.0, np.random.default_rng(0),
                                             top_k=1, depth=gamma)
    assert st["nodes"] == [gamma] * st["target_calls"]
    assert seen and set(seen) == {1}
    # 第一轮：被接受的草稿 token 是草稿的贪心链的前缀
    greedy = autoregressive_generate(draft, prompt, gamma, 0.0, np.random.default_rng(0)).tolist()
    n = st["accepted"][0]
    assert out.tolist()[:n] == greedy[:n]


def test_bad_arguments_raise_valueerror(tiny, qcfg):
    target, draft = tiny
    for kw in (dict(gamma=0), dict(gamma=1.5), dict(T=-1.0), dict(mutation="nope")):
        args = dict(gamma=1, T=1.0)
        args.update(kw)
        mut = args.pop("mutation", None)
        with pytest.raises(ValueError):
            overlap_speculative_generate(target, draft, PROMPT, 3, args["gamma"], args["T"], 0, mutation=mut)
    with pytest.raises(ValueError, match="≤ 4"):
        overlap_output_distribution(*qcfg, PROMPT, 2, 1, 1.0)          # QCFG 的词表 192：枚举不了
    with pytest.raises(ValueError, match="≤ 3"):
        overlap_output_distribution(target, draft, PROMPT, 4, 1, 1.0)
    with pytest.raises(ValueError, match="max_seq"):                   # 预先草稿要多 γ 个位置
        overlap_speculative_generate(target, draft, [1] * 22, 8, 2, 1.0, 0)   # 22 + 7 + 2·2 > 32
