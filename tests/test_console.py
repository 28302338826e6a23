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


# ---------------------------------------------------------------------------------------------------
# 页面：折行、表头断行、占位符、图

from console import format_bars, format_plot, wrap_text  # noqa: E402

PROTECTED = ["3.1 ms", "γ = 8", "bandwidth-bound", "128 个", "1 − α", "0.897 ms", "12.3 GB", "Leviathan",
             "9.00 PFLOP/s"]


def test_wrap_keeps_numbers_units_formulas_and_words_whole():
    text = "，".join(f"第{i}段话里有{PROTECTED[i % len(PROTECTED)]}这样的东西和一些汉字" for i in range(40))
    for offset in range(12):                          # 换不同的起点，让每个受保护的词都有机会落在行尾
        t = "汉" * offset + text
        lines = wrap_text(t, 100, "  1. ", "     ")
        assert all(display_width(l) <= 100 for l in lines)
        assert lines[0].startswith("  1. ") and all(l.startswith("     ") for l in lines[1:])
        body = [l[5:] for l in lines]
        assert "".join(body).replace(" ", "") == t.replace(" ", "")   # 只去掉了断行处的空格
        for a, b in zip(body, body[1:]):
            assert b[0] not in "，。、；：）", (a, b)                 # 标点不在行首
            for p in PROTECTED:                                     # 没有一个受保护的词跨两行
                for k in range(1, len(p)):
                    assert not (a.endswith(p[:k].rstrip()) and b.startswith(p[k:].lstrip()) and p[:k].strip()
                                and p[k:].strip()), (p, a[-10:], b[:10])


def test_wrap_breaks_at_spaces_in_latin_text_and_honours_newlines():
    lines = wrap_text("alpha beta gamma delta", 11)
    assert lines == ["alpha beta", "gamma delta"]
    assert wrap_text("一\n二", 100) == ["一", "二"]


def test_wide_table_headers_break_onto_two_lines_to_fit():
    heads = ["草稿长度 γ", "每个 token 的接受率 α（博客）", "被接受的 token（博客）", "公式 Σα^i", "模拟（2 万轮）",
             "每轮前进（+1 个修正 token）", "另一列很长的表头（单位）"]
    lines = format_table(heads, [[5, "92.6%", 4, "3.99", "4.00", "4.99", "1.0"]])
    assert max(display_width(l) for l in lines) <= 100
    assert [l[:4] for l in lines].index("----") >= 2  # 表头断成了两行以上
    explicit = format_table(["上\n下", "x"], [[1, 2]])
    assert explicit[0].rstrip().endswith("上") and explicit[1].startswith("下")


def test_a_placeholder_does_not_flip_a_numeric_column_and_minus_is_ascii():
    lines = format_table(["名字", "数"], [["a", "1.53×"], ["b", "—"], ["c", "不划算"], ["d", "−2.5"]])
    ends = {display_width(l) for l in lines[2:]}
    assert len(ends) == 1                             # 整列右对齐：每行在同一列结束
    assert lines[5].endswith(" -2.5")
    text = format_table(["名字", "说明"], [["a", "1.5"], ["b", "一句话说明"], ["c", "另一句"]])
    assert text[2] == "a     1.5" and text[3] == "b     一句话说明"   # 文字列左对齐（"名字"占 4 列 + 2 列间隔）


def test_bars_are_proportional_to_the_nearest_character():
    lines = format_bars(["a", "bb", "c"], [1, 2, 4], unit=" ms", width=40)
    assert [l.count("#") for l in lines] == [10, 20, 40]
    assert lines[0].endswith("# 1 ms") and lines[2].endswith("# 4 ms")
    assert [l.count("#") for l in format_bars(["x", "y"], [1, 3], width=10)] == [3, 10]   # 10/3 = 3.33 → 3
    assert [l.count("#") for l in format_bars(["x", "y"], [2, 3], width=10)] == [7, 10]   # 20/3 = 6.67 → 7
    assert [l.count("#") for l in format_bars(["x", "y"], [0, 0])] == [0, 0]


@pytest.mark.parametrize("bad,match", [(([], []), "非空"), ((["a"], [float("nan")]), "NaN"),
                                       ((["a"], [-1]), "负"), ((["a", "b"], [1]), "一样多")])
def test_bars_reject_bad_input(bad, match):
    with pytest.raises(ValueError, match=match):
        format_bars(*bad)


def _find(lines, mark):
    return [(i, j) for i, l in enumerate(lines) for j, ch in enumerate(l) if ch == mark and not l.startswith("图例")]


def test_plot_puts_a_known_point_in_the_right_cell_linear():
    lines = format_plot({"s": ([0, 10], [0, 100]), "p": ([5], [50], "X")}, "x", "y", width=11, height=11)
    (i, j), = _find(lines, "X")
    corner = [(i2, j2) for i2, j2 in _find(lines, "*")]
    top_left = min(corner)                            # (10, 100) 在右上角，(0, 0) 在左下角
    assert i - 1 == 5 and lines[i][j - 5 - 1] in "|+"  # 第 1 行是 y 轴名；x = 5 在第 6 格（0 起第 5 格）
    assert sorted(corner) == [(1, j + 5), (11, j - 5)] and top_left == (1, j + 5)


def test_plot_puts_a_known_point_in_the_right_cell_log():
    lines = format_plot({"s": ([1, 100], [1, 10000]), "p": ([10], [100], "X")}, "x", "y", logx=True, logy=True,
                        width=21, height=9)
    (i, j), = _find(lines, "X")
    stars = sorted(_find(lines, "*"))
    assert stars == [(1, j + 10), (9, j - 10)]        # 对数轴：10 在 1 和 100 正中，100 在 1 和 10⁴ 正中
    assert i == 5
    assert all(display_width(l) <= 100 for l in lines) and lines[-1].startswith("图例")


@pytest.mark.parametrize("series,kw,match", [
    ({}, {}, "至少"), ({"a": ([], [])}, {}, "非空"), ({"a": ([1, 2], [1])}, {}, "一样多"),
    ({"a": ([1, float("nan")], [1, 2])}, {}, "NaN"), ({"a": ([0, 1], [1, 2])}, {"logx": True}, "非正"),
    ({"a": ([1, 2], [-1, 2])}, {"logy": True}, "非正"), ({"a": ([1, 2], [1, 2], "█")}, {}, "一列")])
def test_plot_rejects_bad_input(series, kw, match):
    with pytest.raises(ValueError, match=match):
        format_plot(series, "x", "y", **kw)


def test_a_number_keeps_a_long_unit_on_its_line():
    """"9.00 PFLOP/s"（单位 7 个字符）不在数和单位之间断开：换不同的前缀长度，让断点落在各处。"""
    for n in range(12):
        lines = wrap_text("汉" * n + "约 9.00 PFLOP/s 的算力", 24)
        assert any("9.00 PFLOP/s" in line for line in lines), lines


def test_a_value_with_its_error_is_a_number():
    lines = format_table(["名字", "均值 ± 标准误"], [["a", "7.88 ± 0.02"], ["b", "15.22 ± 0.04"]])
    assert lines[2].endswith(" 7.88 ± 0.02") and lines[3].endswith("15.22 ± 0.04")   # 右对齐


def test_print_note_wraps_at_100_columns(capsys):
    from console import print_note
    print_note("说明" * 80, rest_prefix=" ")
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and all(display_width(l) <= 100 for l in lines)
    assert lines[1].startswith(" 说") and "".join(l.strip() for l in lines) == "说明" * 80


# issue 26 第 20 项：观察在式子里折行（"Σ min(p," / "q)"；"γ ∈ {1, 2, 4," / "8}"；"链 (1, …," / "1)"）
FORMULAS = ["Σ min(p, q)", "γ ∈ {1, 2, 4, 8}", "链 (1, …, 1)", "walltime_speedup(0.8, 4, 0.108)", "[0, 1)"]


@pytest.mark.parametrize("formula", FORMULAS)
def test_wrap_never_breaks_inside_brackets_or_after_a_symbol(formula):
    for offset in range(60):                          # 换不同的起点，让式子的每个位置都有机会落在行尾
        text = "汉" * (offset // 2) + "x" * (offset % 2) + f"接受率是 {formula} 的平均，后面还有一些字。" * 3
        lines = wrap_text(text, 100, "  1. ", "     ")
        assert all(display_width(l) <= 100 for l in lines)
        assert "".join(l[5:] for l in lines).replace(" ", "") == text.replace(" ", "")
        assert sum(l.count(formula) for l in lines) == 3, (offset, lines)


def test_a_bracket_wider_than_a_line_still_wraps_without_cutting_words():
    inner = ", ".join(f"item{i}" for i in range(40))           # 一个比整行还宽的括号
    lines = wrap_text(f"列表 ({inner}) 完。", 100, "  1. ", "     ")
    assert len(lines) >= 3 and all(display_width(l) <= 100 for l in lines)
    words = set(f"item{i}," for i in range(39)) | {"item39)"}
    assert all(w in words or not w.startswith("item") for l in lines for w in l.split())


def test_a_long_aside_in_chinese_brackets_breaks_between_characters_not_early():
    """超过 32 列、插在全角括号里的一句话可以在汉字之间断：前一行不会因为整句挪到下一行而空出一大截。"""
    aside = "（这一句是插在括号里的说明，里面有 H100 和 3.35 TB/s 这样的词，比三十二列长得多）"
    text = "汉" * 40 + aside + "后面的正文。"
    lines = wrap_text(text, 100, "  1. ", "     ")
    assert display_width(lines[0]) >= 96
    assert "3.35 TB/s" in "".join(lines) and "H100 和" in "".join(lines)


def test_log_axis_with_less_than_a_decade_gets_1_2_5_ticks():
    """回归（issue 26 第 21 项）：范围里只有一个 10 的幂时，刻度是两端的原值（0.0561 / 0.01 / 0.00919）。"""
    lines = format_plot({"a": ([0, 1], [0.00919, 0.0561])}, "x", "y", logy=True, height=12)
    labels = [l.split("+")[0].strip() for l in lines[1:13] if "+" in l]
    assert labels == ["0.05", "0.02", "0.01"]


def test_unwrap_finds_a_sentence_wherever_the_observation_breaks(capsys):
    """conftest.unwrap：观察在任何宽度下折行（包括在空格处折、那个空格丢掉），`in` 都找得到原句；找不到的还是找不到。"""
    from conftest import unwrap
    from console import print_observations
    text = "中文的观察里夹着 English words and numbers 3.1e-8 与 (1 − α^{γ+1}) / (1 − α)，再接一段中文。"
    for width in range(30, 101, 7):
        lines = wrap_text(text, width, "  1. ", "     ")
        out = unwrap("\n".join(lines) + "\n")
        assert "English words and numbers 3.1e-8 与" in out and "再接一段中文" in out
        assert "English words and numbers 3.1e-9" not in out
    print_observations([text])
    assert "夹着 English words" in unwrap(capsys.readouterr().out)


def test_save_results_writes_a_pickle_only_when_asked(tmp_path, monkeypatch):
    """save_results：CS349E_RESULTS 设了时把给它的对象原样 pickle 进那个文件（测试读它）；没设时不写任何文件。"""
    import pickle

    import numpy as np

    from console import save_results
    obj = {"d1": {"a": np.arange(3.0), ("k", 2): 0.5}}
    monkeypatch.delenv("CS349E_RESULTS", raising=False)
    monkeypatch.chdir(tmp_path)
    save_results(obj)
    assert list(tmp_path.iterdir()) == []
    path = tmp_path / "r.pickle"
    monkeypatch.setenv("CS349E_RESULTS", str(path))
    save_results(obj)
    got = pickle.loads(path.read_bytes())
    assert got.keys() == obj.keys() and got["d1"][("k", 2)] == 0.5
    assert np.array_equal(got["d1"]["a"], obj["d1"]["a"])
