"""
lecture06/12_production_trees.py：演示 1 在进程里跑（玩具，快），返回的数对照手算；演示 2–4 用真实模型，读 test_scripts
已经跑过的那一次的输出（console 记下的表格），核对表里的数之间必须成立的关系，和演示 3 的手算例子。
"""
import numpy as np
import pytest

from conftest import load_script, script_console_blocks, script_stdout

REL = "lecture06/12_production_trees.py"


@pytest.fixture(scope="module")
def s():
    return load_script(REL)


def test_demo1_is_exact_and_its_acceptance_equals_the_hand_calculation(s, capsys):
    res = s.demo1_exact_rules()
    capsys.readouterr()
    assert max(max(r["err_rsd"], r["err_pm"]) for r in res.values()) < s.ENUM_BOUND
    a = res["一般情形"]["alpha"]                 # p = (0.5, 0.2, 0.2, 0.1)，q 均匀
    assert a[1] == pytest.approx((0.75, 0.75, 0.5), abs=1e-15)
    assert a[2] == pytest.approx((0.8125, 5 / 6, 0.7), abs=1e-15)
    assert a[3][2] == pytest.approx(0.9, abs=1e-15)
    cap = res["p、q 都有 0"]
    assert (cap["support"], cap["V"]) == (4, 5)
    oh = res["q one-hot（T = 0）"]["alpha"]
    assert oh[1][0] == oh[3][0] == pytest.approx(0.2, abs=1e-15)   # one-hot 的 q：独立抽 k 个都一样


def _tables():
    return [b for b in script_console_blocks(REL) if b["kind"] == "table"]


def _table_with(header_part):
    for b in _tables():
        if any(header_part in h for h in b["headers"]):
            return b
    raise AssertionError(header_part)


def test_demo3_hand_cases_print_the_hand_calculation():
    t = _table_with("规则")
    rows = {(r[0], r[4]): r for r in t["rows"]}
    assert rows[("两个候选都过线", "Medusa")][5:7] == ["0.00 1.00 0.00", "0.70"]
    assert rows[("候选是 argmax", "argmax")][5:7] == ["1.00 0.00 0.00", "0.50"]
    assert rows[("候选不过线", "Medusa")][5:7] == ["1.00 0.00 0.00", "0.10"]
    assert rows[("候选不过线", "argmax")][6] == "0.00"
    for r in t["rows"]:
        if r[6] != "0.00":
            assert r[7].startswith("< 1e-")             # 输出不是 p 的格子：χ² 对 p 拒绝


def test_demo2_rows_keep_their_order():
    """每种规则的 α_k 随 k 不减；无放回 ≥ 独立（抽样值 + 半宽）；k = 1 时独立 == 无放回（在半宽以内）。"""
    t = _table_with("玩具\n无放回")
    rows = t["rows"]
    for col in (1, 3, 4, 6):
        v = [float(r[col]) for r in rows]
        assert v == sorted(v), col
    for ind, rsd in ((1, 2), (4, 5)):
        for i, r in enumerate(rows):
            m, h = (float(x) for x in r[rsd].split(" ± "))
            assert m + h >= float(r[ind]) - 1e-3
            if i == 0:
                assert abs(m - float(r[ind])) <= h + 1e-3


def test_demo4_tree_figures_are_monotone_and_bounded():
    """预算大的树包含预算小的（同一个排名的前 b 个）：动态树的期望随预算不减；每次最多 depth + 2 个 token。"""
    import tree_lab
    t = _table_with("T = 0\n动态")
    rows = t["rows"]
    for col in range(2, 9):
        v = [float(r[col]) for r in rows]
        assert v == sorted(v), col
    for r in rows:
        assert int(r[1]) == int(r[0]) + 1
        assert float(r[5]) <= tree_lab.EAGLE2_DEPTH + 2 and float(r[8]) <= tree_lab.EAGLE2_DEPTH + 2


def test_observations_cite_the_table():
    text = script_stdout(REL)
    t = _table_with("T = 0\n动态")
    big = t["rows"][-1]
    assert f"预算 {big[0]} 时每次 {big[5]} 个 token（链 {big[2]}）" in text
    assert "连续猜对一直到文本末尾的位置：0 个" in text       # 否则链的数被文本的长度截短了
    assert "None" not in text and "[" not in text.split("演示 2")[1].split("演示 3")[0].split("观察")[1]
