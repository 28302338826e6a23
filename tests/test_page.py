"""
页面规则（每个编号脚本，新脚本自动覆盖）：每行不超过 100 个显示列、行尾没有空格；每张表里数字列的格子右端
对齐在同一列、文字列的格子左端对齐在同一列。

两个原始脚本（seeds）自己用 print() 打印的行不受宽度限制（它们的文字不能改）：对它们只检查 console 打印的块。
显示宽度在这里独立地算一遍（不用 console.display_width）：East Asian Width 为 W/F 的字符两列，其余一列。
"""
import re
import unicodedata

import pytest

from conftest import numbered_scripts, script_console_blocks, script_raw_stdout

SEEDS = {"lecture05/05_heterogeneous_spec_decode.py", "lecture06/04_spec_decode_speedup.py"}
SCRIPTS = numbered_scripts()
# 测试自己的"数"的写法：可选比较符 / 符号，数字（可带小数、千分位、指数、范围），可选一个短单位
_NUM = r"[-+]?(\d[\d,]*\.?\d*|\.\d+)([eE][-+]?\d+)?"
NUMBER = re.compile(r"^([<>≤≥≈~] ?)?" + _NUM + r"( ?[–-] ?" + _NUM + r"| ?± ?" + _NUM + r")?( ?([A-Za-zµ%×/²³·]{1,8}|[\u4e00-\u9fff]{1,2}))?$")
PLACEHOLDER = re.compile(r"^(|—|–|-|--|n/a|[\u4e00-\u9fff（）]{1,5})$")


def width(s):
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in s)


def test_the_page_check_knows_the_seeds():
    assert SEEDS <= set(SCRIPTS)


@pytest.mark.parametrize("rel", SCRIPTS)
def test_every_line_fits_in_100_columns_without_trailing_spaces(rel):
    out = script_raw_stdout(rel).splitlines()
    assert not [l for l in out if l != l.rstrip()], "行尾有空格"
    lines = out
    if rel in SEEDS:                                     # seed 自己 print() 的行豁免：只查 console 打印的
        lines = [l for b in script_console_blocks(rel) for l in b["lines"]]
        assert lines
    wide = [(width(l), l) for l in lines if width(l) > 100]
    assert not wide, f"{len(wide)} 行超过 100 列，最宽 {max(wide)[0]}：{max(wide)[1][:60]}"


def _cell_spans(line, cells):
    """在一行里按顺序找到每个格子：返回 [(起始显示列, 结束显示列) 或 None（空格子）]。"""
    spans, pos = [], 0
    for c in cells:
        c = c.strip()
        if not c:
            spans.append(None)
            continue
        i = line.find(c, pos)
        assert i >= 0, (c, line)
        start = width(line[:i])
        spans.append((start, start + width(c)))
        pos = i + len(c)
    return spans


@pytest.mark.parametrize("rel", SCRIPTS)
def test_table_columns_line_up(rel):
    tables = [b for b in script_console_blocks(rel) if b["kind"] == "table"]
    for t in tables:
        rows, lines = t["rows"], t["lines"]
        if not rows:
            continue
        body = lines[-len(rows):]
        assert set(lines[-len(rows) - 1]) <= {"-", " "}, "表头下面应该是一条虚线"
        spans = [_cell_spans(line, row) for line, row in zip(body, rows)]
        for j in range(len(t["headers"])):
            col = [r[j].strip() for r in rows]
            n_num = sum(1 for c in col if NUMBER.match(c))
            numeric = (2 * n_num >= max(1, sum(1 for c in col if c))
                       and all(NUMBER.match(c) or PLACEHOLDER.match(c) for c in col))
            edges = {s[j][1] if numeric else s[j][0] for s in spans if s[j] is not None}
            assert len(edges) <= 1, f"{rel}：表 {t['headers']} 的第 {j + 1} 列没对齐（{'右' if numeric else '左'}端）"


# 观察不在括号里折行（issue 26 第 20 项）。这里独立地数括号：()、[]、{}、（）不分种类地配对。console 的规则：
# 不超过 32 列的括号整个不拆；更长的括号（一句插进来的话）只在挨着汉字的地方断，两个英文词 / 数之间不断。
_OPEN, _CLOSE = "([{（", ")]}）"
SHORT_GROUP = 32


def _wide(c):
    return unicodedata.east_asian_width(c) in "WF"


def breaks_inside_brackets(item_lines):
    """一条观察折成的几行（已去掉编号和缩进）-> 违反上面规则的断点 [(括号, 断点附近的字)]。"""
    text, breaks = "", []
    for i, line in enumerate(item_lines):
        if i:
            breaks.append(len(text))
            text += " "
        text += line
    stack, spans = [], []
    for i, ch in enumerate(text):
        if ch in _OPEN:
            stack.append(i)
        elif ch in _CLOSE and stack:
            spans.append((stack.pop(), i))
    spans += [(s, len(text) - 1) for s in stack]
    bad = []
    for b in breaks:
        inner = [s for s in spans if s[0] < b < s[1]]
        if inner:
            lo, hi = max(inner)
            group = text[lo:hi + 1]
            if width(group) <= SHORT_GROUP or not (_wide(text[b - 1]) or _wide(text[b + 1])):
                bad.append((group, text[max(0, b - 12):b + 12]))
    return bad


def test_the_bracket_check_catches_the_issue_examples():
    assert [g for g, _ in breaks_inside_brackets(["接受率是 Σ min(p,", "q) 的平均"])] == ["(p, q)"]
    assert breaks_inside_brackets(["在 γ ∈ {1, 2, 4,", "8} 里"])
    assert breaks_inside_brackets(["形状：链 (1, …,", "1)；"])
    assert not breaks_inside_brackets(["形状：", "链 (1, …, 1)；"])


@pytest.mark.parametrize("rel", SCRIPTS)
def test_observations_do_not_wrap_inside_brackets(rel):
    bad = []
    for b in script_console_blocks(rel):
        if b["kind"] != "observations":
            continue
        items, cur = [], None
        for line in b["lines"]:
            m = re.match(r"^  (\d+)\. ", line)
            if m:
                cur = [line[m.end():]]
                items.append(cur)
            else:
                cur.append(line.lstrip())
        for item in items:
            bad += breaks_inside_brackets(item)
    assert not bad, bad[:5]
