"""
console —— 所有脚本共用的终端输出：标题、对齐的表格、"观察"块、两种字符画（条形图、散点 / 折线图），以及带单位的短数字。

【页面】一页最宽 100 个显示列（标题上下的横线就是这个宽度）。显示宽度：Unicode 的 East Asian Width 为 W 或 F 的字符
（汉字、全角标点）占两列，其他字符占一列——包括 α γ ĉ × µ — 这些"宽度不明确"（Ambiguous）的字符：标准终端里它们占
一列（CJK 终端可能把它们画成两列，那时对齐会差一点）。

【表格怎么排】print_table / format_table：
- 一列是"数字列"，当它的格子都是数（可带符号、单位、×、%、"± 误差"，例如 "1.53×"、"0.897 ms"、"-2.5"、"92.6%"、
  "7.88 ± 0.02"），
  只有占位符例外："—"、"-"、空格子，或很短的中文结论（"不划算"、"永远不会"这类 ≤ 5 个汉字、不含数字的格子），
  而且数至少占非空格子的一半。
  数字列整列右对齐（占位符也右对齐）；其他列左对齐。一列里有一个 "—" 不会让它变成左对齐。
- 数字格子开头的 Unicode 减号 "−" 统一写成 ASCII 的 "-"（全仓库一个约定）。
- 表头格子里的 "\\n" 是换行：表头可以占两行（底端对齐）。整张表超过 100 列时，console 自动把"比这一列的数字还宽"
  的表头在自然的位置（全角括号前、空格处、两个汉字之间）断成两行，直到放得下或没有可断的表头。

【观察怎么折行】print_observations：每条在 100 列处折行，续行缩进到正文的起点（"  1. " 之后）。只在空格处或两个
汉字之间断开，不断开一个数、一个数和它的单位（"3.1 ms"、"128 个"）、一个短式子（"γ = 8"、"1 − α"、"Σ min(p, q)"）、
括号里面（()、[]、{}、（）；超过 32 列的括号只在挨着汉字处断）或一个英文词；逗号、句号这类标点不放在行首。

【图】print_bars：横条，长度和数值成正比（取最近的整格）；print_plot：字符网格上的散点 / 折线图，可取对数轴。
都只用 ASCII 字符画（█ ▇ 和制表符在 CJK 终端里是"宽度不明确"的，会错位）。

【数字怎么写】fmt_time / fmt_bytes / fmt_num 都保留 3 位有效数字，用十进制 SI 前缀（和数据手册一样：
"12.3 GB" = 12.3 × 10⁹ 字节，不是 GiB）。

【BLAS 线程】import console 时执行 blas_threads 的规则：学生没设 OPENBLAS_NUM_THREADS 等变量时，BLAS 只用一个线程。

【给测试的记录】环境变量 CS349E_CONSOLE_LOG 指向一个文件时，console 把它打印的每个块（表格的格子和排好的行、
观察、图）以 JSON 行追加到那个文件——打印的内容不变。tests/test_page.py 用它检查每个脚本的页面。
环境变量 CS349E_RESULTS 指向一个文件时，save_results 把脚本交给它的数（演示返回的 dict）用 pickle 存进去：测试
核对的就是这次运行打印的数，不必在测试进程里把演示再跑一遍。没设时两者都什么也不做。
"""
import json
import math
import os
import pickle
import re
import unicodedata

import numpy as np

import blas_threads

blas_threads.apply_rule()     # 每个编号脚本都 import console：BLAS 一个线程，除非学生自己设了（见 blas_threads）

__all__ = ["display_width", "print_header", "print_table", "print_observations", "format_table",
           "wrap_text", "print_note", "print_bars", "print_plot", "format_bars", "format_plot", "is_numeric_cell",
           "fmt_time", "fmt_bytes", "fmt_num", "fmt_sig", "fmt_bound", "fmt_p", "RULE_WIDTH", "save_results"]

RULE_WIDTH = 100

# 一个"数"格子：可选的比较符 / 符号，一个数（或 a–b 的范围），可选的单位（≤ 8 个字母 / 符号，或 ≤ 2 个汉字）
_NUM = r"[-+−]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_NUMERIC = re.compile(r"^(?:[<>≤≥≈~]\s?)?" + _NUM + r"(?:\s?[–-]\s?" + _NUM + r"|\s?±\s?" + _NUM + r")?"
                      r"(?:\s?(?:[A-Za-zµ%×/²³·]{1,8}|[\u4e00-\u9fff]{1,2}))?$")
_PLACEHOLDER = re.compile(r"^(?:|—|–|-|--|n/a|[\u4e00-\u9fff（）]{1,5})$")


def display_width(text):
    """字符串在等宽终端里占几列：East Asian Width 为 W/F 的字符算 2 列，其余算 1 列。"""
    return sum(2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1 for ch in text)


def _wide(ch):
    return unicodedata.east_asian_width(ch) in ("W", "F")


def _log(kind, lines, **extra):
    """CS349E_CONSOLE_LOG 设了时，把这一块追加到那个文件（一行 JSON）；否则什么也不做。"""
    path = os.environ.get("CS349E_CONSOLE_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(dict(kind=kind, lines=lines, **extra), ensure_ascii=False) + "\n")


def save_results(obj):
    """CS349E_RESULTS 设了时，把 obj（脚本演示返回的数）用 pickle 写进那个文件（给测试读）；否则什么也不做。"""
    path = os.environ.get("CS349E_RESULTS")
    if path:
        with open(path, "wb") as f:
            pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)


def _emit(kind, lines, **extra):
    for line in lines:
        print(line)
    _log(kind, lines, **extra)


# ---------------------------------------------------------------------------------------------------
# 表格

def _cell(x):
    """表格里一个格子的文字：str 原样；bool 写成"是/否"；int 原样；float 用 {:.4g}。"""
    if isinstance(x, str):
        return x
    if isinstance(x, (bool, np.bool_)):
        return "是" if x else "否"
    if isinstance(x, (int,)) or (hasattr(x, "dtype") and getattr(x.dtype, "kind", "") in "iu"):
        return str(int(x))
    return f"{float(x):.4g}"


def is_numeric_cell(text):
    """一个格子的文字是不是"数"（可带符号、单位、×、%、范围），见模块说明。"""
    return bool(_NUMERIC.match(text.strip()))


def _numeric_column(cells):
    """一列是数字列：其余都是数或占位符，而且数至少占非空格子的一半。"""
    nums = [is_numeric_cell(c) for c in cells]
    filled = sum(1 for c in cells if c.strip())
    return (2 * sum(nums) >= max(filled, 1) and
            all(n or _PLACEHOLDER.match(c.strip()) for n, c in zip(nums, cells)))


def _pad(text, width, right):
    gap = " " * (width - display_width(text))
    return gap + text if right else text + gap


def _split_points(text):
    """表头一行里可以断开的位置（下标 i：断成 text[:i] 和 text[i:]，空格被丢掉），按优先级分组。"""
    paren = [i for i in range(1, len(text)) if text[i] == "（"]
    space = [i for i in range(1, len(text)) if text[i] == " "]
    cjk = [i for i in range(1, len(text)) if _wide(text[i - 1]) and _wide(text[i])
           and text[i] not in "，。、；：）」』】》" and text[i - 1] not in "（「『【《"]
    return [paren, space, cjk]


def _break_header(text):
    """把一行表头断成两行，两行中较宽的一行尽量窄（优先在全角括号前、空格处、汉字之间）。不能断时返回 None。"""
    best = None
    for group in _split_points(text):
        for i in group:
            a, b = text[:i].rstrip(), text[i:].lstrip()
            if not a or not b:
                continue
            w = max(display_width(a), display_width(b))
            if best is None or w < best[0]:
                best = (w, a + "\n" + b)
        if best is not None and best[0] <= 0.75 * display_width(text):
            break                                             # 高优先级的断点已经够好，不再往下找
    return None if best is None else best[1]


def _layout(head, body):
    """每列的宽度和对齐方式。"""
    n = len(head)
    widths = [max([display_width(s) for s in head[j].split("\n")] + [display_width(r[j]) for r in body])
              for j in range(n)]
    right = [bool(body) and _numeric_column([r[j] for r in body]) for j in range(n)]
    return widths, right


def format_table(headers, rows, max_width=RULE_WIDTH):
    """
    把表格排成一行一个字符串的列表（print_table 打印它；测试直接检查它）。

    【边界】表头里的 "\\n" 换行；整张表比 max_width 宽时，自动把最宽、又比本列格子宽的表头断成两行（最多三行），
    直到放得下或没有表头可断（那时照原样排：格子本身太宽，得由脚本改表）。
    """
    head = [_cell(h) for h in headers]
    body = [[_cell(c) for c in row] for row in rows]
    for row in body:
        if len(row) != len(head):
            raise ValueError(f"表格的一行有 {len(row)} 个格子，表头有 {len(head)} 个：{row}")
    n = len(head)
    for j in range(n):                                        # 数字格子：Unicode 减号写成 ASCII "-"
        col = [r[j] for r in body]
        if body and _numeric_column(col):
            for r in body:
                if r[j].startswith("−"):
                    r[j] = "-" + r[j][1:]
    widths, right = _layout(head, body)
    while sum(widths) + 2 * (n - 1) > max_width:
        cells_w = [max([display_width(r[j]) for r in body], default=0) for j in range(n)]
        best = None
        for j in range(n):
            parts = head[j].split("\n")
            k = max(range(len(parts)), key=lambda i: display_width(parts[i]))
            if len(parts) >= 3 or display_width(parts[k]) <= cells_w[j]:
                continue
            broken = _break_header(parts[k])
            if broken is None:
                continue
            new = "\n".join(parts[:k] + [broken] + parts[k + 1:])
            gain = widths[j] - max([display_width(s) for s in new.split("\n")] + [cells_w[j]])
            if gain > 0 and (best is None or gain > best[0]):
                best = (gain, j, new)
        if best is None:
            break
        head[best[1]] = best[2]
        widths, right = _layout(head, body)
    height = max(len(h.split("\n")) for h in head)
    head_lines = [[""] * (height - len(h.split("\n"))) + h.split("\n") for h in head]   # 底端对齐
    lines = ["  ".join(_pad(head_lines[j][i], widths[j], right[j]) for j in range(n)).rstrip()
             for i in range(height)]
    lines.append("  ".join("-" * widths[j] for j in range(n)))
    for r in body:
        lines.append("  ".join(_pad(r[j], widths[j], right[j]) for j in range(n)).rstrip())
    return lines


def print_header(title):
    """打印一个演示的标题：上下各一条 100 列的横线（标题太长时折行）。"""
    print()
    lines = ["=" * RULE_WIDTH] + wrap_text(title, RULE_WIDTH) + ["=" * RULE_WIDTH]
    _emit("header", lines, title=title)


def print_table(headers, rows):
    """打印一个按显示宽度对齐的表格（格子可以是 str / int / float，float 显示为 {:.4g}）。"""
    headers = [_cell(h) for h in headers]
    rows = [[_cell(c) for c in row] for row in rows]
    _emit("table", format_table(headers, rows), headers=headers, rows=rows)


# ---------------------------------------------------------------------------------------------------
# 折行

_OPERATORS = {"=", "<", ">", "≤", "≥", "≈", "×", "→", "←", "+", "−", "-", "/", "·", "~", "≠", "÷", "*", "±",
              "|", "–", ":", "⇒", "∝", "≪", "≫", "==", "!=", "<=", ">=", "∈", "∉", "⊂", "⊆", "≡", "∼", "↔",
              "⇔", "Σ", "∑", "Π", "∏", "√", "∫", "∂", "∀", "∃", "¬"}
_OPEN, _CLOSE = "([{（", ")]}）"
_NO_LINE_START = set("，。、；：！？）」』】》…%”’,.;:!?)]}")
_NO_LINE_END = set("（「『【《“‘([{")
_UNIT = re.compile(r"^[A-Za-zµ%×/²³·]{1,8}[,.;:)，。；：）]*$")


def _atoms(text):
    """把一段文字切成原子：[文字, 前面有没有空格]。汉字各自是一个原子，不含空格的非汉字串是一个原子。"""
    atoms, i, space = [], 0, False
    while i < len(text):
        ch = text[i]
        if ch == " ":
            space, i = True, i + 1
            continue
        if _wide(ch):
            atoms.append([ch, space])
            i += 1
        else:
            j = i
            while j < len(text) and text[j] != " " and not _wide(text[j]):
                j += 1
            atoms.append([text[i:j], space])
            i = j
        space = False
    return atoms


def _glued(a, b, space):
    """原子 a 后面接 b：这里能不能断行？返回 True 表示不能断。"""
    if b in _NO_LINE_START or b[0] in _NO_LINE_START:
        return True
    if a in _NO_LINE_END or a[-1] in _NO_LINE_END:
        return True
    if a in _OPERATORS or b in _OPERATORS:                 # "γ = 8"、"1 − α" 不拆
        return True
    if b[0] in "([{" and a[-1].isalnum():                  # 名字和它后面的括号："链 (1, …, 1)"、"f (x)"
        return True
    has_digit = any(c.isdigit() for c in a)
    if has_digit and (_wide(b[0]) or (space and _UNIT.match(b))):   # "128 个"、"3.1 ms" 不拆
        return True
    if not space and not _wide(a[-1]) and not _wide(b[0]):
        return True                                         # 同一个词（不会发生：原子本来就是整个词）
    if not space and not _wide(a[-1]) and _wide(b[0]) and b[0] in "倍个位次轮步秒":
        return True
    return False


_SHORT_GROUP = 32      # 括号连同里面的字不超过这么多列时，整个括号不拆开


def _groups(atoms):
    """
    每个原子之前最里层没合上的括号 -> 列表：下标 k 处是 (开括号所在的原子, 合上它的原子) 或 None（不在括号里）。

    ()、[]、{}、（）不分种类地配对（"[0, 1)" 也是一个括号），多出来的右括号不算；没合上的括号到段尾。
    """
    stack, spans, inner = [], {}, []
    for k, (a, _) in enumerate(atoms):
        inner.append(stack[-1] if stack else None)
        for ch in a:
            if ch in _OPEN:
                stack.append((k, len(spans)))
                spans[len(spans)] = None
            elif ch in _CLOSE and stack:
                spans[stack.pop()[1]] = k
    last = len(atoms) - 1
    return [None if g is None else (g[0], last if spans[g[1]] is None else spans[g[1]]) for g in inner]


def _chunks(atoms, line_width):
    """
    原子 → 不可再分的块 [文字, 前面有没有空格]。

    【规则】_glued 说不能断的地方不断；括号里面也不断（"Σ min(p, q)"、"γ ∈ {1, 2, 4, 8}"、"链 (1, …, 1)"）。
    例外：一个括号比 _SHORT_GROUP 列宽（多半是一句插在括号里的话），它里面可以在挨着汉字的地方断（两个汉字之间、
    汉字和英文之间的空格）；两个英文词 / 数之间的空格仍然不断，里面更短的括号、式子照样不拆。
    粘成的一块比整行（line_width）还宽时，这一块里退回只按 _glued 断。
    """
    if not atoms:
        return []

    def text(lo, hi):
        return "".join((" " if (k > lo and atoms[k][1]) else "") + atoms[k][0] for k in range(lo, hi + 1))

    widths = {}

    def group_width(g):
        if g not in widths:
            widths[g] = display_width(text(*g))
        return widths[g]

    groups = _groups(atoms)
    loose = [False] + [_glued(atoms[k - 1][0], atoms[k][0], atoms[k][1]) for k in range(1, len(atoms))]
    strict = list(loose)
    for k in range(1, len(atoms)):
        g = groups[k]
        if g is None or loose[k]:
            continue
        wide = _wide(atoms[k - 1][0][-1]) or _wide(atoms[k][0][0])
        strict[k] = not (wide and group_width(g) > _SHORT_GROUP)

    chunks, k = [], 0
    while k < len(atoms):
        end = k + 1
        while end < len(atoms) and strict[end]:
            end += 1
        glue = strict if display_width(text(k, end - 1)) <= line_width else loose   # 太长：退回只按 _glued 断
        for i in range(k, end):
            if i > k and glue[i]:
                chunks[-1][0] += (" " if atoms[i][1] else "") + atoms[i][0]
            else:
                chunks.append(list(atoms[i]))
        k = end
    return chunks


def _hard_split(text, width):
    out, cur = [], ""
    for ch in text:
        if display_width(cur + ch) > width and cur:
            out.append(cur)
            cur = ""
        cur += ch
    return out + [cur]


def wrap_text(text, width=RULE_WIDTH, first_prefix="", rest_prefix=""):
    """
    把一段文字折成每行不超过 width 列的行列表（第一行以 first_prefix 开头，后面的行以 rest_prefix 开头）。

    【规则】只在空格处（空格去掉）或两个汉字之间断开；不拆开一个数和它的单位、一个短式子、一个英文词（见模块说明），
    不在括号里面断开（长括号只在挨着汉字处断，见 _chunks）；文字里的 "\\n" 强制换行。一个比整行还宽的词才会被硬切开。
    """
    lines = []
    for p, para in enumerate(text.split("\n")):
        pre = first_prefix if p == 0 else rest_prefix
        chunks = _chunks(_atoms(para), width - display_width(rest_prefix))
        cur = pre
        cur_empty = True
        for c, space in chunks:
            sep = " " if (space and not cur_empty) else ""
            if display_width(cur + sep + c) <= width:
                cur += sep + c
                cur_empty = False
                continue
            if not cur_empty:
                lines.append(cur.rstrip())
                cur, cur_empty = rest_prefix, True
            avail = width - display_width(cur)
            if display_width(c) > avail:
                pieces = _hard_split(c, avail)
                for piece in pieces[:-1]:
                    lines.append((cur + piece).rstrip())
                    cur = rest_prefix
                c = pieces[-1]
            cur += c
            cur_empty = False
        lines.append(cur.rstrip())
    return lines


def print_note(text, rest_prefix=""):
    """打印一段说明文字（表格上下的注、图的说明）：在 100 列处折行，续行以 rest_prefix 开头。"""
    _emit("note", wrap_text(text, RULE_WIDTH, "", rest_prefix))


def print_observations(items):
    """打印编号的"观察"块：每条在 100 列处折行，续行和正文对齐。"""
    print("\n观察：")
    lines = []
    for i, text in enumerate(items, 1):
        prefix = f"  {i}. "
        lines += wrap_text(text, RULE_WIDTH, prefix, " " * display_width(prefix))
    _emit("observations", lines, items=[str(t) for t in items])


# ---------------------------------------------------------------------------------------------------
# 图

def _check_finite(values, what):
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{what}必须是非空的一维数列（收到形状 {arr.shape}）")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{what}里有 NaN 或无穷大：图只能画有限的数")
    return arr


def format_bars(labels, values, unit="", width=60):
    """
    横条图的各行：每行"标签  ####… 数值单位"，条长 = round(数值 / 最大值 × width) 格。

    【参数】unit 直接接在数值后面（要空格就写 " ms"）；width：最长的条占几格（整行超过 100 列时自动缩短）。
    【边界】labels 和 values 长度不同、空、负数、NaN 都抛 ValueError；全为 0 时条长都是 0。
    """
    vals = _check_finite(values, "条形图的数值")
    labels = [str(x) for x in labels]
    if len(labels) != len(vals):
        raise ValueError(f"条形图有 {len(labels)} 个标签、{len(vals)} 个数值：两者必须一样多")
    if np.any(vals < 0):
        raise ValueError("条形图的数值不能为负（条长和数值成正比）")
    if width < 1:
        raise ValueError(f"条形图的宽度必须是正整数（收到 {width}）")
    texts = [_cell(float(v)) + unit for v in vals]
    lw = max(display_width(s) for s in labels)
    tw = max(display_width(s) for s in texts)
    width = min(width, RULE_WIDTH - lw - tw - 4)
    if width < 5:
        raise ValueError("条形图的标签或数值太宽：放不进 100 列")
    top = float(vals.max())
    lines = []
    for lab, v, t in zip(labels, vals, texts):
        n = int(math.floor(v / top * width + 0.5)) if top > 0 else 0
        lines.append(f"{_pad(lab, lw, False)}  {'#' * n} {t}".rstrip())
    return lines


def print_bars(labels, values, unit="", width=60):
    """打印横条图（见 format_bars）。"""
    lines = format_bars(labels, values, unit, width)
    _emit("bars", lines, values=[float(v) for v in values])


_MARKS = "*o+x#@%&"


def _tick_text(v):
    """刻度的短写法：1e-3 ≤ |v| < 1e4 用 {:g}，更大的用 SI 前缀（10k、1.5M、2T），更小的用 1e-05。"""
    if v == 0:
        return "0"
    a = abs(v)
    if 1 <= a < 1e4 and float(v).is_integer():
        return str(int(v))
    if 1e-3 <= a < 1e4:
        return f"{v:.3g}"
    if a >= 1e4:
        for scale, name in _SI:
            if a >= scale and name:
                return f"{v / scale:.3g}{name}"
    return f"{v:.0e}"


def _nice_ticks(lo, hi, log):
    """
    坐标轴的刻度值：对数轴取 10 的整数次幂，不到两个时取 1、2、5 × 10^k（还不够再加 3，再不够取 1–9 × 10^k，
    最后才加上两端）；线性轴取 1、2、5 × 10^k 的整数倍。
    """
    if log:
        ks = range(math.ceil(math.log10(lo) - 1e-9), math.floor(math.log10(hi) + 1e-9) + 1)
        ticks = [10.0 ** k for k in ks]
        if len(ticks) > 8:
            step = math.ceil(len(ticks) / 6)
            ticks = ticks[::step]
        for mantissas in ((1, 2, 5), (1, 2, 3, 5), range(1, 10)):     # 不到两个 10 的幂：1、2、5 × 10^k
            if len(ticks) >= 2:
                break
            ticks = [m * 10.0 ** k for k in range(math.floor(math.log10(lo)), math.floor(math.log10(hi)) + 1)
                     for m in mantissas if lo * (1 - 1e-9) <= m * 10.0 ** k <= hi * (1 + 1e-9)]
        if len(ticks) < 2:
            ticks = sorted(set(ticks + [lo, hi]))
        return ticks
    span = hi - lo
    raw = span / 4
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 5, 10)), key=lambda s: abs(s - raw))
    first = math.ceil(lo / step - 1e-9) * step
    ticks, t = [], first
    while t <= hi + 1e-9 * span:
        ticks.append(0.0 if abs(t) < 1e-12 * span else t)
        t += step
    return ticks


def _axis(values, log, lim):
    """数据范围（或给定的范围）→ (lo, hi, 变换函数)。"""
    if lim is not None:
        lo, hi = float(lim[0]), float(lim[1])
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"坐标范围必须是两个有限的数且前小后大（收到 {lim}）")
        if log and lo <= 0:
            raise ValueError(f"对数轴的范围必须为正（收到 {lim}）")
    else:
        lo, hi = float(np.min(values)), float(np.max(values))
        if lo == hi:
            lo, hi = (lo / 10 ** 0.5, hi * 10 ** 0.5) if log else (lo - 1, hi + 1)
    f = (lambda v: np.log10(v)) if log else (lambda v: np.asarray(v, dtype=np.float64))
    return lo, hi, f


def format_plot(series, x_label, y_label, logx=False, logy=False, width=72, height=18, xlim=None, ylim=None):
    """
    散点 / 折线图的各行：series 把名字映射到 (xs, ys) 或 (xs, ys, 记号)；每个点落在最近的格子里。

    【画法】x 映射到 0..width−1 列、y 映射到 0..height−1 行（最下面一行是最小值），对数轴先取 log10；
    后画的系列盖住先画的。左边是 y 轴刻度，下面是 x 轴刻度，最后一行是图例（每个系列一个记号）。
    想画成线就多给几个点。xlim / ylim 给定时，范围外的点不画。
    【边界】没有系列、某个系列没有点、xs 和 ys 长度不同、NaN / 无穷大、对数轴上的非正数都抛 ValueError。
    """
    if not series:
        raise ValueError("图里至少要有一个系列（series 是空的）")
    if width < 10 or height < 5:
        raise ValueError(f"图太小：宽至少 10、高至少 5（收到 {width} × {height}）")
    data = []
    for k, (name, val) in enumerate(series.items()):
        if len(val) not in (2, 3):
            raise ValueError(f"系列 {name!r} 必须是 (xs, ys) 或 (xs, ys, 记号)")
        xs = _check_finite(val[0], f"系列 {name!r} 的 x ")
        ys = _check_finite(val[1], f"系列 {name!r} 的 y ")
        if xs.shape != ys.shape:
            raise ValueError(f"系列 {name!r} 的 x 有 {xs.size} 个、y 有 {ys.size} 个：必须一样多")
        if logx and np.any(xs <= 0):
            raise ValueError(f"系列 {name!r} 有非正的 x：对数轴只能画正数")
        if logy and np.any(ys <= 0):
            raise ValueError(f"系列 {name!r} 有非正的 y：对数轴只能画正数")
        mark = val[2] if len(val) == 3 else _MARKS[k % len(_MARKS)]
        if len(mark) != 1 or display_width(mark) != 1 or unicodedata.east_asian_width(mark) == "A":
            raise ValueError(f"记号 {mark!r} 必须是一个在任何终端里都占一列的字符")
        data.append((str(name), xs, ys, mark))
    allx = np.concatenate([d[1] for d in data])
    ally = np.concatenate([d[2] for d in data])
    x0, x1, fx = _axis(allx, logx, xlim)
    y0, y1, fy = _axis(ally, logy, ylim)
    X0, X1, Y0, Y1 = float(fx(x0)), float(fx(x1)), float(fy(y0)), float(fy(y1))

    def col(x):
        return int(math.floor((float(fx(x)) - X0) / (X1 - X0) * (width - 1) + 0.5))

    def row(y):
        return int(math.floor((float(fy(y)) - Y0) / (Y1 - Y0) * (height - 1) + 0.5))

    grid = [[" "] * width for _ in range(height)]
    for _, xs, ys, mark in data:
        for x, y in zip(xs, ys):
            c, r = col(x), row(y)
            if 0 <= c < width and 0 <= r < height:
                grid[height - 1 - r][c] = mark
    yt = [(row(t), _tick_text(t)) for t in _nice_ticks(y0, y1, logy)]
    yt = [(r, s) for r, s in yt if 0 <= r < height]
    lw = max([display_width(s) for _, s in yt] + [1])
    if lw + 2 + width > RULE_WIDTH:
        raise ValueError(f"图太宽：刻度 {lw} 列 + 图 {width} 列超过 100 列")
    ylab = {height - 1 - r: s for r, s in yt}
    lines = wrap_text(y_label, RULE_WIDTH)
    for i in range(height):
        lab = ylab.get(i, "")
        axis = "+" if i in ylab else "|"
        lines.append((_pad(lab, lw, True) + " " + axis + "".join(grid[i])).rstrip())
    xt = [(col(t), _tick_text(t)) for t in _nice_ticks(x0, x1, logx)]
    xt = [(c, s) for c, s in xt if 0 <= c < width]
    base = ["-"] * width
    for c, _ in xt:
        base[c] = "+"
    lines.append(" " * lw + " +" + "".join(base))
    under = [" "] * (lw + 2 + width + 8)
    last_end = -1
    for c, s in xt:
        start = lw + 2 + c - len(s) // 2
        start = max(start, 0)
        if start <= last_end + 1 or start + len(s) > len(under):
            continue
        under[start:start + len(s)] = list(s)
        last_end = start + len(s) - 1
    lines.append("".join(under).rstrip())
    xl = wrap_text(x_label, RULE_WIDTH - lw - 2)
    lines += [" " * (lw + 2) + s for s in xl]
    legend = "图例：" + "   ".join(f"{mark} {name}" for name, _, _, mark in data)
    lines += [legend] if display_width(legend) <= RULE_WIDTH else wrap_text(legend, RULE_WIDTH, "", "      ")
    return lines


def print_plot(series, x_label, y_label, logx=False, logy=False, width=72, height=18, xlim=None, ylim=None):
    """打印散点 / 折线图（见 format_plot）。"""
    lines = format_plot(series, x_label, y_label, logx, logy, width, height, xlim, ylim)
    _emit("plot", lines)


# ---------------------------------------------------------------------------------------------------
# 数字
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


def fmt_p(pv):
    """
    p 值的统一写法：≥ 0.001 时三位小数（"0.662"）；更小的只打印数量级上界（"< 1e-11"）。

    【为什么】极小的 p 值的具体数字只说明"差得很远"，而且随实现的舍入变；上界就够了。
    """
    if not 0 <= pv <= 1:
        raise ValueError(f"p 值必须在 [0, 1] 里（收到 {pv}）")
    return f"{pv:.3f}" if pv >= 1e-3 else f"< 1e{int(math.floor(math.log10(max(pv, 1e-300)))) + 1}"
