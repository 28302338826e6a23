"""
实验模块的形状（第 6 讲的拆分之后）：每个实验模块只做一件事、不超过约 500 行；解码不依赖量化；
种子 04 从 decode_lab 导入的九个名字都还在；conftest 把每个有实验模块的目录放到 sys.path 上。
能跑的工具（lecture05 的 serve.py、bench_serving.py）不是实验模块：没有模块 import 它们，它们有 main 和【运行】。
"""
import glob
import os
import re

import pytest

import background_runs
from conftest import LAB_DIRS, ROOT

MAX_LINES = 500
TOOLS = ("lecture05/serve.py", "lecture05/bench_serving.py", "lecture06/train_draft_heads.py")     # 能跑的工具：不是实验模块，也不是编号脚本
LABS = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "*", "*.py"))
              if not re.match(r"\d\d_", os.path.basename(p)) and not p.startswith(os.path.join(ROOT, "tests"))
              and os.path.relpath(p, ROOT) not in TOOLS)
background_runs.submit_parse(ROOT)          # 下面 docstring 的测试要的解析，导入时就排队


def test_every_lab_folder_is_on_the_test_path():
    assert sorted({os.path.dirname(p) for p in LABS}) == sorted(LAB_DIRS)


@pytest.mark.parametrize("rel", [p for p in LABS if p.split(os.sep)[0] in ("lecture02", "lecture05", "lecture06")])
def test_lab_is_at_most_about_500_lines(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        n = sum(1 for _ in f)
    assert n <= MAX_LINES, f"{rel} 有 {n} 行：按职责拆开"


@pytest.mark.parametrize("rel", LABS)
def test_lab_docstring_states_its_one_job(rel):
    """模块说明的第一行是"名字 —— 它做的一件事"。（docstring 取自一个子进程里的 ast.parse：background_runs.parsed）"""
    p = background_runs.parsed(ROOT, rel)
    assert p["error"] is None, p["error"]
    doc = p["doc"]
    name = os.path.basename(rel)[:-3]
    assert doc and doc.splitlines()[0].startswith(f"{name} —— "), rel


def test_lab_names_are_unique_across_folders():
    names = [os.path.basename(p) for p in LABS]
    assert len(names) == len(set(names))


def test_decoding_does_not_import_quantization():
    """decode_lab 的源码里连一个量化模块的名字都没有（函数里面也不行）。"""
    with open(os.path.join(ROOT, "lecture06", "decode_lab.py"), encoding="utf-8") as f:
        src = f.read()
    for mod in ("quant_lab", "numfmt", "quantize"):
        assert mod not in src, mod


def test_seed04_names_come_from_decode_lab():
    import decode_lab
    for name in ("NGramLM", "TransformerLM", "adjust", "autoregressive_generate", "best_gamma", "expected_tokens",
                 "ops_factor", "speculative_generate", "walltime_speedup"):
        assert callable(getattr(decode_lab, name)), name


@pytest.mark.parametrize("rel", TOOLS)
def test_tools_are_runnable_and_no_lab_or_script_imports_them(rel):
    """工具有 main、【运行】，从命令行跑；实验模块和编号脚本的源码里没有 import 它（测试和 09 按路径加载）。"""
    path = os.path.join(ROOT, rel)
    with open(path, encoding="utf-8") as f:
        src = f.read()
    doc = background_runs.parsed(ROOT, rel)["doc"]
    assert doc and os.path.basename(rel) in doc.splitlines()[1] and "【运行】" in doc
    assert 'if __name__ == "__main__":' in src and "def main(" in src
    name = os.path.basename(rel)[:-3]
    pattern = re.compile(rf"^\s*(import\s+{name}\b|from\s+{name}\s+import\b)", re.M)
    others = LABS + [os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "*", "[0-9][0-9]_*.py"))]
    for other in others:
        with open(os.path.join(ROOT, other), encoding="utf-8") as f:
            assert not pattern.search(f.read()), (other, name)
