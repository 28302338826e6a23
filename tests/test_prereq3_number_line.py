"""
第 3 讲预备 01 演示 2 的数轴：两条带子各写格式名，不画成一张有数字 y 轴的散点图。
"""
import contextlib
import io
import re

from conftest import load_script


def test_01_number_line_strips_are_labelled_by_format_not_a_numeric_axis():
    """
    回归：prereq3/01 演示 2 的数轴原来画在一张散点图上，y 轴刻度 0.5–2.5 只是行号（"2 = E2M1，1 = E4M3"）。
    现在每条带子行首写格式名；记号的列按 round(v / 6 · 71) 独立重算。
    """
    mod = load_script("prereq3/01_float_formats.py")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        mod.demo2_small_formats_enumerated()
    lines = buf.getvalue().splitlines()
    i = next(k for k, l in enumerate(lines) if l.startswith("数轴 [0, 6]"))
    e2, e4, axis, ticks = lines[i + 1:i + 5]
    assert e2.startswith("E2M1 ") and e4.startswith("E4M3 ")
    assert not any(re.match(r"^\s*[\d.]+ [+|]", l) for l in lines[i:i + 8])      # 没有数字的 y 刻度
    cols = [k - 5 for k, ch in enumerate(e2) if ch == "o"]
    assert cols == [round(v / 6 * 71) for v in (0, 0.5, 1, 1.5, 2, 3, 4, 6)]
    assert axis.startswith("     +") and ticks.split() == [str(t) for t in range(7)]
