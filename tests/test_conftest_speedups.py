"""
conftest 里两处只为测试集快的做法，结果必须和不用它们时一样：
- _handed_over：后台在子进程里装真实模型、经一个没有名字的文件传回测试进程。传回的参数、融合的模型和在这里直接装的逐位相同。
  同一个子进程接着算 compute_early 登记的参照（early_result 取）：算成的和在这里算的逐位相同，没算成的在这里算。
  这里用一个合成的小 GGUF（test_real_model_lab 写它的办法），不要下载。
- _rewrite_ahead：另一个进程先替 pytest 改写测试文件里的 assert。写出的缓存 pytest 认得（读得回来），内容和 pytest 自己
  改写的相同，而且 assert 确实改写过了（失败时消息里有各部分的值）。
另外两处设置（不改变任何结果，只是这里查它们确实生效了）：测试进程和它的子进程不让 numpy 给大数组要大页
（NUMPY_MADVISE_HUGEPAGE=0）；收集期间不做垃圾回收，收集完打开、把留下的对象冻结。
"""
import gc
import os
import sys

import numpy as np

import background_runs
import conftest
from decode_lab import TransformerLM
from real_model_lab import as_dtype, load_gguf
from test_real_model_lab import TOKS, _params, _write


def _same(a, b, where="params"):
    """两个嵌套的 dict / list / 数组逐位相同、dtype 相同。"""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), where


def test_the_model_handed_over_by_the_child_equals_a_load_here_and_so_do_its_early_jobs(tmp_path):
    """
    交回的参数、融合的模型和这里直接装的逐位相同。compute_early 的路也在这一个子进程里走：它交了模型（不等它退出）
    以后接着算 jobs，每个结果经管道交回（_collect_early 收）。算成的 == 在这里算的（这里 job 就是 smollm2_lm 本身，
    交回一个模型，前向逐位相同）；算错的交回错误的文字（early_result 会在测试进程里自己算）；收完子进程已经退出。
    """
    path = _write(tmp_path, _params(False), tied=False)
    good, bad = "smollm2_models:smollm2_lm", "smollm2_models:no_such_job"
    early = []
    got = conftest._handed_over(path, ["float64", "float32"], background=False, jobs=[good, bad], early=early)
    assert got is not None and len(early) == 2
    p32 = load_gguf(path, dtype=np.float32)
    p64 = as_dtype(p32, np.float64)
    _same(got["real"]["float32"][0], p32[0])
    _same(got["real"]["float64"][0], p64[0])
    assert got["real"]["float64"][1] == p64[1] and got["real"]["float32"][1] == p32[1]
    assert got["real"]["float64"][2] is got["real"]["float32"][2]          # 分词器两种 dtype 共用一个（as_dtype 那样）
    for dt, (P, cfg, _) in (("float64", p64), ("float32", p32)):
        lm, lm_cfg, tok = got["lm"][dt]
        assert lm_cfg == cfg and tok.encode("abc") == p32[2].encode("abc")
        assert np.array_equal(lm.forward(TOKS), TransformerLM(P, cfg).forward(TOKS)), dt
        lm.params["final_norm"][0] += 1.0                                    # 映射是写时复制的：数组可以写
    assert got["real"]["float64"][0]["embed"].flags.writeable
    child, r = early
    assert child in conftest._EARLY_CHILD
    conftest._collect_early(child, r, [good, bad])
    assert child.poll() == 0 and child not in conftest._EARLY_CHILD
    (ok1, lm), (ok2, err) = conftest._EARLY.pop(good), conftest._EARLY.pop(bad)
    assert ok1 and not ok2 and "AttributeError" in err
    assert np.array_equal(lm[0].forward(TOKS), TransformerLM(p64[0], p64[1]).forward(TOKS))


def _job():
    _job.calls += 1
    return "here"


def test_early_result_takes_the_childs_value_waits_for_a_pending_one_and_otherwise_computes_here():
    import threading
    key = conftest._early_key(_job)
    _job.calls = 0
    conftest._EARLY[key] = (True, "child")                   # 子进程交了：拿它的，不在这里算
    assert conftest.early_result(_job) == "child" and _job.calls == 0
    assert conftest.early_result(_job) == "here" and _job.calls == 1      # 只拿一次；再要就在这里算
    conftest._EARLY[key] = (False, "AttributeError: x")      # 子进程算错了：在这里算（错误报在测试上）
    assert conftest.early_result(_job) == "here" and _job.calls == 2
    with conftest._EARLY_COND:                                # 还在算：等它交
        conftest._EARLY_PENDING.add(key)

    def deliver():
        with conftest._EARLY_COND:
            conftest._EARLY[key] = (True, "late")
            conftest._EARLY_PENDING.discard(key)
            conftest._EARLY_COND.notify_all()
    t = threading.Timer(0.05, deliver)
    t.start()
    assert conftest.early_result(_job) == "late" and _job.calls == 2
    t.join()
    with conftest._EARLY_COND:                                # 交不出（子进程死了，_collect_early 放弃）：在这里算
        conftest._EARLY_PENDING.add(key)
    threading.Timer(0.05, conftest._collect_early, (None, None, [key])).start()
    assert conftest.early_result(_job) == "here" and _job.calls == 3


def test_a_failing_child_hands_over_nothing(tmp_path):
    bad = tmp_path / "not.gguf"
    bad.write_bytes(b"not a gguf file")
    assert conftest._handed_over(str(bad), ["float64"], background=False) is None


def test_the_assert_rewriting_done_ahead_is_read_back_and_equals_pytests_own(tmp_path, monkeypatch):
    from pathlib import Path

    from _pytest.assertion.rewrite import PYC_TAIL, _read_pyc, _rewrite_test, get_cache_dir
    src = tmp_path / "test_sample.py"
    src.write_text("def test_x():\n    a = [1, 2]\n    assert a == [1, 3]\n", encoding="utf-8")
    monkeypatch.setattr(sys, "pycache_prefix", None)
    prefix = tmp_path / "pyc"
    conftest._rewrite_ahead(str(prefix), [str(src)])
    assert sys.pycache_prefix == str(prefix)
    fn = Path(os.path.abspath(src))
    pyc = get_cache_dir(fn) / (fn.name[:-3] + PYC_TAIL)
    assert str(pyc).startswith(str(prefix))
    co = _read_pyc(fn, pyc, lambda *a: None)          # pytest 收集时就这样读：源文件的时间、大小、版本都对得上才用
    assert co is not None
    assert co == _rewrite_test(fn, None)[1]
    ns = {}
    exec(co, ns)
    try:
        ns["test_x"]()
    except AssertionError as e:
        assert "[1, 2] == [1, 3]" in str(e)            # 改写过的 assert：消息里有两边的值（没改写的消息是空的）
    else:
        raise AssertionError("test_x 应该失败")


def test_the_end_of_the_session_kills_a_child_still_loading_and_an_orphan_stops_by_itself(tmp_path):
    """
    会话结束时（pytest_unconfigure）后台还在装模型的子进程被结束，不会留下（它最低优先级，忙的机器上可能还要跑好几分钟、
    占着几 GB 内存）；测试进程被杀了的话，子进程每装完一步自己发现（父进程的 pid 变了）就退出。
    两件事都在一个单独的 Python 进程里做（pytest_unconfigure 会让这个会话的后台装载停下）。
    """
    import subprocess
    here = os.path.dirname(os.path.abspath(__file__))
    code = ("import subprocess, sys, conftest\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "e = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "conftest._PREFETCH_CHILD.append(c)\n"
            "conftest._EARLY_CHILD.append(e)\n"                  # 交了模型、还在提前算参照的
            "conftest.pytest_unconfigure(None)\n"
            "print(c.wait(timeout=10), e.wait(timeout=10))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=here, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.split() == ["-9", "-9"], r.stderr
    path = _write(tmp_path, _params(True))
    fd = os.open(tmp_path / "out", os.O_RDWR | os.O_CREAT)
    try:
        code = f"import conftest; conftest._build_for_parent({path!r}, ['float64'], {fd}, 1)"   # 父进程"是" pid 1：不是它
        r = subprocess.run([sys.executable, "-c", code], cwd=here, pass_fds=(fd,), capture_output=True, timeout=60)
        assert r.returncode == 1 and os.fstat(fd).st_size == 0, r.stderr
    finally:
        os.close(fd)


def _madvise_hugepage():
    """numpy 现在给大数组要不要大页 -> bool（numpy 2.x 在 numpy._core，1.2x 在 numpy.core）。"""
    try:
        from numpy._core.multiarray import _get_madvise_hugepage
    except ImportError:
        from numpy.core.multiarray import _get_madvise_hugepage
    return bool(_get_madvise_hugepage())


HUGEPAGE_CHILD = ("try:\n    from numpy._core.multiarray import _get_madvise_hugepage as g\n"
                  "except ImportError:\n    from numpy.core.multiarray import _get_madvise_hugepage as g\n"
                  "print(bool(g()))")
HUGEPAGE_KEY = ("test_conftest_speedups", "huge pages in a child")
background_runs.submit(HUGEPAGE_KEY, [sys.executable, "-c", HUGEPAGE_CHILD])     # 导入时排进后台的队


def test_numpy_asks_for_no_huge_pages_here_and_in_the_children():
    """conftest 在 numpy 装进来之前设 NUMPY_MADVISE_HUGEPAGE=0（用户已经设了的照他的）：测试进程里 numpy 不要大页，
    子进程继承这个变量（Linux 以外 numpy 本来就不要）。"""
    want = os.environ["NUMPY_MADVISE_HUGEPAGE"] != "0" and sys.platform.startswith("linux")
    assert _madvise_hugepage() == want
    r = background_runs.result(HUGEPAGE_KEY)
    assert r.returncode == 0, r.stderr.decode("utf-8", "replace")
    assert r.stdout.decode().strip() == str(want)


def test_collection_leaves_the_garbage_collector_on_with_the_collected_objects_frozen():
    """收集期间关掉的垃圾回收，收集完打开了；收集留下的对象冻结了（之后的回收不再扫它们）。"""
    assert gc.isenabled()
    assert gc.get_freeze_count() > 10_000
