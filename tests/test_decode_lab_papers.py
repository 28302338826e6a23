"""
decode_lab 的"论文对照"一节：反解定理 3.8、期望轮数（更新方程）、独立接受的模拟、种子 04 的模型、在文本上量 α。
每个都用另一条路核对：闭式、首步分析的递推、精确的极端情形、种子 04 自己的 build_models 和 measured_alpha。
"""
import math

import numpy as np
import pytest

from decode_lab import alphas_on_text, NGramLM
from spec_math_lab import alpha_for_speedup, expected_rounds, simulate_rounds
from quant_lab import QCFG, sample_tokens
from seed04_models import seed04_models, seed04_script, seed04_script_models


# ---------------------------------------------------------------------------
# alpha_for_speedup
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("s,c", [(1.3, 0.0), (1.75, 0.0), (1.2, 0.1), (1.5, 0.05)])
def test_alpha_for_speedup_gamma1_closed_form(s, c):
    """γ = 1：加速比 = (1 + α) / (1 + c)，所以 α = s(1 + c) − 1。"""
    assert alpha_for_speedup(s, 1, c) == pytest.approx(s * (1 + c) - 1, abs=1e-10)


@pytest.mark.parametrize("s", [1.5, 2.2, 2.9])
def test_alpha_for_speedup_gamma2_quadratic(s):
    """γ = 2、c = 0：1 + α + α² = s，正根 α = (−1 + √(4s − 3)) / 2。"""
    assert alpha_for_speedup(s, 2, 0.0) == pytest.approx((-1 + math.sqrt(4 * s - 3)) / 2, abs=1e-10)


def test_alpha_for_speedup_chen_row_by_polynomial_roots():
    """Chen 的 K = 4、c = 1.8/14.1：1 + α + α² + α³ + α⁴ = s(4c + 1) 的 [0, 1] 里的实根（numpy.roots）。"""
    c = 1.8 / 14.1
    for s in (1.92, 14.1 / 7.52, 2.01, 2.46):
        roots = np.roots([1, 1, 1, 1, 1 - s * (4 * c + 1)])
        real = [r.real for r in roots if abs(r.imag) < 1e-12 and 0 <= r.real <= 1]
        assert len(real) == 1
        assert alpha_for_speedup(s, 4, c) == pytest.approx(real[0], abs=1e-10)


@pytest.mark.parametrize("s,g,c", [(0.5, 4, 0.128), (3.4, 4, 0.128), (2.0, 0, 0.1), (1.5, 1, -0.1)])
def test_alpha_for_speedup_rejects_impossible_inputs(s, g, c):
    with pytest.raises(ValueError):
        alpha_for_speedup(s, g, c)


# ---------------------------------------------------------------------------
# expected_rounds
# ---------------------------------------------------------------------------
def _rounds_first_step(alpha, gamma, n):
    """首步分析：R(m) = 1 + Σ_j P(X = j)·R(m − j)，R(m ≤ 0) = 0；X = 1 + 被接受的个数（手写的截断几何分布）。"""
    px = [alpha ** (j - 1) * (1 - alpha) for j in range(1, gamma + 1)] + [alpha ** gamma]
    R = [0.0] * (n + 1)
    for m in range(1, n + 1):
        R[m] = 1 + sum(p * R[max(m - j, 0)] for j, p in enumerate(px, 1))
    return R[n]


def test_expected_rounds_hand_worked_gamma1_n2():
    """γ = 1、n = 2：第一轮产出 2 个（概率 α）就够了，否则再来一轮：1 + (1 − α)。"""
    for a in (0.0, 0.3, 0.9, 1.0):
        assert expected_rounds(a, 1, 2) == pytest.approx(2 - a, abs=1e-12)


@pytest.mark.parametrize("a,g,n", [(0.83, 8, 96), (0.6, 2, 16), (0.9, 4, 233), (0.5, 3, 7)])
def test_expected_rounds_matches_first_step_recursion(a, g, n):
    assert expected_rounds(a, g, n) == pytest.approx(_rounds_first_step(a, g, n), rel=1e-12)


def test_expected_rounds_edges():
    assert expected_rounds(0.7, 0, 10) == pytest.approx(10.0)          # γ = 0：每轮 1 个
    assert expected_rounds(1.0, 4, 12) == pytest.approx(3.0)           # 每轮 5 个：⌈12 / 5⌉
    with pytest.raises(ValueError):
        expected_rounds(0.5, 2, 0)


# ---------------------------------------------------------------------------
# simulate_rounds
# ---------------------------------------------------------------------------
def test_simulate_rounds_extremes_are_exact():
    sim = simulate_rounds(1.0, 4, 12, 5, np.random.default_rng(0))
    assert list(sim["calls"]) == [3] * 5 and list(sim["accepted"]) == [12] * 5
    sim = simulate_rounds(0.0, 4, 12, 5, np.random.default_rng(0))
    assert list(sim["calls"]) == [12] * 5 and list(sim["accepted"]) == [0] * 5


def test_simulate_rounds_mean_calls_matches_renewal_exact():
    """模拟的平均轮数和更新方程的精确值相差不到 4 个标准误；每轮至少 1 个、至多 γ + 1 个 token。"""
    a, g, n, runs = 0.8, 4, 40, 20000
    sim = simulate_rounds(a, g, n, runs, np.random.default_rng(5))
    calls = sim["calls"]
    se = calls.std() / math.sqrt(runs)
    assert abs(calls.mean() - _rounds_first_step(a, g, n)) < 4 * se
    made = calls + sim["accepted"]                                      # 每轮 1 + 被接受的个数
    assert np.all(made >= n) and np.all(made <= n + g)


def test_simulate_rounds_per_round_acceptance_is_truncated_geometric():
    """一轮的模拟：被接受个数的平均 = α(1 − α^γ)/(1 − α)（截断几何分布的均值）。"""
    a, g, runs = 0.7, 3, 40000
    sim = simulate_rounds(a, g, 1, runs, np.random.default_rng(9))    # n_new = 1：正好一轮
    assert np.all(sim["calls"] == 1)
    mean = a * (1 - a ** g) / (1 - a)
    assert abs(sim["accepted"].mean() - mean) < 4 * sim["accepted"].std() / math.sqrt(runs)


def test_simulate_rounds_rejects_bad_arguments():
    for args in ((0.5, 0, 10, 3), (0.5, 2, 0, 3), (0.5, 2, 10, 0), (1.5, 2, 10, 3)):
        with pytest.raises(ValueError):
            simulate_rounds(*args, np.random.default_rng(0))


# ---------------------------------------------------------------------------
# build_seed04_models、alphas_on_text
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def both():
    """种子脚本、它自己的 build_models 建的、drafts_lab 建的（两份都在会话里共用，tests/seed04_models.py）。"""
    return seed04_script(), seed04_script_models(), seed04_models()


def _same_params(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if k == "layers":
            assert len(a[k]) == len(b[k])
            for la, lb in zip(a[k], b[k]):
                assert la.keys() == lb.keys()
                for m in la:
                    assert np.array_equal(la[m], lb[m]), m
        else:
            assert np.array_equal(a[k], b[k]), k


def test_build_seed04_models_gives_seed04s_exact_models(both):
    _, (t4, d4), (t, d) = both
    _same_params(t.params, t4.params)
    assert list(d) == list(d4)
    for name in d:
        if isinstance(d4[name], NGramLM):
            assert np.array_equal(d[name].table, d4[name].table)
        else:
            _same_params(d[name].params, d4[name].params)
            assert d[name].cfg == d4[name].cfg


def test_alphas_on_text_equals_seed04_measured_alpha_and_argmax_agreement(both):
    s04, (t4, d4), (t, d) = both
    toks = sample_tokens(t.params, QCFG, n_seq=2, length=32, seed=0)
    got = alphas_on_text(t, d, toks, (0.0, 1.0))
    lp = t4.full_logits(toks).argmax(-1)
    for name, dr in d4.items():
        assert got[name][1] == pytest.approx(s04.measured_alpha(t4, dr, toks, 1.0), abs=1e-12)
        lq = dr.table[toks] if isinstance(dr, NGramLM) else dr.full_logits(toks)
        assert got[name][0] == pytest.approx(float(np.mean(lq.argmax(-1) == lp)), abs=1e-12)
