"""
一条草稿链的验证只有一处（decode_lab.verify_chain）：普通投机解码、自适应 γ（模型草稿和 prompt lookup）都调用它；
树形投机解码用自己的多候选规则（tree_lab.multi_draft_verify）。

【回归】自适应生成器原来有一份自己的接受 / 拒绝循环：把那份里的 r·q(x) < p(x) 换成 <=，整个测试集仍然全绿
（speculative_generate 里同样的错会被抓到）。这里用一个永远返回 0.0 的"随机数发生器"：T = 0 时 p 是 one-hot，
草稿和目标的 argmax 不同时 p(x) = 0、q(x) = 1，0·1 < 0 不成立 → 拒绝；写成 <= 就会接受一个目标概率为 0 的 token，
输出就不再是目标的贪心序列。每个生成器各测一次，所以任何一处的 <= 都会变红。
"""
import numpy as np
import pytest

from decode_lab import NGramLM, TransformerLM, autoregressive_generate, speculative_generate, verify_chain
from lookup_lab import PromptLookup, speculative_generate_adaptive
from sampler_cases import TINY, dist
from transformer_lab import init_params
from tree_lab import tree_speculative_generate


class ZeroRNG:
    """只提供 random()，永远返回 0.0（U[0, 1) 里合法的一个值）；数一下用了几次。"""

    def __init__(self):
        self.calls = 0

    def random(self):
        self.calls += 1
        return 0.0


@pytest.fixture(scope="module")
def pair():
    target = TransformerLM(init_params(TINY, seed=0), TINY, "目标")
    draft = TransformerLM(init_params(TINY, seed=5), TINY, "另一个")
    return target, draft


PROMPT = [1, 4, 2, 1, 4]


def _greedy(target, n):
    return autoregressive_generate(target, PROMPT, n, 0, np.random.default_rng(0))


def test_the_draft_disagrees_with_the_target_often(pair):
    """前提：草稿的贪心 token 和目标的常常不同（否则 p(x) = 0 的情形根本不出现，下面的测试抓不到 <=）。"""
    target, draft = pair
    toks = np.array([PROMPT + _greedy(target, 30).tolist()])
    agree = (target.full_logits(toks).argmax(-1) == draft.full_logits(toks).argmax(-1)).mean()
    assert agree < 0.7


def test_chain_generator_with_zero_uniforms_is_greedy(pair):
    target, draft = pair
    out, st = speculative_generate(target, draft, PROMPT, 30, 3, 0, ZeroRNG())
    assert out.tolist() == _greedy(target, 30).tolist()
    assert min(st["accepted"]) == 0            # 确实有被拒绝的草稿


@pytest.mark.parametrize("gamma_max", [None, 6])
def test_adaptive_generator_with_zero_uniforms_is_greedy(pair, gamma_max):
    target, draft = pair
    out, st = speculative_generate_adaptive(target, draft, PROMPT, 30, 2, 0, ZeroRNG(), gamma_max=gamma_max)
    assert out.tolist() == _greedy(target, 30).tolist()
    assert min(st["accepted"]) == 0


def test_adaptive_prompt_lookup_with_zero_uniforms_is_greedy(pair):
    """prompt lookup 的草稿是确定的（q 是 one-hot）：目标不照抄时 p(x) = 0，必须拒绝。"""
    target, _ = pair
    prompt = PROMPT * 3                        # 有东西可查
    greedy = autoregressive_generate(target, prompt, 30, 0, np.random.default_rng(0))
    out, st = speculative_generate_adaptive(target, PromptLookup(2), prompt, 30, 3, 0, ZeroRNG())
    assert out.tolist() == greedy.tolist()
    assert max(st["drafted"]) > 0 and min(a for a, d in zip(st["accepted"], st["drafted"]) if d) == 0


@pytest.mark.parametrize("branching", [(2, 1), (1, 1, 1)])
def test_tree_generator_with_zero_uniforms_is_greedy(pair, branching):
    target, draft = pair
    out, st = tree_speculative_generate(target, draft, PROMPT, 30, branching, 0, ZeroRNG())
    assert out.tolist() == _greedy(target, 30).tolist()
    assert min(st["accepted"]) == 0


def test_verify_chain_by_hand():
    """手算：p、q 写死；均匀数序列写死，逐步走一遍接受 / 拒绝和修正 token。"""
    class Seq:
        def __init__(self, us):
            self.us = list(us)

        def random(self):
            return self.us.pop(0)

    p = [dist([1, 1, 2]), dist([0, 1, 1]), dist([1, 0, 0])]       # p₁, p₂, p₃（额外的 token 用 p₃）
    q = [dist([1, 1, 2]), dist([1, 0, 0])]                          # q₁ == p₁：必接受；q₂ 是 token 0 上的 one-hot
    # 草稿 2（p₁(2) = q₁(2)，0.9·0.5 < 0.5 接受），草稿 0（p₂(0) = 0：拒绝）；残差 = norm(max(0, p₂ − q₂)) = p₂，
    # u = 0.6 → 累积 [0, 0.5, 1]，第一个 > 0.6 的是 token 2
    rng = Seq([0.9, 0.0, 0.6])
    assert verify_chain(p, q, [2, 0], rng) == (1, 2) and rng.us == []
    # 全部接受：两个草稿都被接受（q₂ 换成 p₂ 本身），额外的 token 从 p₃ 抽：token 0
    rng = Seq([0.2, 0.3, 0.99])
    assert verify_chain(p, [q[0], p[1]], [2, 1], rng) == (2, 0) and rng.us == []
    # k = 0：直接从 p₁ 抽，只用一个均匀数
    rng = Seq([0.3])
    assert verify_chain(p[:1], [], [], rng) == (0, 1)


def test_ngram_draft_disjoint_support_is_always_rejected():
    """二元语法表草稿（q 只在目标概率为 0 的 token 上）：任何 r 都必须拒绝，输出只有目标能给的 token。"""
    V = 4
    tgt = np.where(np.tile([True, True, False, False], (V, 1)), np.log(0.5), -np.inf)
    drf = np.where(np.tile([False, False, True, True], (V, 1)), np.log(0.5), -np.inf)
    out, st = speculative_generate(NGramLM(tgt), NGramLM(drf), [0], 20, 2, 1.0, ZeroRNG())
    assert set(out.tolist()) <= {0, 1} and st["accepted"] == [0] * st["target_calls"]


# ---------------------------------------------------------------------------
# stats_lab.chi2_gof 的自由度（以前只在脚本测试里间接被抓到）
# ---------------------------------------------------------------------------
def test_chi2_gof_degrees_of_freedom_pinned_by_hand():
    import math
    from stats_lab import chi2_gof
    # 四格都够大：χ² = (25 + 25 + 0 + 0) / 25 = 2，自由度 3；p = Q(3/2, 1) = erfc(1) + 2·e^{−1}/√π
    stat, dof, p = chi2_gof([30, 20, 25, 25], [0.25] * 4)
    assert (stat, dof) == (2.0, 3)
    assert p == pytest.approx(math.erfc(1.0) + 2 * math.exp(-1.0) / math.sqrt(math.pi), rel=1e-10)
    # 两格期望 1 < 5：合并成一格（观测 5、期望 2），剩 3 格，自由度 2；χ² = 16/49 + 1/49 + 9/2；p = e^{−χ²/2}
    stat, dof, p = chi2_gof([45, 50, 3, 2], [0.49, 0.49, 0.01, 0.01])
    assert dof == 2 and stat == pytest.approx(17 / 49 + 4.5, rel=1e-12)
    assert p == pytest.approx(math.exp(-(17 / 49 + 4.5) / 2), rel=1e-10)
