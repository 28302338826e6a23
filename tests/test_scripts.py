"""
每个编号脚本（按文件名模式找到，新脚本自动覆盖）：退出码 0、stderr 为空（没有警告）、从仓库根目录和
从脚本自己的目录各跑一次打印的字节完全相同；并检查文档形式和可移植性（Python 3.9 的语法）。
"""
import glob
import json
import os
import re
import sys

import pytest

import background_runs
from conftest import ROOT, numbered_scripts, script_run_pair

SCRIPTS = numbered_scripts()


def test_there_are_scripts():
    assert "lecture05/05_heterogeneous_spec_decode.py" in SCRIPTS


@pytest.mark.parametrize("rel", SCRIPTS)
def test_script_runs_cleanly_and_prints_the_same_bytes_from_any_directory(rel):
    (c1, out1, err1), (c2, out2, err2) = script_run_pair(rel)
    assert c1 == 0, err1.decode("utf-8", "replace")
    assert c2 == 0, err2.decode("utf-8", "replace")
    assert err1 == b"" and err2 == b"", (err1 + err2).decode("utf-8", "replace")
    assert out1 and out1 == out2
    assert not re.search(rb"(?<![A-Za-z])nan(?![A-Za-z])", out1), "输出里有 nan（Python / numpy 打印 NaN 的样子）"


def _python_files():
    files = glob.glob(os.path.join(ROOT, "**", "*.py"), recursive=True)
    return sorted(os.path.relpath(p, ROOT) for p in files if "/." not in p)


# 下面两组测试要把仓库里每个 .py 都解析一遍（合起来一秒多，全在测试进程里）。改成一个子进程做同样的事：这个文件被
# 导入（收集）时排进后台的队（tests/background_runs.py），和别的测试同时跑。它对每个文件（argv 给的相对路径）做
# ast.parse(源码, feature_version=(3, 9))，记下 SyntaxError 的消息（没有就是 None）和模块的 docstring
# （ast.get_docstring），整个 dict 用 JSON 打印出来；断言还在下面的测试里，一个文件一个。
PARSE_CHILD = r"""
import ast, json, os, sys
out = {}
for rel in sys.argv[2:]:
    with open(os.path.join(sys.argv[1], rel), encoding="utf-8") as f:
        src = f.read()
    try:
        tree = ast.parse(src, feature_version=(3, 9))
    except SyntaxError as e:
        out[rel] = {"error": f"{type(e).__name__}: {e}", "doc": None}
    else:
        out[rel] = {"error": None, "doc": ast.get_docstring(tree)}
print(json.dumps(out, ensure_ascii=False))
"""
PY_FILES = _python_files()
_PARSE_KEY = ("test_scripts: ast.parse 3.9",)
background_runs.submit(_PARSE_KEY, [sys.executable, "-c", PARSE_CHILD, ROOT, *PY_FILES],
                       env=dict(os.environ, PYTHONIOENCODING="utf-8"), timeout=300)
_PARSED = {}


def parsed(rel):
    """子进程给 rel 的结果：{"error": SyntaxError 的消息或 None, "doc": 模块的 docstring}。"""
    if not _PARSED:
        r = background_runs.result(_PARSE_KEY)
        assert r.returncode == 0, r.stderr.decode("utf-8", "replace")
        _PARSED.update(json.loads(r.stdout.decode("utf-8")))
    return _PARSED[rel]


@pytest.mark.parametrize("rel", SCRIPTS)
def test_script_docstring_has_the_seed_form(rel):
    p = parsed(rel)
    assert p["error"] is None, p["error"]
    doc = p["doc"]
    assert doc and os.path.basename(rel) in doc
    for part in ("【这个脚本要回答的问题】", "【运行】", "【依赖】"):
        assert part in doc, part


@pytest.mark.parametrize("rel", PY_FILES)
def test_source_parses_as_python_3_9(rel):
    assert parsed(rel)["error"] is None, parsed(rel)["error"]
