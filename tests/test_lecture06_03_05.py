"""
第 6 讲 03（投机解码不改变分布）和 05（批大了投机解码还划不划算）：每个演示返回它的观察引用的数；
这里用独立的算法（新开一次前向、自己写的 Pearson χ²、闭式）核对，并核对观察里说的大小关系。
"""
import ast
import inspect
import math

import numpy as np
import pytest

from conftest import load_script, script_demo_text, script_results, script_stdout, unwrap
from seed04_models import built_by

from spec_math_lab import expected_tokens  # noqa: E402
from transformer_lab import softmax  # noqa: E402


# ---------------------------------------------------------------------------
# 03_spec_decode_exact.py
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def s03():
    return load_script("lecture06/03_spec_decode_exact.py")


@pytest.fixture(scope="module")
def models03(s03):
    """
    03 的模型：03 的 build_models 和种子 04 的逐句相同、用到的名字也是同一批对象
    （test_03_build_models_is_the_same_as_seed04），所以直接用整个会话共用的那份 04 的构造
    （tests/seed04_models.py：采样二元语法表的 64 × 128 个 token 只做一次）。
    """
    return built_by(load_script("lecture06/04_spec_decode_speedup.py").build_models)


@pytest.fixture(scope="module")
def r1(s03, models03):
    """演示 1 返回的数：取自脚本自己的运行（test_scripts 跑的那一次，console.save_results 存下的），不在进程里再跑一遍。"""
    return script_results("lecture06/03_spec_decode_exact.py")["d1"]


def _body_without_docstring(src):
    fn = ast.parse(src).body[0]
    body = fn.body[1:] if isinstance(fn.body[0], ast.Expr) else fn.body
    return [ast.dump(node) for node in body]


def test_03_build_models_is_the_same_as_seed04(s03):
    """
    03 和种子 04 用同一个 build_models（04 说它"重新写一遍"了 03 的模型构造）：函数体逐句相同，函数体里用到的
    每个模块级名字（TransformerLM、quantize_params、sample_tokens……）在两个脚本里也是同一个对象——所以两个构造的结果
    逐位相同，models03 用 04 的那份。
    """
    s04 = load_script("lecture06/04_spec_decode_speedup.py")
    assert _body_without_docstring(inspect.getsource(s03.build_models)) == \
        _body_without_docstring(inspect.getsource(s04.build_models))
    names = {n.id for n in ast.walk(ast.parse(inspect.getsource(s03.build_models))) if isinstance(n, ast.Name)}
    globals_used = sorted(n for n in names if n in vars(s03) or n in vars(s04))
    assert {"TransformerLM", "quantize_params", "sample_tokens", "NGramLM", "init_params", "config_like",
            "QCFG"} <= set(globals_used)
    for n in globals_used:
        assert getattr(s03, n) is getattr(s04, n), n


def test_03_exact_joint_matches_a_fresh_pass(s03, models03, r1):
    target, _ = models03
    prompt = s03.the_prompt(target)
    p1, joint = r1["p1"], r1["joint"]
    assert p1.sum() == pytest.approx(1.0, abs=1e-12)
    assert joint.sum(1) == pytest.approx(p1, abs=1e-12)          # 每行的和 = p1(x)
    for x in (0, int(np.argmax(p1)), 191):                         # 单独一条序列重新前向
        seq = np.concatenate([prompt, [x]])[None]
        cond = softmax(target.full_logits(seq)[0, -1])
        assert joint[x] == pytest.approx(p1[x] * cond, rel=1e-9, abs=1e-15)


def _pearson(counts, probs, min_expected=5.0):
    """独立实现的 Pearson χ²（期望 < 5 的格子合并成一格）。"""
    n = counts.sum()
    e = probs * n
    big = e >= min_expected
    o_cells = np.append(counts[big], counts[~big].sum())
    e_cells = np.append(e[big], e[~big].sum())
    return float(((o_cells - e_cells) ** 2 / e_cells).sum()), len(o_cells) - 1


def test_03_chi2_statistics_recomputed(s03, r1):
    V = 192
    p1, m2 = r1["p1"], r1["joint"].sum(0)
    for key, samples in r1["runs"].items():
        assert samples.shape == (s03.N_RUNS, s03.N_NEW)
        st, dof = _pearson(np.bincount(samples[:, 0], minlength=V).astype(float), p1)
        assert r1["chi2"][key][0] == pytest.approx(st, rel=1e-12)
        assert dof == r1["dofs"][0]
        st2, dof2 = _pearson(np.bincount(samples[:, 1], minlength=V).astype(float), m2)
        assert r1["chi2"][key][1] == pytest.approx(st2, rel=1e-12) and dof2 == r1["dofs"][1]


def _chi2_sf_closed(x, k):
    """χ² 右尾概率的闭式（不用 stats_lab.chi2_sf）：k 偶数时 e^{−z} Σ_{i<k/2} z^i/i!；
    k 奇数时 erfc(√z) + e^{−z} Σ_{i<(k−1)/2} z^{i+1/2}/Γ(i + 3/2)，z = x/2。"""
    z = x / 2.0
    if k % 2 == 0:
        term = total = 1.0
        for i in range(1, k // 2):
            term *= z / i
            total += term
        return math.exp(-z) * total
    total, term = math.erfc(math.sqrt(z)), math.sqrt(z) / math.gamma(1.5)
    for i in range((k - 1) // 2):
        total += math.exp(-z) * term
        term *= z / (i + 1.5)
    return total


def test_chi2_sf_closed_form_known_values():
    # 参考值：scipy.stats.chi2.sf（自由度 1、2、3 的 5% 分位点和一个大自由度的中位附近）
    assert _chi2_sf_closed(3.841458820694124, 1) == pytest.approx(0.05, rel=1e-9)
    assert _chi2_sf_closed(5.991464547107979, 2) == pytest.approx(0.05, rel=1e-9)
    assert _chi2_sf_closed(7.814727903251178, 3) == pytest.approx(0.05, rel=1e-9)
    assert _chi2_sf_closed(38.88513865983007, 26) == pytest.approx(0.05, rel=1e-8)


def _independent_p_values(s03, r1):
    """每种做法三个检验的 p 值：统计量用上面独立写的 Pearson χ²，p 值用闭式；联合检验的分组也自己做。"""
    V, k = 192, s03.JOINT_K
    p1, joint = r1["p1"], r1["joint"]
    m2 = joint.sum(0)

    def classes(probs):                                           # 最可能的 k 个各一类，其余第 k 类
        cls = np.full(V, k)
        order = sorted(range(V), key=lambda t: (-probs[t], t))
        for rank, t in enumerate(order[:k]):
            cls[t] = rank
        return cls

    c1, c2 = classes(p1), classes(m2)
    cell = np.zeros((k + 1) ** 2)
    for x in range(V):
        for y in range(V):
            cell[c1[x] * (k + 1) + c2[y]] += joint[x, y]
    out = {}
    for key, samples in r1["runs"].items():
        pvs = []
        for counts, probs in ((np.bincount(samples[:, 0], minlength=V), p1),
                              (np.bincount(samples[:, 1], minlength=V), m2),
                              (np.bincount(c1[samples[:, 0]] * (k + 1) + c2[samples[:, 1]], minlength=(k + 1) ** 2),
                               cell)):
            st, dof = _pearson(counts.astype(float), probs)
            pvs.append(_chi2_sf_closed(st, dof))
        out[key] = pvs
    return out


def test_03_no_test_rejects_the_correct_samplers(s03, r1):
    """正确的算法：27 个 p 值（独立地重算）都在 Bonferroni 门槛之上（固定种子，这是一个确定的事实；观察 2 说的就是它）。"""
    indep = _independent_p_values(s03, r1)
    assert set(indep) == set(r1["p_values"])
    for key, pvs in indep.items():
        assert r1["p_values"][key] == pytest.approx(pvs, rel=1e-7, abs=1e-12), key
    pv = np.array([p for ps in indep.values() for p in ps])
    assert r1["n_p"] == len(pv) == 9 * 3                         # 自回归 + 4 个草稿 × 2 个 γ，各 3 个检验
    assert r1["min_p"] == pytest.approx(pv.min(), rel=1e-7)
    assert r1["min_p"] > 0.05 / 27 and r1["bonferroni"] == pytest.approx(0.05 / 27)
    assert r1["n_small"] == int((pv < 0.05).sum())
    # 第 1 个 token 的频率和 p₁ 的最大差：从样本直接数
    dev = max(np.abs(np.bincount(sm[:, 0], minlength=192) / s03.N_RUNS - r1["p1"]).max() for sm in r1["runs"].values())
    assert r1["max_dev"] == pytest.approx(dev, abs=1e-15) and dev < 0.05


def test_03_histogram_chart_figures(s03, r1):
    """图（issue 9 第 3 项）和它的观察：投机解码 8 种做法的第 1 个 token 合起来，和 p₁ 比；这里从样本重新数。"""
    spec = [k for k in r1["runs"] if k[1] > 0]
    assert len(spec) == 8 and r1["pooled_n"] == 8 * s03.N_RUNS
    first = np.concatenate([r1["runs"][k][:, 0] for k in spec])
    p1 = r1["p1"]
    top8 = sorted(range(192), key=lambda t: (-p1[t], t))[:8]
    assert list(r1["chart_tokens"]) == top8
    counts = {t: int((first == t).sum()) for t in top8}
    dev = {t: abs(counts[t] / len(first) - p1[t]) for t in top8}
    worst = max(top8, key=lambda t: dev[t])
    assert r1["pooled_worst_token"] == worst and r1["pooled_max_dev"] == pytest.approx(dev[worst], abs=1e-15)
    z = abs(counts[worst] - len(first) * p1[worst]) / math.sqrt(len(first) * p1[worst] * (1 - p1[worst]))
    assert r1["pooled_worst_z"] == pytest.approx(z, rel=1e-12) and z < 3
    # 正态分布双侧尾概率：P(|Z| ≥ z) = 2(1 − Φ(z))，Φ 用 erf 写出来
    assert r1["pooled_p_one"] == pytest.approx(2 * (1 - 0.5 * (1 + math.erf(z / math.sqrt(2)))), rel=1e-9)


def _q1(s03, draft, prompt):
    """草稿在提示之后第 1 个 token 的分布（独立写：二元语法表查最后一个 token 那一行，transformer 新开一次前向）。"""
    logits = draft.table[int(prompt[-1])] if hasattr(draft, "table") else draft.forward(np.asarray(prompt)[None])[0, -1]
    return softmax(np.asarray(logits, dtype=float))


def test_03_betas_are_one_minus_tv(s03, models03, r1):
    target, drafts = models03
    prompt = s03.the_prompt(target)
    for name, dr in drafts.items():
        q1 = _q1(s03, dr, prompt)
        assert r1["betas"][name] == pytest.approx(1 - 0.5 * np.abs(r1["p1"] - q1).sum(), abs=1e-12), name
    # 观察 4：草稿越差 β 越小（build_models 的顺序：INT4、前 3 层、前 1 层、二元语法表）
    b = [r1["betas"][n] for n in drafts]
    assert b == sorted(b, reverse=True)


def test_03_power_against_known_bugs(s03, models03, r1, capsys):
    out = s03.demo2_power(*models03, r1["min_p"], r1["n_p"])
    text = capsys.readouterr().out
    assert "e-17" not in text and "e-16" not in text and "< 1e-14" in text   # 舍入误差只打印上界
    target, drafts = models03
    prompt = s03.the_prompt(target)
    names = list(out)
    for n in names:
        v = out[n]
        assert v["exact_dev"] < s03.EXACT_BOUND                     # 精确枚举：输出就是 p
        assert v["beta"] == pytest.approx(r1["betas"][n], abs=1e-12)
        # 错误 A 的 TV，独立的闭式：输出 − p = (1 − β)·p − max(0, p − q)
        p, q = r1["p1"], _q1(s03, drafts[n], prompt)
        tv_a = 0.5 * np.abs((1 - v["beta"]) * p - np.maximum(p - q, 0)).sum()
        assert v["from_p"][0] == pytest.approx(tv_a, abs=1e-12)
        assert v["no_check"][0] == pytest.approx(1 - v["beta"], abs=1e-12)   # TV(p, q) = 1 − Σmin(p, q)
        assert v["no_check"][2] < 1e-6                              # 错误 B 总被抓住
        assert v["from_p"][0] < v["no_check"][0]                    # 错误 A 更隐蔽
    # 草稿越差，错误 A 离 p 越远；最差的两个草稿上检验抓住了它
    tvs = [out[n]["from_p"][0] for n in names]
    assert tvs == sorted(tvs)
    assert out["只用前 1 层"]["from_p"][2] < 1e-3 and out["二元语法表"]["from_p"][2] < 1e-3
    # 正确算法的最小 p 值比所有被抓住的错误的 p 值都大得多
    assert r1["min_p"] > 100 * max(out[n]["from_p"][2] for n in ("只用前 1 层", "二元语法表"))


def test_03_p_values_in_one_format(s03, models03, r1, capsys):
    """issue 8 第 18 条：两个演示的 p 值同一种写法（和 02 脚本一样）：≥ 0.001 三位小数，更小的只打印数量级上界。"""
    from console import fmt_p
    s02 = load_script("lecture06/02_rejection_sampling.py")
    assert s03.fmt_p is fmt_p and s02.fmt_p is fmt_p           # 两个脚本用 console 里同一个写法
    assert fmt_p(0.0731) == "0.073" and fmt_p(5.6e-12) == "< 1e-11" and fmt_p(0.0) == "< 1e-299"
    assert fmt_p(7.04e-6) == "< 1e-5" and fmt_p(1e-3) == "0.001" and fmt_p(9.9e-4) == "< 1e-3"
    s03.demo2_power(*models03, r1["min_p"], r1["n_p"])
    text = capsys.readouterr().out
    import re
    assert not re.search(r"\d\.?\de-\d", text)                     # 没有 .2g 式的 "5.6e-12"、"7e-06"
    assert "< 1e-" in text


def test_03_greedy_is_token_for_token_identical(s03, models03, capsys):
    r = script_results("lecture06/03_spec_decode_exact.py")["d3"]    # 演示 3 返回的数：脚本自己那次运行存下的
    assert r["n_diff"] == 0
    assert r["n_cfg"] == 4 * len(s03.GREEDY_GAMMAS)
    assert r["n_tokens"] == r["n_cfg"] * s03.GREEDY_PROMPTS * s03.GREEDY_NEW
    for (name, g), v in r["per_cfg"].items():
        assert 1.0 <= v["tokens_per_call"] <= g + 1
        # 各轮产出 ≥ 留下的；每个提示最后一轮最多多出 γ 个
        kept = s03.GREEDY_PROMPTS * s03.GREEDY_NEW
        assert kept <= v["produced"] <= v["calls"] * (g + 1) and v["produced"] - kept <= s03.GREEDY_PROMPTS * g
    # 观察 2 的"一共确认了 86 个"，另一条路：T = 0 时每轮是确定的，让生成器不截断（n_new = 它在各提示上产出的个数），
    # 前向次数必须一样，输出必须是目标贪心序列的延长；各提示产出的个数加起来 = 打印的"确认了"。
    from decode_lab import autoregressive_generate, speculative_generate
    from quant_lab import QCFG, sample_tokens
    target, drafts = models03
    best = max(r["per_cfg"], key=lambda k: r["per_cfg"][k]["tokens_per_call"])
    assert best == ("INT4 量化的自己", 8)
    prompts = sample_tokens(target.params, QCFG, n_seq=s03.GREEDY_PROMPTS, length=16, seed=11)
    total, calls = 0, 0
    for i, pr in enumerate(prompts):
        _, st = speculative_generate(target, drafts[best[0]], pr, s03.GREEDY_NEW, 8, 0.0, np.random.default_rng(i))
        m = st["target_calls"] + sum(st["accepted"])
        toks, st2 = speculative_generate(target, drafts[best[0]], pr, m, 8, 0.0, np.random.default_rng(i))
        assert st2["target_calls"] == st["target_calls"] and len(toks) == m
        np.testing.assert_array_equal(toks, autoregressive_generate(target, pr, m, 0.0, np.random.default_rng(0)))
        total, calls = total + m, calls + st["target_calls"]
    assert (r["per_cfg"][best]["produced"], r["per_cfg"][best]["calls"]) == (total, calls) == (86, 22)


# ---------------------------------------------------------------------------
# 05_spec_decode_batching.py
# ---------------------------------------------------------------------------
H100_BW, H100_BF16 = 3.35e12, 989.4e12


@pytest.fixture(scope="module")
def s05():
    return load_script("lecture06/05_spec_decode_batching.py")


def _step(model, b, ctx, n=1):
    """独立写的 roofline：8 块 H100（理想张量并行），BF16 权重和 KV。"""
    flops = b * n * (2 * model.matmul_params() + 4 * model.n_heads * model.head_dim * model.n_layers * ctx)
    byt = 2 * model.active_params() + b * ctx * 2 * 2 * model.n_kv_heads * model.head_dim * model.n_layers
    return max(flops / (8 * H100_BF16), byt / (8 * H100_BW))


def _speedup(alpha, g, b, ctx, T, D):
    return expected_tokens(alpha, g) * _step(T, b, ctx) / (_step(T, b, ctx, g + 1) + g * _step(D, b, ctx))


def test_05_round_cost_matches_closed_form(s05):
    for b in (1, 64, 512):
        for g in (1, 4, 8):
            r = s05.round_cost(b, g, 512)
            assert r["plain"] == pytest.approx(_step(s05.TARGET, b, 512), rel=1e-12)
            assert r["verify"] == pytest.approx(_step(s05.TARGET, b, 512, g + 1), rel=1e-12)
            assert r["draft"] == pytest.approx(_step(s05.DRAFT, b, 512), rel=1e-12)
    # B = 1：70B 读 BF16 权重 ≈ 141 GB / 26.8 TB/s ≈ 5.2 ms
    assert s05.round_cost(1, 1, 512)["plain"] == pytest.approx(5.19e-3, rel=0.01)


def test_05_verify_cost(s05, capsys):
    r = s05.demo1_verify_cost()
    capsys.readouterr()
    assert r["ratio"][(1, 8)] == pytest.approx(1.0, abs=1e-9)           # 批 1：验证 9 个位置免费
    assert r["ratio"][(2048, 8)] == pytest.approx(9.0, rel=1e-9)         # 都受算力限制：正好 γ + 1 倍
    assert r["b_star"] == pytest.approx(452, abs=1)
    cross = r["cross"]
    assert [cross[g] for g in (1, 2, 4, 8)] == sorted([cross[g] for g in (1, 2, 4, 8)], reverse=True)
    for g, b in cross.items():                                           # 交点：前一个整数还受带宽限制
        assert _step(s05.TARGET, b, 512, g + 1) == pytest.approx(b * (g + 1) * s05.TARGET.flops_per_token(512)
                                                                 / (8 * H100_BF16), rel=1e-12)
        assert _step(s05.TARGET, b - 1, 512, g + 1) > (b - 1) * (g + 1) * s05.TARGET.flops_per_token(512) / (8 * H100_BF16)
        # 闭式：B·n·f/P = (W + B·k)/BW  =>  B = (W/BW) / (n·f/P − k/BW)，取整向上；比 B*/(γ+1) 还早（KV 只读一遍）
        T = s05.TARGET
        wt, kt = 2 * T.active_params() / (8 * H100_BW), 327680 * 512 / (8 * H100_BW)
        assert b == math.ceil(wt / ((g + 1) * T.flops_per_token(512) / (8 * H100_BF16) - kt))
        assert b < r["b_star"] / (g + 1)
    assert r["free_b"] == 16
    # issue 8 第 15 条：B = 1 的 0.0% 是 roofline 的 max() 造成的；运算和读字节相加（上界）时多出的比例，独立的闭式：
    # 9 个位置 vs 1 个位置的 FLOPs / 算力，加上同样的读字节时间
    T = s05.TARGET
    f1 = 2 * T.matmul_params() + 4 * T.n_heads * T.head_dim * T.n_layers * 512
    t_mem = (2 * T.active_params() + 512 * 2 * 2 * T.n_kv_heads * T.head_dim * T.n_layers) / (8 * H100_BW)
    t_c1 = f1 / (8 * H100_BF16)                 # 含注意力核心（观察 1："γ + 1 行查询的注意力 FLOPs 已经记在这笔运算里"）
    assert r["t_mem_b1"] == pytest.approx(t_mem, rel=1e-12) and r["t_comp_b1"] == pytest.approx(9 * t_c1, rel=1e-12)
    assert r["extra_sum_b1"] == pytest.approx((9 * t_c1 + t_mem) / (t_c1 + t_mem) - 1, rel=1e-12)
    assert 0.02 < r["extra_sum_b1"] < 0.04


def test_05_speedup_and_break_even(s05, capsys):
    r = s05.demo2_speedup()
    capsys.readouterr()
    T, D = s05.TARGET, s05.DRAFT
    for (b, g), s in r["speedup"].items():
        assert s == pytest.approx(_speedup(0.8, g, b, 512, T, D), rel=1e-12)
    # B = 1：验证免费，加速比 = 定理 3.8
    from spec_math_lab import walltime_speedup
    assert r["speedup"][(1, 4)] == pytest.approx(walltime_speedup(0.8, 4, r["c"][1]), rel=1e-9)
    assert r["c"][1] == pytest.approx(r["w_ratio"], rel=0.02)
    assert r["kv_ratio"] == pytest.approx(32 / 80)
    assert r["c_peak"] == 512 and r["c"][2048] < r["c"][512]
    assert r["draft_bound"] == "memory"
    be = r["break_even"]
    assert be[8] < be[4] < be[2] < be[1] < r["bmax"]
    for g, b in be.items():
        assert _speedup(0.8, g, b, 512, T, D) < 1 <= _speedup(0.8, g, b - 1, 512, T, D)
    # 显存：640 GB − 两者的 BF16 权重（含输入词嵌入）/ 两者每个序列的 KV
    w = 2 * (70_553_706_496 + 8_030_261_248)
    assert r["bmax"] == int((640e9 - w) // ((327680 + 131072) * 512))


def test_05_speedup_chart(s05, capsys):
    """图（issue 9 第 4 项）：每个 γ 的加速比曲线 = 独立写的 roofline 加速比；"-" 线是 1；观察 4 的平坦段。"""
    r = s05.demo2_speedup()
    capsys.readouterr()
    T, D = s05.TARGET, s05.DRAFT
    grid = r["grid"]
    assert grid[0] == 1 and grid[-1] <= r["bmax"] and all(b in grid for b in s05.BATCHES)
    xs, ys, mark = r["curves"]["加速比 = 1（不赚不赔）"]
    assert mark == "-" and list(ys) == [1.0] * len(grid)
    assert set(r["curves"]) == {"加速比 = 1（不赚不赔）"} | {f"γ = {g}" for g in s05.CHART_GAMMAS}
    for g in s05.CHART_GAMMAS:
        xs, ys, mark = r["curves"][f"γ = {g}"]
        assert mark == s05.CHART_MARKS[s05.CHART_GAMMAS.index(g)] and list(xs) == grid
        for b, y in zip(xs, ys):
            assert y == pytest.approx(_speedup(0.8, g, b, 512, T, D), rel=1e-12)
    # B* = 452.2：表里第一个受算力限制的批是 512；之后每个 γ 的加速比变化 < 0.03（前面从 2 多掉到 1 以下）
    assert r["big_b"] == 512
    for g in s05.GAMMAS:
        vals = [_speedup(0.8, g, b, 512, T, D) for b in (512, 1024, 2048)]
        assert max(vals) - min(vals) < 0.03


def test_05_chart_curves_stay_visible(s05, capsys):
    """
    回归（issue 26 第 21 项）：四条曲线都画时，γ = 4 和 γ = 8 在小批时落在同一行，后画的 8 盖住 4（"88 8 4 4444"），
    γ = 4 的点只露出 80%。现在每条画出的 γ 曲线至少露出它的格子的 90%（只在和别的线相交处被盖住）；
    没画的 γ（4）在 B = 1 时和 γ = 8 差不到图上的一行。格子在这里独立地算（对数 x 轴 72 列、y 轴 18 行）。
    """
    r = s05.demo2_speedup()
    out = capsys.readouterr().out.splitlines()
    top = next(i for i, l in enumerate(out) if l.startswith("加速比（× 普通 decode）"))
    axis = next(i for i in range(top + 1, len(out)) if out[i].lstrip().startswith("++"))
    rows = [(l.split("|", 1)[-1] if "|" in l else l.split("+", 1)[-1]).ljust(72) for l in out[top + 1:axis]]
    assert len(rows) == 18
    ys_all = [y for _, ys, _ in r["curves"].values() for y in ys]
    lo, hi = min(ys_all), max(ys_all)
    xmax = max(x for xs, _, _ in r["curves"].values() for x in xs)
    for g in s05.CHART_GAMMAS:
        xs, ys, mark = r["curves"][f"γ = {g}"]
        cells = {(math.floor((y - lo) / (hi - lo) * 17 + 0.5), math.floor(math.log10(x) / math.log10(xmax) * 71 + 0.5))
                 for x, y in zip(xs, ys)}
        shown = sum(rows[17 - i][j] == mark for i, j in cells)
        assert shown >= 0.9 * len(cells), (g, shown, len(cells))
    T, D = s05.TARGET, s05.DRAFT
    for g in set(s05.GAMMAS) - set(s05.CHART_GAMMAS):
        assert abs(r["speedup"][(1, g)] - r["speedup"][(1, s05.GAMMAS[-1])]) < (hi - lo) / 17
        a, b = _speedup(0.8, g, 1, 512, T, D), _speedup(0.8, s05.GAMMAS[-1], 1, 512, T, D)
        assert f"（B = 1：{a:.2f}× 对 {b:.2f}×）" in "".join(out)              # 图上的注引的两个数


S05 = "lecture06/05_spec_decode_batching.py"


def test_05_best_gamma(s05):
    r = script_results(S05)["d3"]       # 演示 3 返回的数：脚本自己那次运行存下的（console.save_results）
    T, D = s05.TARGET, s05.DRAFT
    for (a, b), (g, s) in r["best"].items():
        sps = [_speedup(a, k, b, 512, T, D) for k in range(1, 17)]
        assert s == pytest.approx(max(sps), rel=1e-12) and g == 1 + int(np.argmax(sps))
    gs = [r["best"][(0.8, b)][0] for b in s05.BATCHES]
    assert gs == sorted(gs, reverse=True)                                # 批越大，最优 γ 越小
    assert r["best"][(0.8, 1)][0] == 6 and r["best"][(0.8, 256)][0] == 1
    be = r["break_even"]
    assert be[0.6] < be[0.8] < r["b_star"]
    # "从 B = … 起哪个 γ 都更慢"：之后的批也都 < 1
    for b in range(be[0.8], 2056, 37):
        assert max(_speedup(0.8, k, b, 512, T, D) for k in range(1, 17)) < 1


@pytest.fixture(scope="module")
def demo4(s05):
    """
    演示 4 返回的数和它打印的文字：取自脚本自己的运行（test_scripts 跑的那一次，console.save_results 存下的数、
    它印的演示 4），不在进程里再跑一遍（它要把每个上下文、批大小、γ 都算一遍）。
    """
    return script_results(S05)["d4"], script_demo_text(S05, 4)


def test_05_long_context_keeps_paying(s05, demo4):
    r = demo4[0]
    short = [c for c in s05.CONTEXTS if r[(c, 0.8)]["break_even"] is not None]
    long_ = [c for c in s05.CONTEXTS if r[(c, 0.8)]["break_even"] is None]
    assert short == [128, 512, 1024] and long_ == [2048, 4096, 8192]
    for c in short:
        assert r[(c, 0.8)]["break_even"] < r[c]["b_star"] < r[c]["bmax"]
        assert r[(c, 0.8)]["at_bmax"][1] < 1
    for c in long_:
        assert math.isinf(r[c]["b_star"]) and r[(c, 0.8)]["at_bmax"][1] > 1 and r[(c, 0.6)]["at_bmax"][1] > 1
    assert r[(2048, 0.8)]["at_bmax"][1] == pytest.approx(1.33, abs=0.005)
    # 显存上限（llm_math.max_batch(..., others=(草稿,))）：640 GB − 两者的 BF16 权重，除以两者每个序列的 KV
    w = 2 * (70_553_706_496 + 8_030_261_248)
    for c in s05.CONTEXTS:
        assert r[c]["bmax"] == int((640e9 - w) // ((327680 + 131072) * c))


def test_05_each_side_at_its_own_largest_batch(s05, demo4):
    """issue 19 第 14 条：普通 decode 不放草稿，上下文 2048 时装 743 个序列（投机解码 513）；各用自己的最大批时，
    长上下文的整批吞吐只多 1.08–1.38 倍（不是同一批时的 1.18–1.52 倍），每个用户的延迟改善 1.56–2.00 倍。"""
    r, out = demo4[0], unwrap(demo4[1])
    T, D = s05.TARGET, s05.DRAFT
    w_t, w_both = 2 * 70_553_706_496, 2 * (70_553_706_496 + 8_030_261_248)
    thr, lat = {}, {}
    for c in s05.CONTEXTS:
        bp, bs = int((640e9 - w_t) // (327680 * c)), int((640e9 - w_both) // ((327680 + 131072) * c))
        assert (r[c]["bmax_plain"], r[c]["bmax"]) == (bp, bs)
        for a in (0.8, 0.6):
            s = max(_speedup(a, g, bs, c, T, D) for g in range(1, 17))
            t_plain, t_spec = _step(T, bp, c), _step(T, bs, c) / s
            thr[(c, a)], lat[(c, a)] = (bs / t_spec) / (bp / t_plain), t_plain / t_spec
            own = r[(c, a)]["own_bmax"]
            assert own["throughput"] == pytest.approx(thr[(c, a)], rel=1e-12)
            assert own["latency"] == pytest.approx(lat[(c, a)], rel=1e-12)
    assert (r[2048]["bmax_plain"], r[2048]["bmax"]) == (743, 513)
    long_ = [(c, a) for c in (2048, 4096, 8192) for a in (0.8, 0.6)]
    assert (round(min(thr[k] for k in long_), 2), round(max(thr[k] for k in long_), 2)) == (1.08, 1.38)
    assert (round(min(lat[k] for k in long_), 2), round(max(lat[k] for k in long_), 2)) == (1.56, 2.0)
    short = [(c, a) for c in (128, 512, 1024) for a in (0.8, 0.6)]
    assert all(thr[k] < 1 for k in short)
    assert (round((1 - max(thr[k] for k in short)) * 100), round((1 - min(thr[k] for k in short)) * 100)) == (15, 31)
    assert "整批吞吐只多 1.08–1.38 倍，每个用户的延迟改善 1.56–2.00 倍" in out
    assert "装得下 743 个序列（投机解码 513 个，多 45%）" in out


def test_03_greedy_equality_is_exact_here_only_up_to_numerics_on_gpus():
    """issue 19（读者说缺的）：T = 0 的"和贪心逐 token 相同"在 float64 里是精确的；GPU 上 bf16、成批时只在数值精度以内
    （vLLM 文档）。引用的 < 1e-13 是 01 演示 1 打印的上界。"""
    text = script_stdout("lecture06/03_spec_decode_exact.py")
    assert "这里的\"和贪心不同的 0 个\"是精确的相等" in text
    assert "01 脚本演示 1 量过：< 1e-13" in text and "在硬件数值精度以内" in text
    assert load_script("lecture06/01_kv_cache_rollback.py").DELTA_BOUND == 1e-13
    s01 = script_stdout("lecture06/01_kv_cache_rollback.py")
    assert "最大差 < 1e-13" in s01
    assert "float64 里这是精确的相等；GPU 上用 bf16、成批地算时只在数值精度以内成立" in s01


def test_05_chart_marks_are_letters_not_tick_digits(s05, capsys):
    """issue 35 第 20 条：曲线记号曾是 "1""2""8"，和纵轴的刻度（"1 +-"、"2 +2"）、"-" 线混在一起。现在是字母，
    彼此不同，图例说出每个字母是哪个 γ。"""
    r = s05.demo2_speedup()
    out = capsys.readouterr().out
    marks = [r["curves"][f"γ = {g}"][2] for g in s05.CHART_GAMMAS]
    assert len(set(marks)) == len(marks)
    for m in marks:
        assert len(m) == 1 and m.isalpha() and m.isascii(), m
    legend = next(l for l in out.splitlines() if l.startswith("图例："))
    for g, m in zip(s05.CHART_GAMMAS, marks):
        assert f"{m} γ = {g}" in legend
    # 纵轴刻度那几行（"  2 +..."）的刻度之后不再出现数字
    for line in out.splitlines():
        if " +" in line and line.split("+", 1)[0].strip().replace(".", "").isdigit():
            assert not any(ch.isdigit() for ch in line.split("+", 1)[1]), line
