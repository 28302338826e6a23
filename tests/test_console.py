"""console：按显示宽度对齐、数字列右对齐、带单位的短数字。"""
import pytest

from console import display_width, fmt_bytes, fmt_num, fmt_sig, fmt_time, format_table


def test_display_width_counts_cjk_and_fullwidth_as_two():
    assert display_width("草稿") == 4
    assert display_width("（）") == 4          # 全角括号
    assert display_width("αγĉ×µΣ") == 6      # 希腊字母和符号各占一列
    assert display_width("abc") == 3


def test_mixed_cjk_ascii_table_aligns_by_display_width():
    lines = format_table(["草稿", "α", "γ"], [["INT4 量化的自己", 0.905, 8], ["bigram", "0.59", 12]])
    widths = {display_width(line) for line in lines}
    assert len(widths) == 1, lines             # 每一行（去掉行尾空白之前）等宽
    # 第二列起始位置在每一行相同（按显示宽度算）
    head, rule, r1, r2 = lines
    col2 = display_width(rule.split("  ")[0]) + 2
    for line in (r1, r2):
        prefix = ""
        for ch in line:
            if display_width(prefix) >= col2:
                break
            prefix += ch
        assert display_width(prefix) == col2


def test_numeric_columns_are_right_aligned_text_left():
    lines = format_table(["名字", "数"], [["a", "1.53×"], ["长一点的名字", "10.20×"]])
    assert lines[2].endswith(" 1.53×") and lines[3].endswith("10.20×")
    assert lines[2].startswith("a ")


def test_float_cells_use_4g():
    assert format_table(["x"], [[0.123456]])[2].strip() == "0.1235"


def test_row_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="格子"):
        format_table(["a", "b"], [[1]])


@pytest.mark.parametrize("x,text", [(0.000897, "0.897 ms"), (0.0025107, "2.51 ms"), (56.7e-6, "56.7 µs"),
                                    (0.1439, "144 ms"), (0.0415, "41.5 ms"), (1.2, "1.20 s"),
                                    (0.9996e-3, "1.00 ms"), (0, "0 s"), (3e-9, "3.00 ns")])
def test_fmt_time(x, text):
    assert fmt_time(x) == text


@pytest.mark.parametrize("x,text", [(12.3e9, "12.3 GB"), (999.7e6, "1.00 GB"), (512, "512 B"),
                                    (0, "0 B"), (80e9, "80.0 GB")])
def test_fmt_bytes_is_decimal_si(x, text):
    assert fmt_bytes(x) == text


@pytest.mark.parametrize("x,text", [(4.56e9, "4.56 G"), (1e3, "1.00 k"), (7, "7.00"), (70553706496, "70.6 G")])
def test_fmt_num(x, text):
    assert fmt_num(x) == text


def test_fmt_sig_keeps_trailing_zeros_and_carries():
    assert fmt_sig(41) == "41.0"
    assert fmt_sig(999.6) == "1000"
    assert fmt_sig(0.5) == "0.500"


def test_fmt_bound_prints_the_bound_not_the_residual():
    from console import fmt_bound
    assert fmt_bound(3.8e-15, 1e-13) == "< 1e-13"
    assert fmt_bound(2e-12, 1e-13) == "2e-12"
    with pytest.raises(ValueError):
        fmt_bound(1.0, 0)
