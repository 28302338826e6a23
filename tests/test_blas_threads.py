"""
blas_threads：每个编号脚本的 BLAS 只用一个线程，学生设了 OPENBLAS_NUM_THREADS / OMP_NUM_THREADS / MKL_NUM_THREADS
时照他的。

子进程里的线程数用这里独立写的读法去问（和 ../shared 的检查一样：/proc/self/maps 里名字带 blas 的库，调它自己的
get_num_threads），不用 blas_threads 自己的函数；所以这些测试只在 Linux 上跑，找不到可读的 BLAS 时跳过。
"""
import ctypes
import os
import sys

import pytest

import background_runs
import blas_threads
from conftest import ROOT

THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

# 子进程：按路径加载一个编号脚本（不运行它的 __main__：只走一遍它的 import 顺序），再独立地读 BLAS 的线程数
CHILD = r"""
import ctypes, importlib.util, os, sys
rel = sys.argv[1]
path = os.path.join(sys.argv[2], rel)
sys.path.insert(0, os.path.dirname(path))
spec = importlib.util.spec_from_file_location("script_under_test", path)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
n = None
with open("/proc/self/maps") as f:
    libs = sorted({l.split()[-1] for l in f if "blas" in l.lower() and ".so" in l})
for lib in libs:
    L = ctypes.CDLL(lib)
    for sym in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_", "openblas_get_num_threads"):
        g = getattr(L, sym, None)
        if g is not None:
            n = g()
            break
    if n is not None:
        break
print(n, *[os.environ.get(k, "-") for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")])
"""

# 两个种子（先 import numpy，再 import 实验模块）和两个普通脚本（其中 03/02 在默认线程数下慢了 5–7 倍）
SCRIPTS = ["lecture06/04_spec_decode_speedup.py", "lecture05/05_heterogeneous_spec_decode.py",
           "lecture03/02_quantized_model_quality.py", "prereq3/01_float_formats.py"]


def cpus():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _submit(rel, **env_set):
    """排一个子进程进后台的队（tests/background_runs.py：这个文件被导入时就排，和别的测试同时跑）-> key。"""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    env.update(env_set)
    key = ("blas_threads", rel, tuple(sorted(env_set.items())))
    background_runs.submit(key, [sys.executable, "-c", CHILD, rel, ROOT], env=env, timeout=300)
    return key


def child(rel, **env_set):
    r = background_runs.result(_submit(rel, **env_set))
    assert r.returncode == 0, r.stderr.decode("utf-8", "replace")
    n, *vals = r.stdout.decode().split()
    if n == "None":
        pytest.skip("这个进程里找不到能读线程数的 OpenBLAS（别的 BLAS 或别的系统）")
    return int(n), vals


pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="独立的读法用 /proc/self/maps")

if sys.platform.startswith("linux"):        # 下面的测试要的子进程，按测试的顺序排队
    for _rel in SCRIPTS:
        _submit(_rel)
    if cpus() >= 2:
        for _var in THREAD_VARS[:2]:
            _submit("lecture06/04_spec_decode_speedup.py", **{_var: "2"})


@pytest.mark.parametrize("rel", SCRIPTS)
def test_a_script_runs_with_one_blas_thread_when_no_variable_is_set(rel):
    """回归：没设变量时，种子和不设线程的脚本用 BLAS 的默认线程数（这台 2 核机器上是 2），在忙的机器上慢好几倍。"""
    n, vals = child(rel)
    assert n == 1
    assert vals == ["1", "1", "1"]                       # 子进程继承同样的规则


@pytest.mark.skipif(cpus() < 2, reason="只有一个 CPU：BLAS 的默认线程数本来就是 1，看不出差别")
@pytest.mark.parametrize("var", THREAD_VARS[:2])
def test_a_thread_variable_the_student_set_is_respected(var):
    n, vals = child("lecture06/04_spec_decode_speedup.py", **{var: "2"})
    assert n == 2
    assert vals == ["2" if k == var else "-" for k in THREAD_VARS]    # 其余的变量也不替他设


def test_student_setting_counts_only_non_empty_variables():
    assert blas_threads.student_setting({}) == {}
    assert blas_threads.student_setting({"OMP_NUM_THREADS": "", "PATH": "/bin"}) == {}
    assert blas_threads.student_setting({"MKL_NUM_THREADS": "3"}) == {"MKL_NUM_THREADS": "3"}


def test_apply_rule_respects_a_set_variable_and_touches_nothing(monkeypatch):
    for k in THREAD_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    calls = []
    monkeypatch.setattr(blas_threads, "set_threads", lambda n: calls.append(n))
    assert blas_threads.apply_rule() is None
    assert calls == [] and "OPENBLAS_NUM_THREADS" not in os.environ and os.environ["OMP_NUM_THREADS"] == "4"


def test_apply_rule_sets_the_variables_and_one_thread_when_none_is_set(monkeypatch):
    for k in THREAD_VARS:
        monkeypatch.delenv(k, raising=False)
    calls = []
    monkeypatch.setattr(blas_threads, "set_threads", lambda n: calls.append(n))
    assert blas_threads.apply_rule() == 1
    assert calls == [1] and all(os.environ[k] == "1" for k in THREAD_VARS)


def test_apply_rule_never_raises(monkeypatch):
    for k in THREAD_VARS:
        monkeypatch.delenv(k, raising=False)

    def boom(n):
        raise OSError("no BLAS here")
    monkeypatch.setattr(blas_threads, "set_threads", boom)
    assert blas_threads.apply_rule() is None


def test_set_threads_changes_the_loaded_blas_and_reports_how_many_libraries():
    found = blas_threads.blas_libraries()
    if not found:
        pytest.skip("这个 numpy 的 BLAS 没有可设的线程数（例如 macOS 的 Accelerate）")
    before = [n for _, n in blas_threads.thread_counts()]
    try:
        assert blas_threads.set_threads(1) == len(found)
        assert [n for _, n in blas_threads.thread_counts()] == [1] * len(before)
    finally:
        for (_, setter, _), n in zip(found, before):
            setter(ctypes.c_int(n))


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_set_threads_rejects_a_non_positive_integer(bad):
    with pytest.raises(ValueError, match="正整数"):
        blas_threads.set_threads(bad)


def maps():
    with open("/proc/self/maps") as f:
        return f.read()


def test_opening_a_library_never_loads_a_new_one():
    """_open 用 RTLD_NOLOAD：只拿进程里已经装着的库，不会因为找库而装进别的库。"""
    import ctypes.util
    names = [ctypes.util.find_library(n) for n in ("sqlite3", "gdbm", "form", "panelw", "uuid", "bz2", "lzma")]
    names = [n for n in names if n is not None and n.split(".so")[0] not in maps()]
    if not names:
        pytest.skip("找不到一个没装进来的系统库来试")
    name = names[0]
    assert blas_threads._open(name) is None
    assert name.split(".so")[0] not in maps()


def test_console_applies_the_rule_on_import():
    """console 是每个编号脚本都 import 的模块：它 import blas_threads 并执行规则。"""
    with open(os.path.join(ROOT, "lecture01", "console.py"), encoding="utf-8") as f:
        src = f.read()
    assert "import blas_threads" in src and "blas_threads.apply_rule()" in src
