"""
console —— 所有脚本共用的终端输出：标题、对齐的表格、"观察"块，以及带单位的短数字。

【表格怎么对齐】按**显示宽度**对齐：Unicode 的 East Asian Width 为 W 或 F 的字符（汉字、全角标点）占两列，
其他字符（包括 α γ ĉ × µ Σ 这些希腊字母和符号）占一列。一列里的格子如果全是数（或"数 + 短单位"，
如 "1.53×"、"0.897 ms"），这一列右对齐，小数点附近自然对齐；否则左对齐。

【数字怎么写】fmt_time / fmt_bytes / fmt_num 都保留 3 位有效数字，用十进制 SI 前缀（和数据手册一样：
"12.3 GB" = 12.3 × 10⁹ 字节，不是 GiB）。
"""
import math
import re
import unicodedata

import numpy as np

__all__ = ["display_width", "print_header", "print_table", "print_observations", "format_table",
           "fmt_time", "fmt_bytes", "fmt_num", "fmt_sig", "fmt_bound"]

RULE_WIDTH = 100
_NUMERIC = re.compile(r"^[-+]?(\d[\d,]*\.?\d*|\.\d+)([eE][-+]?\d+)?( ?[^\s\d]{0,3})?$")


def display_width(text):
    """字符串在等宽终端里占几列：East Asian Width 为 W/F 的字符算 2 列，其余算 1 列。"""
    return sum(2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1 for ch in text)


def _cell(x):
    """表格里一个格子的文字：str 原样；bool 写成"是/否"；int 原样；float 用 {:.4g}。"""
    if isinstance(x, str):
        return x
    if isinstance(x, (bool, np.bool_)):
        return "是" if x else "否"
    if isinstance(x, (int,)) or (hasattr(x, "dtype") and getattr(x.dtype, "kind", "") in "iu"):
        return str(int(x))
    return f"{float(x):.4g}"


def _pad(text, width, right):
    gap = " " * (width - display_width(text))
    return gap + text if right else text + gap


def format_table(headers, rows):
    """把表格排成一行一个字符串的列表（print_table 打印它；测试直接检查它）。"""
    head = [_cell(h) for h in headers]
    body = [[_cell(c) for c in row] for row in rows]
    for row in body:
        if len(row) != len(head):
            raise ValueError(f"表格的一行有 {len(row)} 个格子，表头有 {len(head)} 个：{row}")
    n = len(head)
    widths = [max([display_width(head[j])] + [display_width(r[j]) for r in body]) for j in range(n)]
    right = [bool(body) and all(_NUMERIC.match(r[j]) for r in body) for j in range(n)]
    lines = ["  ".join(_pad(head[j], widths[j], right[j]) for j in range(n)).rstrip()]
    lines.append("  ".join("-" * widths[j] for j in range(n)))
    for r in body:
        lines.append("  ".join(_pad(r[j], widths[j], right[j]) for j in range(n)).rstrip())
    return lines


def print_header(title):
    """打印一个演示的标题：上下各一条横线。"""
    print()
    print("=" * RULE_WIDTH)
    print(title)
    print("=" * RULE_WIDTH)


def print_table(headers, rows):
    """打印一个按显示宽度对齐的表格（格子可以是 str / int / float，float 显示为 {:.4g}）。"""
    for line in format_table(headers, rows):
        print(line)


def print_observations(items):
    """打印编号的"观察"块。"""
    print("\n观察：")
    for i, text in enumerate(items, 1):
        print(f"  {i}. {text}")


def fmt_sig(x, digits=3):
    """x 保留 digits 位有效数字，保留末尾的 0（41 → "41.0"，0.5 → "0.500"）。"""
    if x == 0 or not math.isfinite(x):
        return "0" if x == 0 else str(x)
    mag = math.floor(math.log10(abs(x)))
    if abs(round(x, digits - 1 - mag)) >= 10 ** (mag + 1):  # 四舍五入进了一位（999.6 → 1000）
        mag += 1
    return f"{x:.{max(0, digits - 1 - mag)}f}"


def _with_prefix(x, units, threshold):
    """
    选一个前缀（units 从大到小：(倍数, 名字)），取数值（3 位有效数字以后）不小于 threshold 的最大单位。
    """
    if x == 0:
        return "0 " + units[-1][1]
    for scale, name in units:
        text = fmt_sig(x / scale)
        if abs(float(text)) >= threshold or scale == units[-1][0]:
            return f"{text} {name}"
    raise AssertionError("unreachable")  # pragma: no cover


_TIME_UNITS = [(1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")]
_SI = [(1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, "")]


def fmt_time(seconds):
    """
    时间（秒）→ 短字符串，3 位有效数字："0.897 ms"、"2.52 ms"、"56.7 µs"、"144 ms"、"1.20 s"。

    【单位的选法】取数值不小于 0.5 的最大单位：所以 0.000897 s 写成 "0.897 ms"（不是 "897 µs"），
    0.144 s 写成 "144 ms"（不是 "0.144 s"）。
    """
    if seconds == 0:
        return "0 s"
    return _with_prefix(float(seconds), _TIME_UNITS, 0.5)


def fmt_bytes(n):
    """字节数 → "12.3 GB"（十进制：1 GB = 10⁹ 字节），3 位有效数字。"""
    return _with_prefix(float(n), _SI, 1.0) + "B"


def fmt_num(x):
    """一个数 → "4.56 G"（十进制前缀 k M G T P E），3 位有效数字。"""
    return _with_prefix(float(x), _SI, 1.0).rstrip()


def fmt_bound(x, bound):
    """
    一个浮点舍入误差打印成上界："< 1e-13"（只要 x < bound）。

    【为什么】舍入误差的具体数字（3.8e-15 还是 4.4e-15）随 BLAS 的实现、CPU 而变，打印它会让输出在不同机器上不同；
    上界才是要教的东西。x 超过上界时打印它的值（两位有效数字）——那说明出错了，测试会抓住。
    """
    if not bound > 0:
        raise ValueError(f"上界必须为正（收到 {bound}）")
    return f"< {bound:.0e}" if x < bound else f"{x:.2g}"
