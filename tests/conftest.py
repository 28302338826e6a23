"""
pytest 的公共设置：把各讲的实验模块所在目录放到 sys.path 上；提供按路径加载编号脚本、运行脚本的工具。

编号脚本（NN_name.py）不能按名字 import：用 load_script 按文件路径加载（不运行 __main__ 部分）。
"""
import glob
import importlib.util
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAB_DIRS = ("lecture01", "lecture02", "lecture03", "lecture06", "prereq3")
for sub in LAB_DIRS:
    p = os.path.join(ROOT, sub)
    if p not in sys.path:
        sys.path.insert(0, p)


def numbered_scripts():
    """仓库里所有的编号脚本（相对路径，排好序）。新脚本一落地就被找到。"""
    found = glob.glob(os.path.join(ROOT, "*", "[0-9][0-9]_*.py"))
    return sorted(os.path.relpath(p, ROOT) for p in found)


def load_script(relpath):
    """按路径加载一个编号脚本，返回模块对象（不执行 if __name__ == "__main__" 的部分）。"""
    path = os.path.join(ROOT, relpath)
    name = "script_" + relpath.replace(os.sep, "_").replace(".py", "")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_script(relpath, cwd=None):
    """在 cwd（默认仓库根目录）里用 python3 运行脚本，返回 (退出码, stdout 字节, stderr 字节)。"""
    cwd = ROOT if cwd is None else cwd
    path = os.path.relpath(os.path.join(ROOT, relpath), cwd)
    # 两个脚本同时跑在两核机器上：每个进程的 BLAS 只用一个线程，免得线程互相抢核（小矩阵上多线程也不快）
    env = dict(os.environ, PYTHONHASHSEED="0", PYTHONIOENCODING="utf-8", OPENBLAS_NUM_THREADS="1",
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    r = subprocess.run([sys.executable, path], cwd=cwd, capture_output=True, env=env, timeout=120)
    return r.returncode, r.stdout, r.stderr


_OUTPUTS = {}


def script_run_pair(relpath):
    """
    一个编号脚本跑两次：一次在仓库根目录，一次在脚本自己的目录里（两核机器上两次同时跑）。
    结果缓存在这次 pytest 会话里，供各个测试共用：((退出码, stdout, stderr), (…))。只跑被要到的脚本。
    """
    if relpath not in _OUTPUTS:
        jobs = [(relpath, None), (relpath, os.path.join(ROOT, os.path.dirname(relpath)))]
        with ThreadPoolExecutor(max_workers=2) as ex:
            _OUTPUTS[relpath] = tuple(ex.map(lambda j: run_script(*j), jobs))
    return _OUTPUTS[relpath]


def script_stdout(relpath):
    """一个编号脚本（在仓库根目录运行时）打印的文字。"""
    code, out, err = script_run_pair(relpath)[0]
    assert code == 0, err.decode("utf-8", "replace")
    return out.decode("utf-8")
