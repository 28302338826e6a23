"""
第 6 讲 07（草稿的账、估计的偏差、γ = 8 运算量比的抽样分布）：每个演示返回它的观察引用的数。
演示 1、3 按脚本的大小跑，用参数个数、首步分析的递推、手写的搜索核对；演示 2、4 真跑模型，测试里把提示数、
种子组数、新 token 数调小（同一段代码），再用直接调用 speculative_generate、独立的计数和 statistics.NormalDist 核对。
"比值 = (γ + 1) × 轮数 ÷ 新 token 数"这个恒等式用真跑的账本（Counter）核对。
"""
import contextlib
import io
import math
from statistics import NormalDist

import numpy as np
import pytest

from conftest import load_script
from decode_lab import autoregressive_generate, build_seed04_models, speculative_generate
from quant_lab import QCFG, sample_tokens
from transformer_lab import MATMUL_OPS, Counter, config_like

NAMES = ("INT4 量化的自己", "只用前 3 层", "只用前 1 层", "二元语法表")


def _quiet(fn, *a):
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*a)


@pytest.fixture(scope="module")
def s07():
    return load_script("lecture06/07_draft_cost_and_bias.py")


@pytest.fixture(scope="module")
def models():
    return build_seed04_models()


@pytest.fixture(scope="module")
def costs(s07, models):
    return _quiet(s07.demo1_costs, *models)


def _thm38(a, g, c):
    return sum(a ** i for i in range(g + 1)) / (g * c + 1)


def test_07_costs_from_parameter_counts(costs):
    """ĉ = 草稿 / 目标 每 token 的矩阵乘法参数；c = 读的字节之比（INT4-g32 = 4.5 / 16；二元语法表读一行 192 个数）。"""
    mp = QCFG.to_model_config().matmul_params()
    for k, name in ((3, "只用前 3 层"), (1, "只用前 1 层")):
        r = config_like(QCFG, n_layers=k).to_model_config().matmul_params() / mp
        assert costs[name]["c_hat"] == pytest.approx(r, rel=1e-12)
        assert costs[name]["c"] == pytest.approx(r, rel=1e-12)
    assert costs["只用前 3 层"]["c_hat"] > 0.75 and costs["只用前 1 层"]["c_hat"] > 0.25   # lm_head 照算
    assert costs["INT4 量化的自己"]["c_hat"] == pytest.approx(1.0, rel=1e-12)
    assert costs["INT4 量化的自己"]["c"] == pytest.approx(4.5 / 16, rel=1e-12)
    assert costs["二元语法表"]["c_hat"] == 0.0
    assert costs["二元语法表"]["c"] == pytest.approx(2 * 192 / (2 * mp), rel=1e-12)


def test_07_best_gamma_by_brute_force(costs):
    for name, k in costs.items():
        sp = [_thm38(k["alpha"], g, k["c"]) for g in range(1, 60)]
        g = int(np.argmax(sp)) + 1
        assert k["best"][0] == g and k["best"][1] == pytest.approx(sp[g - 1], rel=1e-12)
        assert k["best"][1] > 1                                  # 观察 3：四个都值得用
    best = max(costs, key=lambda n: costs[n]["best"][1])
    assert best == "二元语法表"                                   # 观察 4：比 INT4 还快
    assert costs["二元语法表"]["best"][1] > costs["只用前 1 层"]["best"][1]
    assert costs["只用前 3 层"]["best"][1] < 1.1                   # "几乎白忙"


def test_07_ratio_identity_with_the_ledger(models):
    """目标模型的矩阵乘法 FLOPs（扣掉提示的预填充）：投机 ÷ 普通 = (γ + 1) × 轮数 ÷ 新 token 数。"""
    target, drafts = models
    pr = sample_tokens(target.params, QCFG, n_seq=1, length=16, seed=11)[0]
    n_new, g = 24, 8
    per_tok = 2 * QCFG.to_model_config().matmul_params()
    extra = (len(pr) - 1) * per_tok
    cb, ct = Counter(), Counter()
    autoregressive_generate(target, pr, n_new, 1.0, np.random.default_rng(0), counter=cb)
    _, st = speculative_generate(target, drafts["只用前 3 层"], pr, n_new, g, 1.0, np.random.default_rng(0), counter_t=ct)
    ratio = (ct.total("flops", MATMUL_OPS) - extra) / (cb.total("flops", MATMUL_OPS) - extra)
    assert ratio == pytest.approx((g + 1) * st["target_calls"] / n_new, rel=1e-12)


def test_07_real_loop_small(s07, models, costs, monkeypatch):
    """演示 2 调小（1 个提示 × 24 个 token，γ = 2、8）：轮数等于直接调用的结果，各栏按定义重算。"""
    monkeypatch.setattr(s07, "N_PROMPTS_REAL", 1)
    monkeypatch.setattr(s07, "N_NEW", 24)
    monkeypatch.setattr(s07, "GAMMAS", (2, 8))
    target, drafts = models
    res = _quiet(s07.demo2_real_loop, target, drafts, costs)
    pr = sample_tokens(target.params, QCFG, n_seq=1, length=16, seed=11)[0]
    for name in ("只用前 1 层", "二元语法表"):
        k = costs[name]
        for g in (2, 8):
            _, st = speculative_generate(target, drafts[name], pr, 24, g, 1.0, np.random.default_rng(100))
            r = res[(name, g)]
            assert r["calls"] == st["target_calls"] and r["accepted"] == st["accepted"]
            assert r["e"] == pytest.approx(24 / st["target_calls"], rel=1e-12)
            assert r["speedup"] == pytest.approx(24 / st["target_calls"] / (g * k["c"] + 1), rel=1e-12)
            assert r["speedup_thm"] == pytest.approx(_thm38(k["alpha"], g, k["c"]), rel=1e-12)
            assert r["ops"] == pytest.approx((g + 1 + g * k["c_hat"]) * st["target_calls"] / 24, rel=1e-12)
            assert r["ops_thm"] == pytest.approx((g * k["c_hat"] + g + 1) / sum(k["alpha"] ** i for i in range(g + 1)),
                                                 rel=1e-12)
            a = k["alpha"]
            x = [(j, a ** (j - 1) * (1 - a) if j <= g else a ** g) for j in range(1, g + 2)]   # 每轮产出 j 个的概率
            mean = sum(j * p for j, p in x)
            var = sum(j * j * p for j, p in x) - mean ** 2
            assert r["z"] == pytest.approx((24 / st["target_calls"] - mean) / math.sqrt(var / st["target_calls"]),
                                           rel=1e-9)


def _rounds(alpha, gamma, n):
    px = [alpha ** (j - 1) * (1 - alpha) for j in range(1, gamma + 1)] + [alpha ** gamma]
    R = [0.0] * (n + 1)
    for m in range(1, n + 1):
        R[m] = 1 + sum(p * R[max(m - j, 0)] for j, p in enumerate(px, 1))
    return R[n]


def test_07_estimator_bias(s07, costs):
    fake_real = {("a", 1): {"e": 1.9, "accepted": [1, 1, 0, 1]}, ("b", 1): {"e": 2.0, "accepted": [1, 1]}}
    out = _quiet(s07.demo3_estimator_bias, costs, fake_real)
    a = costs["只用前 3 层"]["alpha"]
    rows = out["rows"]
    for (g, n), r in rows.items():
        e = sum(a ** i for i in range(g + 1))
        assert r["e"] == pytest.approx(e, rel=1e-12)
        assert r["exact"] == pytest.approx(n / _rounds(a, g, n), rel=1e-12)
        assert r["seed"] < e                                      # 偏低
        assert abs(r["seed"] / r["exact"] - 1) < 0.02             # 和不抽样的值一致（抽样误差 + 小的 Jensen 项）
        assert abs(r["per_round"] / e - 1) < 0.015                # "几乎没有偏差"
    for g in (2, 8):                                              # 随 n_new 缩小，大约按 1/n
        b = [1 - rows[(g, n)]["exact"] / rows[(g, n)]["e"] for n in s07.BIAS_NEW]
        assert b[0] > b[1] > b[2] > 0
        assert 0.5 < (b[1] * 96) / (b[2] * s07.CAP_NEW) < 2
    mid = rows[(8, 96)]
    assert 1 - mid["seed"] / mid["e"] < mid["seed_sd"] / mid["e"]  # 比一次抽样的标准差小
    assert out["real_rel"] == pytest.approx([1.9 / 1.75 - 1, 2.0 / 2.0 - 1])


def test_07_cap_is_the_context_limit(s07):
    assert s07.CAP_NEW == 233                                     # 16 + 233 − 1 + 8 = 256 = max_seq
    assert 16 + s07.CAP_NEW - 1 + 8 == QCFG.max_seq


def test_07_flop_ratio_small(s07, models, monkeypatch):
    """演示 4 调小（3 组种子 × 1 个提示 × 24 个 token，模拟 400 次）：比值、α̂、均值、要几个提示，逐个另算。"""
    for k, v in (("N_DRAWS", 3), ("DRAW_PROMPTS", 1), ("N_NEW", 24), ("SIM_REPS", 400)):
        monkeypatch.setattr(s07, k, v)
    target, drafts = models
    r = _quiet(s07.demo4_flop_ratio, target, drafts)
    acc, ratios = [], []
    for d in (1, 2, 3):
        pr = sample_tokens(target.params, QCFG, n_seq=4, length=16, seed=11 + 1000 * d)[0]
        _, st = speculative_generate(target, drafts["只用前 3 层"], pr, 24, 8, 1.0, np.random.default_rng(1000 * d))
        ratios.append(9 * st["target_calls"] / 24)
        acc += st["accepted"]
    assert list(r["ratios"]) == pytest.approx(ratios, rel=1e-12)
    checked = sum(min(n + 1, 8) for n in acc)                   # 每轮检查过的草稿：被接受的 + 第一个被拒绝的
    assert r["alpha_hat"] == pytest.approx(sum(acc) / checked, rel=1e-12)
    assert r["se"] == pytest.approx(math.sqrt(r["alpha_hat"] * (1 - r["alpha_hat"]) / checked), rel=1e-12)
    mu = 9 * _rounds(r["alpha_hat"], 8, s07.CAP_NEW) / s07.CAP_NEW
    assert r["mu_cap"] == pytest.approx(mu, rel=1e-12)
    assert r["sd1"] == pytest.approx(float(np.std(r["cap1"], ddof=1)), rel=1e-12)
    prob = lambda p: (NormalDist(mu, r["sd1"] / math.sqrt(p)).cdf(2.0)  # noqa: E731
                      - NormalDist(mu, r["sd1"] / math.sqrt(p)).cdf(1.8))
    for p, (sd, f) in r["scale"].items():
        assert sd == pytest.approx(r["sd1"] / math.sqrt(p), rel=1e-12) and f == pytest.approx(prob(p), abs=1e-12)
    need = next((p for p in range(1, 10 ** 6) if prob(p) >= 0.95), None)
    assert r["need"] == need
    assert r["mu_range"][0] < mu < r["mu_range"][1]
    assert r["shrink"] == pytest.approx(np.std(r["one"], ddof=1) / np.std(r["seed_set"], ddof=1), rel=1e-12)


def test_07_histogram_counts_every_simulated_ratio_once(s07, models, monkeypatch):
    """演示 4 的直方图：各格的次数加起来 = 模拟次数；带 * 的格加起来 = 落在 1.8–2.0 的次数（独立地数）。"""
    for k, v in (("N_DRAWS", 2), ("DRAW_PROMPTS", 1), ("N_NEW", 24), ("SIM_REPS", 300)):
        monkeypatch.setattr(s07, k, v)
    r = _quiet(s07.demo4_flop_ratio, *models)
    labels, counts = r["hist"]
    x = r["seed_set"]
    assert sum(counts) == len(x) == 300
    starred = sum(c for lab, c in zip(labels, counts) if lab.endswith("*"))
    assert starred == int(np.sum((x >= 1.8) & (x <= 2.0)))
    assert counts[0] == int(np.sum(x < 1.5)) and counts[-1] == int(np.sum(x >= 2.3))
