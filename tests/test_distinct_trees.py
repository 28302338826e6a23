"""
distinct_lab（不同候选的验证规则、有损规则）和 tree_lab 的动态树（dynamic_tree_generate、dynamic_tree_expected）。

精确的规则用枚举对照 p（期望值是 p 本身，不是被测的函数）；接受率对照手算；有损的规则对照手算的分布和 TV；
动态树在 T = 0 对照目标自己的贪心解码（玩具，和 float64 的 SmolLM2 的前 6 层）。
"""
import itertools
import math
import types

import numpy as np
import pytest

import distinct_lab as dl
from conftest import compute_early, early_result
from decode_lab import autoregressive_generate
from seed04_models import seed04_models
from stats_lab import chi2_gof
from tree_lab import dynamic_tree_expected, dynamic_tree_generate

EXACT = 1e-12                    # 枚举只差浮点舍入（float64，V ≤ 5、k ≤ 5 的和：远小于它）


def _cases(seed=0, n=40):
    """随机的小 (p, q)：V = 2..5，每个里随机放一些 0（p、q 各自，至少留 1 个正的）。"""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        V = int(rng.integers(2, 6))
        p, q = rng.random(V), rng.random(V)
        p[rng.random(V) < 0.3] = 0.0
        q[rng.random(V) < 0.3] = 0.0
        p[int(rng.integers(V))] += 0.5
        q[int(rng.integers(V))] += 0.5
        out.append((p / p.sum(), q / q.sum()))
    out += [(np.array([0.5, 0.2, 0.2, 0.1]), np.array([0.5, 0.2, 0.2, 0.1])),     # p == q
            (np.array([0.6, 0.4, 0.0, 0.0]), np.array([0.0, 0.0, 0.5, 0.5])),     # 支撑不相交
            (np.array([0.5, 0.2, 0.2, 0.1]), np.array([0.0, 1.0, 0.0, 0.0]))]     # q one-hot
    return out


def _mutant(module, old, new):
    """把 module 的源码里的 old 换成 new（必须恰好出现一次），执行成一个新模块。"""
    with open(module.__file__, encoding="utf-8") as f:
        src = f.read()
    assert src.count(old) == 1, old
    m = types.ModuleType(module.__name__ + "_mutant")
    m.__file__ = module.__file__
    exec(compile(src.replace(old, new), module.__file__, "exec"), m.__dict__)
    return m


# ---------------------------------------------------------------------------
# 无放回（RSD）
# ---------------------------------------------------------------------------
def test_without_replacement_rule_is_exact_for_every_k_up_to_the_vocabulary():
    for p, q in _cases():
        for k in range(1, p.size + 1):
            assert np.abs(dl.distinct_draft_step_probs(p, q, k) - p).max() < EXACT, (p, q, k)


def test_without_replacement_breaks_when_the_residual_update_is_skipped():
    """去掉"拒绝之后 p 换成残差"这一步（只把候选从 q 里去掉），枚举就偏离 p：上面那个测试会变红。"""
    bad = _mutant(dl, "    res = residual_distribution(p, q)\n    for x in np.flatnonzero(q > 0):",
                  "    res = p\n    for x in np.flatnonzero(q > 0):")
    worst = max(float(np.abs(bad.distinct_draft_step_probs(p, q, k) - p).max())
                for p, q in _cases() for k in range(2, p.size + 1))
    assert worst > 0.05


def test_without_replacement_acceptance_by_hand():
    """p = (0.5, 0.2, 0.2, 0.1)、q 均匀：α₁ = Σ min = 0.75；第一个被拒绝（概率 0.25）之后残差是 δ₀，
    剩下 3 个里抽到 0 的概率 1/3 → α₂ = 0.75 + 0.25/3 = 5/6。独立地抽（09）：α₂ = 1 − 0.25·0.75 = 0.8125。"""
    p, q = np.array([0.5, 0.2, 0.2, 0.1]), np.full(4, 0.25)
    assert dl.distinct_draft_acceptance(p, q, 1) == pytest.approx(0.75, abs=1e-15)
    assert dl.distinct_draft_acceptance(p, q, 2) == pytest.approx(5 / 6, abs=1e-15)
    from tree_lab import multi_draft_acceptance
    assert float(multi_draft_acceptance(p, q, 2)) == pytest.approx(0.8125, abs=1e-15)


def test_without_replacement_caps_k_at_the_support_of_q():
    p, q = np.array([0.6, 0.4, 0.0, 0.0, 0.0]), np.array([0.5, 0.1, 0.3, 0.0, 0.1])
    a = [dl.distinct_draft_acceptance(p, q, k) for k in range(1, 6)]
    assert a[3] == a[4]                                  # 支撑 4 个：k = 5 截在 4
    assert a[0] < a[1] < a[2] <= a[3]


def _sample_without_replacement(q, k, rng):
    """测试自己的无放回抽样（不用被测的模块）：依次按剩下的比例抽。"""
    q = np.array(q, dtype=np.float64)
    out = []
    for _ in range(k):
        c = np.cumsum(q)
        x = int(np.searchsorted(c, rng.random() * c[-1], side="right"))
        out.append(x)
        q[x] = 0.0
    return out


@pytest.mark.parametrize("mod_name", ["lab", "mutant"])
def test_without_replacement_sampler_matches_p_and_the_mutant_is_rejected(mod_name):
    """抽样版（distinct_draft_verify）：候选由测试自己无放回地抽，8000 次的 χ² 对 p 不拒绝；跳过残差的变体被拒绝。"""
    mod = dl if mod_name == "lab" else _mutant(
        dl, "        p = residual_distribution(p, q)\n        if i + 1 < len(c):", "        if i + 1 < len(c):")
    p, q = np.array([0.5, 0.2, 0.2, 0.1]), np.array([0.1, 0.3, 0.3, 0.3])
    rng = np.random.default_rng(7)
    counts = np.zeros(4)
    for _ in range(4000):
        counts[mod.distinct_draft_verify(p, q, _sample_without_replacement(q, 2, rng), rng)[1]] += 1
    pv = chi2_gof(counts, p)[2]
    assert (pv > 1e-3) if mod_name == "lab" else (pv < 1e-6)


def test_rejection_products_estimate_the_enumerated_acceptance():
    """抽样的 α_k（把接受的均匀数积分掉）和枚举的在 5 个标准误以内（固定种子）。"""
    p, q = np.array([0.45, 0.25, 0.15, 0.1, 0.05]), np.array([0.1, 0.2, 0.3, 0.25, 0.15])
    prods = dl.distinct_rejection_products(p, q, 5, 20000, np.random.default_rng(3))
    for k in range(1, 6):
        v = 1.0 - prods[:, k - 1]
        se = v.std(ddof=1) / math.sqrt(v.size)
        assert abs(v.mean() - dl.distinct_draft_acceptance(p, q, k)) < 5 * se + 1e-12, k
    assert np.all(np.diff(prods, axis=1) <= 0)          # 候选越多，全被拒绝的概率越小


def test_verify_rejects_bad_candidates():
    p, q = np.array([0.5, 0.5, 0.0]), np.array([0.5, 0.0, 0.5])
    rng = np.random.default_rng(0)
    for bad in ([], [0, 0], [1], [3]):
        with pytest.raises(ValueError):
            dl.distinct_draft_verify(p, q, bad, rng)
    with pytest.raises(ValueError):
        dl.distinct_draft_step_probs(p, q, 0)


# ---------------------------------------------------------------------------
# 前 k 名：点质量规则
# ---------------------------------------------------------------------------
def test_point_mass_rule_is_exact_for_every_ordered_candidate_set():
    for p, _ in _cases(seed=1, n=15):
        V = p.size
        for k in range(1, V + 1):
            for cand in itertools.permutations(range(V), k):
                assert np.abs(dl.topk_draft_step_probs(p, list(cand)) - p).max() < EXACT, (p, cand)


def test_point_mass_rule_breaks_without_zeroing_the_rejected_candidate():
    bad = _mutant(dl, "        still *= 1.0 - p[x] / s\n        p[x] = 0.0\n", "        still *= 1.0 - p[x] / s\n")
    p = np.array([0.4, 0.3, 0.2, 0.1])
    assert np.abs(bad.topk_draft_step_probs(p, [0, 1]) - p).max() > 0.05


def test_point_mass_sampler_matches_p():
    p = np.array([0.1, 0.5, 0.3, 0.1, 0.0])
    rng = np.random.default_rng(11)
    counts = np.zeros(5)
    for _ in range(3000):
        counts[dl.topk_draft_verify(p, [2, 4, 0], rng)[1]] += 1
    assert chi2_gof(counts, p)[2] > 1e-3


def test_topk_acceptance_is_the_target_mass_of_the_draft_top_k():
    p = np.array([[0.1, 0.5, 0.3, 0.1], [0.25, 0.25, 0.25, 0.25]])
    q = np.array([[0.4, 0.1, 0.4, 0.1], [0.7, 0.1, 0.1, 0.1]])
    # 第 1 行：q 的前 2 名是 0、2（并列按下标）：0.1 + 0.3；第 2 行：前 2 名 0、1：0.5
    assert np.allclose(dl.topk_acceptance(p, q, 2), [0.4, 0.5], atol=1e-15)
    assert np.allclose(dl.topk_acceptance(p, q, 1), [0.1, 0.25], atol=1e-15)


def test_topk_candidates_equal_a_stable_argsort_with_ties():
    rng = np.random.default_rng(0)
    for _ in range(50):
        q = rng.integers(0, 4, size=(3, 25)).astype(float)
        for k in (1, 2, 5, 24, 25, 26):
            assert np.array_equal(dl.topk_candidates(q, k), np.argsort(-q, axis=-1, kind="stable")[..., :k])


# ---------------------------------------------------------------------------
# 有损的规则
# ---------------------------------------------------------------------------
def test_typical_threshold_by_hand():
    """H(0.5, 0.3, 0.2) = 1.0297 nats → 0.3·e^(−H) = 0.1071 > 0.09 → τ = 0.09；均匀的 4 个：0.3/4 = 0.075 < 0.09。"""
    H = -(0.5 * math.log(0.5) + 0.3 * math.log(0.3) + 0.2 * math.log(0.2))
    assert H == pytest.approx(1.0297, abs=1e-4)
    assert float(dl.typical_threshold([0.5, 0.3, 0.2])) == pytest.approx(0.09, abs=1e-15)
    assert float(dl.typical_threshold(np.full(4, 0.25))) == pytest.approx(0.075, abs=1e-15)
    assert (dl.MEDUSA_EPSILON, dl.MEDUSA_DELTA) == (0.09, 0.3)   # Medusa 代码 medusa_generate 的默认值


LOSSY_HAND = [
    # (p, 候选, 规则, 手算的输出分布, 手算的 TV)
    ([0.5, 0.3, 0.2], [1, 2], "typical", [0, 1, 0], 0.7),       # 两个都过 0.09：取 p 大的 1
    ([0.5, 0.3, 0.2], [2, 1], "typical", [0, 1, 0], 0.7),       # 候选的顺序不算：取过线的里 p 最大的
    ([0.5, 0.3, 0.2], [1, 2], "argmax", [0.5, 0.3, 0.2], 0.0),  # argmax 0 不在候选里：从 p 抽
    ([0.5, 0.3, 0.2], [0], "typical", [1, 0, 0], 0.5),
    ([0.5, 0.3, 0.2], [0], "argmax", [1, 0, 0], 0.5),
    ([0.9, 0.06, 0.04], [1], "typical", [1, 0, 0], 0.1),        # 0.06 < 0.09 不过线：取目标的 argmax
    ([0.9, 0.06, 0.04], [1], "argmax", [0.9, 0.06, 0.04], 0.0),
    ([0.25, 0.25, 0.25, 0.25], [3], "typical", [0, 0, 0, 1], 0.75),   # τ = 0.075 < 0.25：过线
]


@pytest.mark.parametrize("p,cand,rule,dist,tv", LOSSY_HAND)
def test_lossy_rules_equal_the_hand_calculation(p, cand, rule, dist, tv):
    out = dl.lossy_step_probs(rule, p, cand)
    assert np.allclose(out, dist, atol=1e-15)
    assert float(dl.total_variation(out, p)) == pytest.approx(tv, abs=1e-12)


@pytest.mark.parametrize("p,cand,rule,dist,tv", [c for c in LOSSY_HAND if c[4] > 0])
def test_chi2_rejects_the_lossy_samples_against_p(p, cand, rule, dist, tv):
    rng = np.random.default_rng(5)
    p = np.asarray(p)
    counts = np.bincount([dl.lossy_verify(rule, p, cand, rng)[1] for _ in range(2000)], minlength=p.size)
    assert chi2_gof(counts, p)[2] < 1e-6
    assert chi2_gof(counts, dl.lossy_step_probs(rule, p, cand))[2] > 1e-3


def test_lossy_acceptance_by_hand():
    p = np.array([[0.5, 0.3, 0.2], [0.9, 0.06, 0.04]])
    q = np.array([[0.1, 0.6, 0.3], [0.1, 0.8, 0.1]])
    assert np.array_equal(dl.lossy_acceptance("typical", p, q, 1), [1.0, 0.0])
    assert np.array_equal(dl.lossy_acceptance("argmax", p, q, 1), [0.0, 0.0])
    assert np.array_equal(dl.lossy_acceptance("argmax", p, q, 3), [1.0, 1.0])
    with pytest.raises(ValueError):
        dl.lossy_step_probs("medusa", [0.5, 0.5], [0])


def test_mean_ci_by_hand():
    v = np.array([[0.0, 1.0], [1.0, 1.0]])      # 位置 1：方差 0.5，位置 2：0 → 方差 = 0.5 / 2 / 4
    m, h = dl.mean_ci(v)
    assert m == 0.75 and h == pytest.approx(1.96 * math.sqrt(0.0625), abs=1e-15)
    with pytest.raises(ValueError):
        dl.mean_ci(np.ones((3, 1)))


# ---------------------------------------------------------------------------
# 动态树
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def toy():
    """种子 04 的目标和四个草稿（drafts_lab.build_seed04_models；会话里共用一份，tests/seed04_models.py）。"""
    return seed04_models()


@pytest.fixture(scope="module")
def toy_greedy(toy):
    """种子 04 的目标在提示 [3, 1, 4, 1, 5] 上自己的贪心解码（30 个 token）：下面两个测试共用这一份。"""
    return autoregressive_generate(toy[0], [3, 1, 4, 1, 5], 30, 0.0, np.random.default_rng(0))


def test_dynamic_tree_at_T0_is_greedy_and_stays_within_the_budget(toy, toy_greedy):
    target, drafts = toy
    prompt = [3, 1, 4, 1, 5]
    greedy = toy_greedy
    for name in ("INT4 量化的自己", "二元语法表"):
        for budget, top_k, depth in ((1, 10, 6), (5, 3, 2), (40, 10, 6)):
            out, st = dynamic_tree_generate(target, drafts[name], prompt, 30, budget, 0.0, np.random.default_rng(1),
                                            top_k=top_k, depth=depth)
            assert np.array_equal(out, greedy), (name, budget)
            assert max(st["nodes"]) <= budget and len(st["accepted"]) == st["target_calls"]
            assert all(a <= depth + 1 for a in st["accepted"])


def test_dynamic_tree_stops_like_greedy(toy, toy_greedy):
    target, drafts = toy
    prompt = [3, 1, 4, 1, 5]
    stop = int(toy_greedy[7])
    want = autoregressive_generate(target, prompt, 30, 0.0, np.random.default_rng(0), stop=stop)
    out, _ = dynamic_tree_generate(target, drafts["只用前 3 层"], prompt, 30, 16, 0.0, np.random.default_rng(0),
                                   stop=stop)
    assert np.array_equal(out, want)


def test_dynamic_tree_expected_matches_the_loop_round_by_round_at_T0(toy):
    target, drafts = toy
    prompt = [2, 7, 1, 8]
    draft = drafts["只用前 3 层"]
    greedy = autoregressive_generate(target, prompt, 30, 0.0, np.random.default_rng(0))
    budgets = (2, 9, 30)
    E = dynamic_tree_expected(target, draft, prompt, greedy, 25, budgets, (0.0,), top_k=4, depth=4)
    for n, b in enumerate(budgets):
        _, st = dynamic_tree_generate(target, draft, prompt, 25, b, 0.0, np.random.default_rng(0), top_k=4, depth=4)
        starts = np.cumsum([0] + [a + 1 for a in st["accepted"]])[:-1]
        assert [E[s, n, 0] for s in starts] == [a + 1.0 for a in st["accepted"]]


def test_dynamic_tree_at_T1_samples_p_and_its_mean_matches_the_expectation(toy):
    """
    一轮（n_new = 1）跑 300 次：第一个 token 的 χ² 对目标的 p 不拒绝；平均接受深度 + 1 在期望的 4 个标准误以内。
    300 次抽样里两个模型换成按上下文记住 logits 的版本（tests/context_memo.py：带缓存、带树形遮罩的每一行 == 一次算完
    这一行能看到的 token；同一个上下文只算一次），抽样看到的分布只差舍入；树的遮罩和位置对不对由上面 T = 0 的两个测试
    （原模型）和 SmolLM2 的那个核对。p 和期望值用原模型算。
    """
    from context_memo import ContextMemoLM
    from decode_lab import adjust
    target, drafts = toy
    prompt = [2, 7, 1, 8]
    draft = drafts["INT4 量化的自己"]
    p = adjust(target.full_logits(np.asarray([prompt]))[0, -1], 1.0)
    E = dynamic_tree_expected(target, draft, prompt, [0], 1, (6,), (1.0,), top_k=3, depth=2)[0, 0, 0]
    mt, md = ContextMemoLM(target), ContextMemoLM(draft)
    first, made = np.zeros(p.size), []
    for s in range(300):
        out, st = dynamic_tree_generate(mt, md, prompt, 1, 6, 1.0, np.random.default_rng(s), top_k=3, depth=2)
        first[out[0]] += 1
        made.append(st["accepted"][0] + 1)
    assert chi2_gof(first, p)[2] > 1e-3
    made = np.asarray(made, dtype=float)
    assert abs(made.mean() - E) < 4 * made.std(ddof=1) / math.sqrt(made.size)


def test_dynamic_tree_rejects_bad_arguments(toy):
    target, drafts = toy
    rng = np.random.default_rng(0)
    for kw in ({"budget": 0}, {"budget": 2.5}):
        with pytest.raises(ValueError):
            dynamic_tree_generate(target, drafts["二元语法表"], [1, 2], 4, kw["budget"], 0.0, rng)
    with pytest.raises(ValueError):
        dynamic_tree_generate(target, drafts["二元语法表"], [1, 2], 4, 4, 0.0, rng, top_k=0)
    with pytest.raises(ValueError):
        dynamic_tree_generate(drafts["二元语法表"], target, [1, 2], 4, 4, 0.0, rng)
    with pytest.raises(ValueError):
        dynamic_tree_generate(target, drafts["二元语法表"], [1, 2], 4, 4, -1.0, rng)
    with pytest.raises(ValueError):                     # 提示 + 新 token − 1 + 预算 > 上下文 256
        dynamic_tree_generate(target, drafts["二元语法表"], [1, 2], 250, 8, 0.0, rng)


def test_face_names_are_importable_from_tree_lab():
    import tree_lab
    for name in ("distinct_draft_step_probs", "distinct_draft_verify", "dynamic_tree_generate"):
        assert callable(getattr(tree_lab, name)) and name in tree_lab.__all__


SMOLLM2_TREE = (4, 8, 1)        # 下面的测试：新 token 数、每轮的节点预算、深度


def _smollm2_tree():
    """
    下面的测试的那次生成 -> (输出, 统计, 目标在"提示 + 输出"上一次前向、每个位置的 argmax)。后台装模型的子进程提前算
    （conftest.compute_early：同一份 float64 模型，结果逐位相同）。
    """
    from smollm2_models import new_token_logits, smollm2_lm
    from drafts_lab import layer_skip_draft, layer_subset
    full, _, tok = smollm2_lm("float64")
    target = layer_subset(full, range(6), name="SmolLM2 的前 6 层")
    draft = layer_skip_draft(target, 3, 2)
    prompt = tok.chat("Name a primary color.")
    n_new, budget, depth = SMOLLM2_TREE
    out, st = dynamic_tree_generate(target, draft, prompt, n_new, budget, 0.0, np.random.default_rng(0), top_k=4,
                                    depth=depth)
    # 贪心的定义：每个 token 都是它的前缀上目标的 argmax——整段一次前向逐位核对（不用一步一步 decode 出参考序列；
    # float64 的两条前向只差 1e-13 量级的舍入，离 argmax 的并列远得很）。lm_head 只乘预测新 token 的那几行
    # （smollm2_models.new_token_logits；每一行独立，和整段算完再切出来的一样）。
    return out, st, new_token_logits(target, prompt, [int(t) for t in out]).argmax(-1)


compute_early(_smollm2_tree)


def test_dynamic_tree_on_smollm2_float64_is_greedy_token_for_token():
    """
    SmolLM2 的前 6 层（float64；共用会话里那份融合好的权重）当目标，跳过它的第 3–4 层当草稿：动态树的输出 == 目标的贪心。
    只用前几层证明的是同一件事：树 == 贪心只看验证对不对（树形遮罩、位置、两边缓存只留被接受的路径、点质量规则），
    每一层走的是同一段代码，和层数无关；真实模型比玩具多的（49152 的词表、分词器和对话模板、GQA、RoPE 的 θ）都还在。
    depth = 1（草稿每轮前向 2 次：根、第 1 层的 top_k 个兄弟）、4 个 token：T = 0 时输出 == 贪心只取决于目标这边，
    草稿长得对不对只影响接受几个；目标这边要验证的树照样有两层（兄弟共用一个 RoPE 位置、孩子只看自己的父节点）。
    这段提示走 2 轮：第 1 轮整条接受（depth + 1 个），目标缓存留下不相邻的两个节点（keep 的偏移 [0, 6]），
    第 2 轮在挪过的缓存上全部拒绝（接受 0 个）——最后一行断言这两种都有。以前 depth = 2、6 个 token、3 轮：13 次前向（草稿 9、目标 3、
    核对 1），现在 7 次（草稿 4、目标 2、核对 1），乘加约 4.9e9 → 3.1e9。
    时间几乎全在前向的次数上：每次前向都把 lm_head（49152 × 576 的 float64，226 MB）整个读一遍，树里几个节点差不多。
    """
    n_new, budget, depth = SMOLLM2_TREE
    out, st, top = early_result(_smollm2_tree)
    assert len(out) == n_new and np.array_equal(out, top)
    assert max(st["nodes"]) <= budget and st["target_calls"] < n_new
    assert min(st["accepted"]) == 0 and max(st["accepted"]) == depth + 1
