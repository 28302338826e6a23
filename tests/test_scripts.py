"""
每个编号脚本（按文件名模式找到，新脚本自动覆盖）：退出码 0、stderr 为空（没有警告）、从仓库根目录和
从脚本自己的目录各跑一次打印的字节完全相同；并检查文档形式和可移植性（Python 3.9 的语法）。
"""
import os
import re

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


# 下面两组测试要的每个文件的解析结果：一个子进程解析一次（tests/background_runs.parsed），这个文件被导入时排队
PY_FILES = background_runs.python_files(ROOT)
background_runs.submit_parse(ROOT)


def parsed(rel):
    return background_runs.parsed(ROOT, rel)


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
