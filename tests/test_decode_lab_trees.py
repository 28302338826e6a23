"""
decode_lab 的树形投机解码：多候选验证的输出分布 == p（精确枚举，另用逐个候选组合的暴力枚举核对）；k = 1 就是普通规则；
生成器 T = 0 时和贪心逐 token 相同、链形的树和 speculative_generate 一字不差、每个节点的 logits == 从头喂它的路径、
T = 1 时前两个 token 的联合分布过 χ² 检验，而同一个检验抓得住错误的残差；坏参数抛 ValueError。
"""
import itertools
import warnings

import numpy as np
import pytest

import tree_lab
from decode_lab import (acceptance_beta, adjust, autoregressive_generate, NGramLM, speculative_generate,
                        speculative_step_probs, TransformerLM)
from spec_math_lab import expected_tokens
from stats_lab import chi2_gof
from tree_lab import (multi_draft_acceptance, multi_draft_step_probs, multi_draft_verify,
                      tree_expected_tokens, tree_parents, tree_speculative_generate)
from context_memo import ContextMemoLM
from sampler_cases import HAND_CASES, TINY, dist as _dist
from transformer_lab import LMConfig, config_like, init_params
from kvcache_lab import KVCache

WIDE = LMConfig(name="wide", vocab=37, d_model=24, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=6, d_ff=48,
                max_seq=96, head_gain=2.0)


# ---------------------------------------------------------------------------
# 多候选验证：精确枚举
# ---------------------------------------------------------------------------
HAND = {"一般情形": (_dist([5, 2, 2, 1]), _dist([1, 1, 1, 1])), **HAND_CASES,
        "两个都是 one-hot，相同": (np.array([0.0, 0, 1, 0]), np.array([0.0, 0, 1, 0]))}


def _brute_force(p, q, k):
    """
    把 k 个候选的每一种组合 (x₁..x_k) 都列出来（概率 Π q(x_i)），按规则一步步走 -> (输出分布, 全部被拒绝的概率)。
    和 multi_draft_step_probs 无关的第二种写法：残差也在这里自己算（和为 0 时用 p_i）。
    """
    V = len(p)
    out, all_rej = np.zeros(V), 0.0
    for xs in itertools.product(range(V), repeat=k):
        w = float(np.prod([q[x] for x in xs]))
        if w == 0:
            continue
        cur, mass = p.copy(), 1.0
        for x in xs:
            acc = min(1.0, cur[x] / q[x])
            out[x] += w * mass * acc
            mass *= 1 - acc
            r = np.maximum(cur - q, 0)
            cur = r / r.sum() if r.sum() > 0 else cur
        out += w * mass * cur
        all_rej += w * mass
    return out, all_rej


@pytest.mark.parametrize("name", list(HAND))
@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_multi_draft_output_is_exactly_the_target(name, k):
    p, q = HAND[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = multi_draft_step_probs(p, q, k)
        acc = multi_draft_acceptance(p, q, k)
    assert not np.isnan(out).any() and 0 <= acc <= 1 + 1e-15
    assert np.abs(out - p).max() < 1e-14


@pytest.mark.parametrize("name", list(HAND))
@pytest.mark.parametrize("k", [1, 2, 3])
def test_multi_draft_enumeration_matches_brute_force_over_candidate_tuples(name, k):
    p, q = HAND[name]
    out, all_rej = _brute_force(p, q, k)
    assert np.abs(multi_draft_step_probs(p, q, k) - out).max() < 1e-14
    assert abs(multi_draft_acceptance(p, q, k) - (1 - all_rej)) < 1e-14


def test_multi_draft_exact_on_random_pairs():
    rng = np.random.default_rng(0)
    for _ in range(100):
        V = 2 + int(rng.random() * 5)
        k = 1 + int(rng.random() * 4)
        p = rng.random(V) ** 3 * (rng.random(V) > 0.3)
        q = rng.random(V) ** 3 * (rng.random(V) > 0.3)
        if p.sum() == 0 or q.sum() == 0:
            continue
        p, q = p / p.sum(), q / q.sum()
        got = multi_draft_step_probs(p, q, k)
        assert np.abs(got - p).max() < 1e-14
        if V ** k <= 300:
            out, all_rej = _brute_force(p, q, k)
            assert np.abs(got - out).max() < 1e-14
            assert abs(multi_draft_acceptance(p, q, k) - (1 - all_rej)) < 1e-14


@pytest.mark.parametrize("name", list(HAND))
def test_one_candidate_is_the_ordinary_rule(name):
    p, q = HAND[name]
    assert np.abs(multi_draft_step_probs(p, q, 1) - speculative_step_probs(p, q)).max() < 1e-15
    assert abs(multi_draft_acceptance(p, q, 1) - acceptance_beta(p, q)) < 1e-15


def test_acceptance_of_k_candidates_hand_worked():
    """p one-hot、q 均匀（V 个）：每个候选以 1/V 命中，残差还是那个 one-hot，所以 1 − (1 − 1/V)^k。"""
    V = 5
    p, q = np.eye(V)[2], np.full(V, 1 / V)
    for k in (1, 2, 4, 7):
        assert multi_draft_acceptance(p, q, k) == pytest.approx(1 - (1 - 1 / V) ** k, abs=1e-15)
    # 支撑不相交：永远不接受；p == q：第一个就接受
    assert multi_draft_acceptance(*HAND["不相交的支撑"], 4) == 0.0
    assert multi_draft_acceptance(*HAND["p == q"], 3) == pytest.approx(1.0, abs=1e-15)
    # 向量化：一批位置一起算 == 一个一个算
    P = np.stack([HAND[n][0] for n in HAND])
    Q = np.stack([HAND[n][1] for n in HAND])
    assert np.allclose(multi_draft_acceptance(P, Q, 3), [multi_draft_acceptance(HAND[n][0], HAND[n][1], 3)
                                                         for n in HAND], atol=1e-15, rtol=0)


def test_multi_draft_sampler_matches_target_and_its_acceptance():
    """
    抽样器本身：N 次的输出过 χ² 检验；接受了某个候选的比例和 multi_draft_acceptance 一致（4 个标准误以内）。
    这个 (p, q) 上每次拒绝后的残差都不一样（p₂ = (0.25, 0.75, 0)，p₃ = (0, 1, 0)）：残差没有跟着更新的错误会被抓住。
    """
    p, q = np.array([0.6, 0.4, 0.0]), np.array([0.5, 0.1, 0.4])
    k, N = 3, 4000
    rng = np.random.default_rng(5)
    counts, hits = np.zeros(3), 0
    cdf = np.cumsum(q)
    for _ in range(N):
        cands = [int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")) for _ in range(k)]
        i, tok = multi_draft_verify(p, q, cands, rng)
        assert i == -1 or cands[i] == tok
        counts[tok] += 1
        hits += i >= 0
    assert chi2_gof(counts, p)[2] > 1e-3
    a = multi_draft_acceptance(p, q, k)
    assert abs(hits / N - a) < 4 * np.sqrt(a * (1 - a) / N)


def test_tree_expected_tokens_reduces_to_equation_1_for_a_chain():
    for a in (0.0, 0.3, 0.6, 0.9, 1.0):
        for g in (1, 2, 5, 8):
            assert tree_expected_tokens([a] * g) == pytest.approx(expected_tokens(a, g), abs=1e-12)
    assert tree_expected_tokens([0.8, 0.5]) == pytest.approx(1 + 0.8 + 0.4)
    assert tree_expected_tokens([]) == 1.0


def test_tree_parents_hand_worked():
    assert tree_parents((2, 2)) == [-1, -1, 0, 0, 1, 1]
    assert tree_parents((1, 1, 1)) == [-1, 0, 1]
    assert tree_parents((3,)) == [-1, -1, -1]
    assert len(tree_parents((3, 2, 1, 1))) == 3 + 6 + 6 + 6


# ---------------------------------------------------------------------------
# 生成器
# ---------------------------------------------------------------------------
def _models(cfg):
    P = init_params(cfg, seed=0)
    target = TransformerLM(P, cfg, "目标")
    pk = dict(P)
    pk["layers"] = P["layers"][:1]
    rng = np.random.default_rng(3)
    return target, {"另一个模型": TransformerLM(init_params(cfg, seed=5), cfg, "另一个"),
                    "前 1 层": TransformerLM(pk, config_like(cfg, n_layers=1), "前1层"),
                    "二元语法表": NGramLM.fit((rng.random((4, 40)) * cfg.vocab).astype(int), cfg.vocab)}


@pytest.fixture(scope="module")
def tiny_models():
    return _models(TINY)


@pytest.fixture(scope="module")
def wide_models():
    return _models(WIDE)


@pytest.fixture(scope="module")
def memo_models(tiny_models):
    """
    tiny_models 的同一组模型，transformer 换成按上下文记住 logits 的版本（tests/context_memo.py：带缓存、带树形遮罩的
    每一行 == 一次算完这一行能看到的 token，同一个上下文只算一次；两者相等由 test_every_node_scored_in_generation_
    equals_a_fresh_pass_over_its_path 逐行核对）。χ² 检验要抽上千次，这样前向只算几百次；分布只差舍入。
    """
    target, drafts = tiny_models
    return ContextMemoLM(target), {k: d if isinstance(d, NGramLM) else ContextMemoLM(d) for k, d in drafts.items()}


def test_memo_rows_follow_the_mask_and_its_keep_checks_like_kvcache(tiny_models):
    """
    tests/context_memo.py 自己：同样的 token、同样个数的新 token、不同的遮罩（一条链 / 两个兄弟），每一行 == 把这一行
    能看到的 token 从头算一遍（整个调用按 token 和遮罩记住：只按 token 记，第二种遮罩就拿到第一种的结果）；
    它的缓存的 keep 和 KVCache.keep 对同样的参数一样报错、一样留下位置（它只挪影子列表）。
    """
    base = tiny_models[0]
    m = ContextMemoLM(base)
    prefix, new = [1, 4, 2], [5, 3]
    chain = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=bool)
    siblings = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 0, 1]], dtype=bool)
    for mask in (chain, siblings, chain):
        cache = m.new_cache()
        m.forward(np.array([prefix]), cache)
        rows = m.forward(np.array([new]), cache, attn_mask=mask)[0]
        for i in range(len(new)):
            ctx = [t for t, v in zip(prefix + new, mask[i]) if v]
            assert np.abs(rows[i] - base.full_logits(np.array([ctx]))[0, -1]).max() < 1e-12
    toks = [3, 1, 4, 1, 5]
    for start, offs in ((6, []), (-1, []), (True, []), (2, [1, 0]), (2, [3]), (2, [0, 0]), (2, [-1]), (2, [0.5]),
                        (2, [[0]]), (2, np.array([[0]]))):
        for cache in (KVCache(TINY, 1), m.new_cache()):
            cache.pos = len(toks)
            with pytest.raises(ValueError):
                cache.keep(start, offs)
    for start, offs in ((2, [0, 2]), (2, []), (0, [1, 2, 4]), (5, [])):
        ref, mine = KVCache(TINY, 1), m.new_cache()
        ref.pos = len(toks)
        m.forward(np.array([toks]), mine)
        ref.keep(start, offs)
        mine.keep(start, offs)
        assert mine.pos == ref.pos and mine.shadow[:mine.pos] == toks[:start] + [toks[start + o] for o in offs]


@pytest.fixture(scope="module")
def wide_greedy(wide_models):
    """wide_models 的目标在提示 [3, 17, 5, 29] 上自己的贪心解码（40 个 token）：下面 12 种组合共用这一份。"""
    return autoregressive_generate(wide_models[0], [3, 17, 5, 29], 40, 0, np.random.default_rng(0))


@pytest.mark.parametrize("branching", [(3, 2, 1, 1), (2,), (1, 1, 1), (2, 3)])
@pytest.mark.parametrize("draft_name", ["另一个模型", "前 1 层", "二元语法表"])
def test_greedy_tree_generation_equals_greedy_decoding(wide_models, wide_greedy, branching, draft_name):
    target, drafts = wide_models
    prompt = [3, 17, 5, 29]
    greedy = wide_greedy
    assert len(set(greedy.tolist())) > 5                     # 贪心序列不是一个 token 反复出现
    out, st = tree_speculative_generate(target, drafts[draft_name], prompt, 40, branching, 0,
                                        np.random.default_rng(1))
    assert np.array_equal(out, greedy)
    assert sum(a + 1 for a in st["accepted"]) >= 40 and st["target_calls"] == len(st["accepted"])


@pytest.mark.parametrize("T", [1.0, 0.7, 0.0])
@pytest.mark.parametrize("draft_name", ["另一个模型", "二元语法表"])
def test_a_chain_tree_is_speculative_generate(wide_models, T, draft_name):
    """branching 全是 1 时，随机数的用法和 speculative_generate 一样：同一个种子，输出和 stats 一字不差。"""
    target, drafts = wide_models
    for g in (1, 3):
        a = speculative_generate(target, drafts[draft_name], [3, 17, 5], 30, g, T, np.random.default_rng(9))
        b = tree_speculative_generate(target, drafts[draft_name], [3, 17, 5], 30, (1,) * g, T,
                                      np.random.default_rng(9))
        assert np.array_equal(a[0], b[0]) and a[1] == b[1]


class _Recording(TransformerLM):
    """
    记下每次前向的 (喂之前缓存里的 token, 新 token, 遮罩, logits)。缓存里是哪些 token 由一个影子列表跟踪
    （forward 写进去、rollback / keep 跟着挪），测试再用一次全新的前向核对每一行。
    """

    def __init__(self, base):
        super().__init__(base.params, base.cfg, base.name)
        self.calls = []

    def new_cache(self, batch=1, max_len=None):
        cache = _ShadowCache(self.cfg, batch, max_len)
        return cache

    def forward(self, toks, cache=None, counter=None, attn_mask=None, positions=None):
        if cache is None:
            return super().forward(toks, cache, counter, attn_mask, positions)
        before = list(cache.shadow[:cache.pos])
        out = super().forward(toks, cache, counter, attn_mask, positions)
        cache.shadow[len(before):cache.pos] = [int(t) for t in np.asarray(toks)[0]]
        self.calls.append((before, [int(t) for t in np.asarray(toks)[0]], attn_mask, out[0]))
        return out


class _ShadowCache(KVCache):
    def __init__(self, cfg, batch, max_len=None):
        super().__init__(cfg, batch, max_len)
        self.shadow = [None] * self.max_len

    def keep(self, start, offsets):
        kept = [self.shadow[start + o] for o in offsets]
        super().keep(start, offsets)
        self.shadow[start:start + len(kept)] = kept


@pytest.mark.parametrize("branching", [(2, 2, 1), (3, 1)])
def test_every_node_scored_in_generation_equals_a_fresh_pass_over_its_path(wide_models, branching):
    """
    生成过程中每次前向（目标的整棵树、草稿的每一层）的每一行 logits == 把"缓存里它能看到的 token"当普通序列从头喂（< 1e-12）；
    而且每轮开始时两个模型缓存里的 token 都正好是已确定的序列（留下的是被接受的那条路径）。
    """
    base, drafts = wide_models
    target, draft = _Recording(base), _Recording(drafts["另一个模型"])
    prompt = [3, 17, 5, 29]
    out, st = tree_speculative_generate(target, draft, prompt, 24, branching, 1.0, np.random.default_rng(2))
    seq = prompt + out.tolist()
    assert len(target.calls) == st["target_calls"]
    done = 0
    for r, (before, new, mask, logits) in enumerate(target.calls):
        assert len(before) == (0 if r == 0 else len(prompt) + done - 1) and before == seq[:len(before)]
        done += st["accepted"][r] + 1
    # 草稿每轮第一次前向（没有遮罩，接着已确定的序列往下喂）之前，缓存里也只有已确定的 token
    starts = [before for before, new, mask, logits in draft.calls if mask is None]
    assert len(starts) == st["target_calls"] and all(b == seq[:len(b)] for b in starts)
    # 从头喂的那一遍：同样长的上下文放进一批一次算完（批里每条序列各算各的，和一条一条喂只差舍入的顺序）
    for model in (target, draft):
        assert model.calls
        by_len = {}
        for before, new, mask, logits in model.calls:
            ctx_all = before + new
            for i in range(len(new)):
                vis = mask[i] if mask is not None else np.arange(len(ctx_all)) <= len(before) + i
                ctx = [t for t, v in zip(ctx_all, vis) if v]
                by_len.setdefault(len(ctx), []).append((ctx, logits[i]))
        for rows in by_len.values():
            fresh = model.full_logits(np.array([ctx for ctx, _ in rows]))[:, -1]
            for (_, got), want in zip(rows, fresh):
                assert np.abs(got - want).max() < 1e-12


def _exact_joint(target, prompt, T):
    V = target.cfg.vocab
    p1 = adjust(target.full_logits(np.array([prompt]))[0, -1], T)
    p2 = adjust(target.full_logits(np.array([list(prompt) + [a] for a in range(V)]))[:, -1], T)
    return p1[:, None] * p2


def _joint_counts(target, draft, branching, n_runs, seed):
    rng = np.random.default_rng(seed)
    counts = np.zeros((TINY.vocab, TINY.vocab))
    for _ in range(n_runs):
        out, _ = tree_speculative_generate(target, draft, [1, 4, 2], 2, branching, 1.0, rng)
        counts[out[0], out[1]] += 1
    return counts


@pytest.mark.parametrize("draft_name,branching", [("另一个模型", (3, 2)), ("二元语法表", (2, 1))])
def test_tree_joint_distribution_of_two_tokens_matches_target(memo_models, draft_name, branching):
    target, drafts = memo_models
    counts = _joint_counts(target, drafts[draft_name], branching, 1000, 42)
    stat, dof, pval = chi2_gof(counts, _exact_joint(target, [1, 4, 2], 1.0))
    assert pval > 1e-3, (stat, dof, pval)


def test_the_same_statistic_catches_a_wrong_residual(memo_models, monkeypatch):
    """检出力：把残差换成"拒绝后从 p_i 重抽"（常见的错误），同样的 χ² 检验必须判为不一致。"""
    target, drafts = memo_models
    monkeypatch.setattr(tree_lab, "residual_distribution", lambda p, q: np.asarray(p, dtype=np.float64))
    counts = _joint_counts(target, drafts["另一个模型"], (3, 2), 1000, 42)
    stat, dof, pval = chi2_gof(counts, _exact_joint(target, [1, 4, 2], 1.0))
    assert pval < 1e-6, (stat, dof, pval)


# ---------------------------------------------------------------------------
# 坏参数
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("k", [0, -1, 1.5, True, None])
def test_k_below_one_is_an_error(k):
    p, q = HAND["一般情形"]
    with pytest.raises(ValueError):
        multi_draft_step_probs(p, q, k)
    with pytest.raises(ValueError):
        multi_draft_acceptance(p, q, k)


def test_no_candidates_is_an_error():
    p, q = HAND["一般情形"]
    with pytest.raises(ValueError):
        multi_draft_verify(p, q, [], np.random.default_rng(0))


@pytest.mark.parametrize("branching", [(), [], (0,), (2, 0), (2, -1), (1.5,), (True,), "21", None, 3])
def test_malformed_branching_is_an_error(tiny_models, branching):
    target, drafts = tiny_models
    with pytest.raises(ValueError):
        tree_parents(branching)
    with pytest.raises(ValueError):
        tree_speculative_generate(target, drafts["另一个模型"], [1, 2], 3, branching, 1.0, np.random.default_rng(0))


def test_a_tree_that_does_not_fit_the_context_is_an_error(tiny_models):
    target, drafts = tiny_models
    n_nodes = len(tree_parents((3, 2, 2)))            # 3 + 6 + 12 = 21
    ok = TINY.max_seq - n_nodes - 2 + 1               # 提示 2 个：2 + n_new − 1 + 21 = max_seq
    tree_speculative_generate(target, drafts["二元语法表"], [1, 2], ok, (3, 2, 2), 1.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="max_seq"):
        tree_speculative_generate(target, drafts["二元语法表"], [1, 2], ok + 1, (3, 2, 2), 1.0,
                                  np.random.default_rng(0))


def test_other_bad_inputs_are_errors(tiny_models):
    target, drafts = tiny_models
    with pytest.raises(ValueError):                   # 目标模型要树形注意力
        tree_speculative_generate(drafts["二元语法表"], target, [1, 2], 3, (2,), 1.0, np.random.default_rng(0))
    with pytest.raises(ValueError):
        tree_speculative_generate(target, drafts["二元语法表"], [1, 2], 3, (2,), -1.0, np.random.default_rng(0))
    with pytest.raises(ValueError):
        tree_expected_tokens([0.5, 1.2])
