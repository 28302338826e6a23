"""
第 6 讲 06（论文里的实测 vs 定理 3.8）：每个演示返回它的观察引用的数；这里用闭式、手写的搜索、多项式求根、
种子 04 自己的 measured_alpha 重新算，再核对观察里说的分类和大小关系（按论文的数手工列出）。
"""
import contextlib
import io

import numpy as np
import pytest

from conftest import load_script
from seed04_models import built_by
from decode_lab import NGramLM


@pytest.fixture(scope="module")
def s06():
    return load_script("lecture06/06_papers_vs_formulas.py")


def _quiet(fn, *a):
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*a)


@pytest.fixture(scope="module")
def r1(s06):
    return _quiet(s06.demo1_table4)


def _thm38(a, g, c):
    return sum(a ** i for i in range(g + 1)) / (g * c + 1)


def test_06_table4_theorem_column_by_closed_form(s06, r1):
    for row, r in zip(s06.LEVIATHAN_TABLE4, r1["rows"]):
        _, _, _, g, a, c, _, emp = row
        assert r["thm"] == pytest.approx(_thm38(a, g, c), rel=1e-12)
        assert r["ratio"] == pytest.approx(emp / _thm38(a, g, c), rel=1e-12)


def test_06_table4_classification_as_the_issue_states(r1):
    """实测超过公式：每行 CNNDM 和 EnDe 的 T5-small；不到：EnDe 的 T5-base T=0 和 T5-large；持平（±5%）：EnDe T5-base T=1。"""
    key = lambda r: (r["task"], r["draft"], r["T"])  # noqa: E731
    above = {key(r) for r in r1["above"]}
    assert above == {("CNNDM", d, T) for d in ("T5-small", "T5-base", "T5-large") for T in (0, 1)} | \
        {("EnDe", "T5-small", 0), ("EnDe", "T5-small", 1)}
    assert {key(r) for r in r1["below"]} == {("EnDe", "T5-base", 0), ("EnDe", "T5-large", 0), ("EnDe", "T5-large", 1)}
    assert {key(r) for r in r1["even"]} == {("EnDe", "T5-base", 1)}


def test_06_printed_exp_off_by_rounding_in_three_rows(r1):
    """Leviathan 等（arXiv 2211.17192）表 4：三行 Exp 比定理 3.8 高 0.05–0.07（2.4 vs 2.35、2.0 vs 1.93、1.6 vs 1.54）。"""
    off = sorted((r["exp"], round(r["thm"], 2)) for r in r1["off"])
    assert off == [(1.6, 1.54), (2.0, 1.93), (2.4, 2.35)]


def test_06_best_gamma_by_brute_force(s06, r1):
    same = more = 0
    gains = []
    for row, r in zip(s06.LEVIATHAN_TABLE4, r1["rows"]):
        _, _, _, g, a, c, _, _ = row
        sp = [_thm38(a, k, c) for k in range(1, 60)]
        k = int(np.argmax(sp)) + 1
        assert r["best"][0] == k and r["best"][1] == pytest.approx(sp[k - 1], rel=1e-12)
        same += k == g
        more += k > g
        gains.append(sp[k - 1] / _thm38(a, g, c) - 1)
    assert (r1["same_gamma"], r1["more_gamma"]) == (same, more) == (2, 8)
    assert r1["gain"] == pytest.approx(max(gains), rel=1e-12)
    assert r1["gain"] < 0.03                                    # "最多只多 2.6%"：很平


@pytest.fixture(scope="module")
def r2(s06):
    s04 = load_script("lecture06/04_spec_decode_speedup.py")
    target, drafts = built_by(s04.build_models)        # 04 自己的构造（整个会话只建一次：tests/seed04_models.py）
    return s04, target, drafts, _quiet(s06.demo2_table3, target, drafts)


def test_06_toy_alphas_by_seed04s_own_measurement(r2):
    s04, target, drafts, r = r2
    toks = s04.sample_tokens(target.params, s04.QCFG, n_seq=8, length=64, seed=0)
    lp = target.full_logits(toks)
    for name, dr in drafts.items():
        assert r["toy"][name][1] == pytest.approx(s04.measured_alpha(target, dr, toks, 1.0), abs=1e-12)
        lq = dr.table[toks] if isinstance(dr, NGramLM) else dr.full_logits(toks)
        assert r["toy"][name][0] == pytest.approx(float(np.mean(lq.argmax(-1) == lp.argmax(-1))), abs=1e-12)
    # 观察 1、3：三个 transformer 草稿 T = 0 更低；二元语法表 T = 0 不低于 T = 1
    assert r["toy_down"] == ["INT4 量化的自己", "只用前 3 层", "只用前 1 层"]
    assert r["toy"]["二元语法表"][0] >= r["toy"]["二元语法表"][1]
    # 观察 2：logit 差的中位数和最可能 token 的概率（另算：partition、logsumexp）
    flat = lp.reshape(-1, lp.shape[-1])
    top2 = np.partition(flat, -2, axis=-1)[:, -2:]
    assert r["med_gap"] == pytest.approx(float(np.median(top2[:, 1] - top2[:, 0])), rel=1e-12)
    m = flat.max(-1)
    p_top = 1.0 / np.exp(flat - m[:, None]).sum(-1)
    assert r["p_top"] == pytest.approx(float(p_top.mean()), rel=1e-12)
    assert r["med_gap"] < 1.0 and r["p_top"] < 0.3              # "很小"、"很平"


def test_06_table3_counts_by_hand(r2):
    r = r2[3]
    assert (r["real_up"], r["real_n"]) == (9, 10)              # 只有 GPT-like 6M（0.88 < 0.89）例外
    assert r["ende"] == pytest.approx((0.11, 0.13), abs=1e-9)


def test_06_chen_implied_alpha(s06):
    r = _quiet(s06.demo3_chen)
    c = 1.8 / 14.1
    assert r["c"] == pytest.approx(0.12766, abs=1e-5)
    for row, (_, ms, sp) in zip(r["rows"], s06.CHEN_TABLE1):
        assert _thm38(row["alpha"], 4, c) == pytest.approx(sp, abs=1e-9)
        assert _thm38(row["alpha_ms"], 4, c) == pytest.approx(14.1 / ms, abs=1e-9)
    first = r["rows"][0]
    assert first["speedup_ms"] == pytest.approx(1.875, abs=1e-3)
    assert (round(first["alpha"], 3), round(first["alpha_ms"], 3)) == (0.724, 0.711)
    assert [round(x["alpha"], 2) for x in r["rows"]] == [0.72, 0.75, 0.85]
    assert r["rest_ok"] and r["inside"]
    assert r["range"] == pytest.approx((1 / (4 * c + 1), 5 / (4 * c + 1)), rel=1e-12)
    t3 = [a for _, d, a0, a1 in s06.LEVIATHAN_TABLE3 if d != "二元语法" for a in (a0, a1)]
    assert (min(t3), max(t3), len(t3)) == (0.53, 0.89, 20)


def test_06_chen_alphas_rank_among_table3_by_hand(s06):
    """观察 2："高于其中 11 个、14 个、18 个"——表 3 神经网络草稿的 20 个 α 手抄一遍，逐个比较。"""
    r = _quiet(s06.demo3_chen)
    t3 = [0.88, 0.89, 0.75, 0.62, 0.80, 0.68, 0.82, 0.71, 0.65, 0.53, 0.73, 0.55, 0.74, 0.56,
          0.61, 0.57, 0.71, 0.71, 0.75, 0.74]
    assert sorted(r["t3"]) == sorted(t3)
    assert [sum(a < row["alpha"] for a in t3) for row in r["rows"]] == [11, 14, 18]


def test_06_demo1_obs2_gives_the_papers_own_two_causes():
    """issue 35 第 13 条：旧句子说"论文没有逐行解释这些差别"，可论文附录 A.3 给了两个原因：实现和基线的优化差别、
    i.i.d. 假设；实测高于公式的 8 行，第一个原因是最自然的读法。"""
    from conftest import script_stdout
    text = script_stdout("lecture06/06_papers_vs_formulas.py")
    assert "论文没有逐行解释这些差别" not in text
    assert "论文在附录 A.3 自己给了两个原因" in text
    assert "一是它的实现和比较的基线之间在优化上的差别，二是式 (1) 假设各位置的接受独立同分布（i.i.d.）" in text
    assert "实测高于公式的 8 行，最自然的读法是第一个原因" in text
