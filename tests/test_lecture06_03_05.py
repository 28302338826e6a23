"""
第 6 讲 03（投机解码不改变分布）和 05（批大了投机解码还划不划算）：每个演示返回它的观察引用的数；
这里用独立的算法（新开一次前向、自己写的 Pearson χ²、闭式）核对，并核对观察里说的大小关系。
"""
import ast
import inspect
import math
import os

import numpy as np
import pytest

from conftest import ROOT, load_script

from decode_lab import adjust, expected_tokens  # noqa: E402
from transformer_lab import softmax  # noqa: E402


# ---------------------------------------------------------------------------
# 03_spec_decode_exact.py
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def s03():
    return load_script("lecture06/03_spec_decode_exact.py")


@pytest.fixture(scope="module")
def models03(s03):
    return s03.build_models()


@pytest.fixture(scope="module")
def r1(s03, models03):
    import contextlib
    import io
    with contextlib.redirect_stdout(io.StringIO()):
        return s03.demo1_distribution(*models03)


def _body_without_docstring(src):
    fn = ast.parse(src).body[0]
    body = fn.body[1:] if isinstance(fn.body[0], ast.Expr) else fn.body
    return [ast.dump(node) for node in body]


def test_03_build_models_is_the_same_as_seed04(s03):
    """CURRICULUM §1：03 和种子 04 用同一个 build_models（04 说它"重新写一遍"了 03 的模型构造）。"""
    s04 = load_script("lecture06/04_spec_decode_speedup.py")
    assert _body_without_docstring(inspect.getsource(s03.build_models)) == \
        _body_without_docstring(inspect.getsource(s04.build_models))


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


def test_03_no_test_rejects_the_correct_samplers(r1):
    """正确的算法：27 个 p 值都在 Bonferroni 门槛之上（固定种子，这是一个确定的事实；观察 2 说的就是它）。"""
    pv = np.array([p for ps in r1["p_values"].values() for p in ps])
    assert r1["n_p"] == len(pv) == 27
    assert r1["min_p"] == pytest.approx(pv.min())
    assert r1["min_p"] > r1["bonferroni"] == pytest.approx(0.05 / 27)
    assert r1["n_small"] == int((pv < 0.05).sum())
    assert all(0.0 <= p <= 1.0 for p in pv)
    assert r1["max_dev"] < 0.05


def test_03_power_against_known_bugs(s03, models03, r1, capsys):
    out = s03.demo2_power(*models03, r1["min_p"], r1["n_p"])
    capsys.readouterr()
    names = list(out)
    for n in names:
        v = out[n]
        assert v["exact_dev"] < 1e-12                               # 精确枚举：输出就是 p
        assert v["no_check"][0] == pytest.approx(1 - v["beta"], abs=1e-12)   # TV(p, q) = 1 − Σmin(p, q)
        assert v["no_check"][2] < 1e-6                              # 错误 B 总被抓住
        assert v["from_p"][0] < v["no_check"][0]                    # 错误 A 更隐蔽
    # 草稿越差，错误 A 离 p 越远；最差的两个草稿上检验抓住了它
    tvs = [out[n]["from_p"][0] for n in names]
    assert tvs == sorted(tvs)
    assert out["只用前 1 层"]["from_p"][2] < 1e-3 and out["二元语法表"]["from_p"][2] < 1e-3
    # 正确算法的最小 p 值比所有被抓住的错误的 p 值都大得多
    assert r1["min_p"] > 100 * max(out[n]["from_p"][2] for n in ("只用前 1 层", "二元语法表"))


def test_03_greedy_is_token_for_token_identical(s03, models03, capsys):
    r = s03.demo3_greedy(*models03)
    capsys.readouterr()
    assert r["n_diff"] == 0
    assert r["n_cfg"] == 4 * len(s03.GREEDY_GAMMAS)
    assert r["n_tokens"] == r["n_cfg"] * s03.GREEDY_PROMPTS * s03.GREEDY_NEW
    for (name, g), v in r["per_cfg"].items():
        assert 1.0 <= v["tokens_per_call"] <= g + 1
