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
