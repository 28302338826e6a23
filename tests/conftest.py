"""
pytest 的公共设置：把各讲的实验模块所在目录放到 sys.path 上；提供按路径加载编号脚本、运行脚本的工具。

编号脚本（NN_name.py）不能按名字 import：用 load_script 按文件路径加载（不运行 __main__ 部分）。
"""
import os

# 测试里的矩阵都很小：多线程的 BLAS 在两核机器上别的进程也在跑时反而慢好几倍，所以整个测试进程只用一个线程。
# 必须在任何模块 import numpy 之前设（conftest 最先被加载）；已经设了的环境变量不动。
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
# numpy 在 Linux 上给每个 ≥ 4 MB 的新数组 madvise(MADV_HUGEPAGE)。内核的 THP defrag 是 madvise（上游的默认）时，这样的
# 内存第一次写入就可能当场整理内存去凑 2 MB 的大页；整理不出来（内存碎了）也要先试一遍。测试集一次次新建、释放几百 MB
# 的数组（float64 的 SmolLM2、worker 进程装模型），在一台这样的机器（2 核的虚拟机，AnonHugePages 始终是 0）上，新建
# 两个 400 MB 的数组要 0.5–7.3 秒，关掉只要 0.3 秒。测试进程和它起的所有子进程（脚本、worker）都关掉（numpy 在 import
# 时读这个变量）；已经设了的不动。学生直接运行编号脚本时不设它（seed 04 用不到几百 MB 的数组：在这台机器上设不设
# 都是 3.9–4.2 秒，交替各量三次）。
os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")

import faulthandler  # noqa: E402
import gc  # noqa: E402
import glob  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import pickle  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAB_DIRS = ("lecture01", "lecture02", "lecture03", "lecture05", "lecture06", "prereq3")  # 每个有实验模块的目录
for sub in LAB_DIRS:
    p = os.path.join(ROOT, sub)
    if p not in sys.path:
        sys.path.insert(0, p)


# 每个测试的时间上限：一个卡死的循环（例如一个永远不释放块的分配器）让测试集失败，而不是挂住。
# 只用标准库：到时间 faulthandler 打印所有线程的调用栈并结束进程（pytest 随之失败）。上限要比最慢的真实测试
# （两个真实模型的脚本同时跑）宽得多；CS349E_TEST_TIMEOUT（秒）可以改它。
TEST_TIMEOUT = float(os.environ.get("CS349E_TEST_TIMEOUT", "600"))


_REAL_STDERR = []


def pytest_configure(config):
    """记下真正的 stderr（pytest 捕获输出时 fd 2 指向临时文件，超时的调用栈写到那里就看不见了）；_rewrite_ahead。"""
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        capman.suspend_global_capture(in_=False)
    try:
        _REAL_STDERR.append(os.fdopen(os.dup(2), "w"))
    finally:
        if capman is not None:
            capman.resume_global_capture()
    _start_rewrite_ahead(config)
    import background_runs
    background_runs.hold()      # 收集时不起后台的子进程（收集完 release：pytest_collection_finish）
    gc.disable()         # 收集期间不做垃圾回收（pytest_collection_finish 再打开）：见 _collect_without_gc


def _collect_without_gc():
    """
    收集完：打开垃圾回收，回收一次，再把留下的对象（模块、测试项、fixture 的定义，整个会话都在）冻结（gc.freeze），
    之后的回收不再一遍遍地扫它们。收集要改写一百多个测试文件里的 assert、建两千多个测试项，造出大量对象：开着回收时
    它在收集期间跑十来次完整的回收（约 1.4 秒，测试进程的 gc.callbacks 量的），而收集时造的几乎都不是要回收的环。
    """
    gc.enable()
    gc.collect()
    gc.freeze()


_AHEAD = []     # [(子进程, 临时目录)]：_start_rewrite_ahead 起的


def _start_rewrite_ahead(config):
    """
    pytest 导入每个测试文件之前要改写里面的 assert（为了失败时打印各部分的值），改写好的代码平时缓存在 __pycache__ 里，
    下一次直接用。设了 PYTHONDONTWRITEBYTECODE（sys.dont_write_bytecode）时它不写缓存，每次收集都要重新改写一百多个
    测试文件（约 3 秒，测试进程一个核上）。这时在另一个核上起一个子进程（_rewrite_ahead），从最后一个文件往前改写、
    写进一个临时目录（sys.pycache_prefix 指向它，会话结束删掉，不在仓库里留任何文件）；pytest 从第一个文件往后收集，
    遇到子进程已经写好的就直接读（pytest 核对源文件的修改时间和大小、pytest 的版本，对不上就自己改写），两边在中间碰头。
    改写的结果和 pytest 自己改写的完全相同（同一个函数、同样的设置）。没设 PYTHONDONTWRITEBYTECODE、没用 assert 改写
    （--assert=plain）、或者这台机器不支持时什么都不做：pytest 照常自己改写。
    """
    if not sys.dont_write_bytecode or sys.pycache_prefix or config.getoption("assertmode", "rewrite") != "rewrite":
        return
    here = os.path.dirname(os.path.abspath(__file__))
    wanted = set()                       # 这次命令行选中的测试文件（给的是目录：它下面的；给的是文件：只它）
    for arg in config.args:
        path = os.path.abspath(os.path.join(str(config.invocation_params.dir), arg.split("::")[0]))
        wanted.update(glob.glob(os.path.join(path, "test_*.py")) if os.path.isdir(path) else [path])
    files = sorted((f for f in glob.glob(os.path.join(here, "test_*.py")) if f in wanted), reverse=True)
    if len(files) < 2:
        return
    prefix = tempfile.mkdtemp(prefix="cs349e-pyc-")
    # 子进程只改写、不留对象：不做垃圾回收（和收集时的测试进程一样，见 _collect_without_gc）
    code = f"import gc; gc.disable(); import conftest; conftest._rewrite_ahead({prefix!r}, {files!r})"
    try:
        child = subprocess.Popen([sys.executable, "-c", code], cwd=here, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        os.rmdir(prefix)
        return
    _AHEAD.append((child, prefix))
    sys.pycache_prefix = prefix


_CLOSING = []    # pytest_unconfigure 之后非空：后台装模型的线程不再做任何事


def pytest_unconfigure(config):
    """后台装模型的子进程（_handed_over）、_start_rewrite_ahead 的子进程还在就结束它们，删掉临时目录。"""
    import shutil
    _CLOSING.append(True)
    for child in list(_PREFETCH_CHILD) + list(_EARLY_CHILD):
        child.kill()                         # 后台线程收它（wait）；传模型的文件没有名字，不留下什么
    while _AHEAD:
        child, prefix = _AHEAD.pop()
        if child.poll() is None:
            child.kill()
        child.wait()
        if sys.pycache_prefix == prefix:
            sys.pycache_prefix = None
        shutil.rmtree(prefix, ignore_errors=True)


def _rewrite_ahead(prefix, files):
    """_start_rewrite_ahead 起的子进程里：按 files 的顺序改写（pytest 的 assert 改写），写到 prefix 下 pytest 找它的地方。"""
    sys.pycache_prefix = prefix
    from pathlib import Path

    from _pytest.assertion.rewrite import PYC_TAIL, _rewrite_test, _write_pyc, get_cache_dir

    class _Quiet:
        def trace(self, *args):
            pass

    for fn in map(Path, files):
        pyc = get_cache_dir(fn) / (fn.name[:-3] + PYC_TAIL)
        if pyc.exists():
            continue
        pyc.parent.mkdir(parents=True, exist_ok=True)
        stat, co = _rewrite_test(fn, None)
        _write_pyc(_Quiet(), co, stat, pyc)


_SESSION_START = []
_PAIR_SECONDS = {}      # 编号脚本 -> 它那一对运行花的秒数（script_run_pair 记的）


def pytest_sessionstart(session):
    _SESSION_START.append(time.perf_counter())


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """给了 --durations 时，另外打印编号脚本成对运行一共花了多久、其余的测试花了多久（看测试集慢在哪一边）。"""
    if config.getoption("durations", None) is None or not _SESSION_START:
        return
    import resource
    total = time.perf_counter() - _SESSION_START[0]
    pairs = sum(_PAIR_SECONDS.values())
    me, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    terminalreporter.write_line(f"编号脚本成对运行 {len(_PAIR_SECONDS)} 个：{pairs:.1f} 秒；其余：{total - pairs:.1f} 秒；"
                                f"共 {total:.1f} 秒（墙钟）。CPU 时间：测试进程 {me.ru_utime + me.ru_stime:.1f} 秒，"
                                f"子进程（脚本等）{kids.ru_utime + kids.ru_stime:.1f} 秒")
    for rel, sec in sorted(_PAIR_SECONDS.items(), key=lambda t: -t[1]):
        terminalreporter.write_line(f"  {sec:7.1f} 秒  {rel}")


_ARMED = [None]          # 上一次给 faulthandler 上弦的时刻（time.monotonic）


_TAIL_STARTERS = []      # 用真实模型的那组测试开始时要调用的函数（at_real_model_tail 登记的）


def at_real_model_tail(fn):
    """
    登记 fn(session)：在测试进程里用真实模型的那组测试（pytest_collection_modifyitems 把它们排在最后）的第一个开始时调用，
    一次。给要起装真实模型的 worker 的测试文件用：worker 在这组前面的测试跑的时候装（那时测试进程只占一个核，另一个核
    常空着），轮到那个文件时已经装好；也不在整个测试集里一直占着内存。fn 自己判断这次选没选中要它的测试；出了错什么
    都不做（那个测试到时自己起）。
    """
    _TAIL_STARTERS.append(fn)


def pytest_runtest_setup(item):
    """
    每个测试开始时重新上弦（TEST_TIMEOUT 秒后打印调用栈、结束进程）。上弦要起一个看门的线程、取消要等它退出（每次约
    0.2 ms，两千多个测试就是半秒），所以离上一次上弦不到 1 秒时不再重上：任何一个测试最多 TEST_TIMEOUT + 1 秒后被结束。
    用真实模型的那组测试的第一个开始时，调用 at_real_model_tail 登记的函数。
    """
    if _TAIL_STARTERS and _real_model_dtypes(getattr(item, "module", None)):
        starters, _TAIL_STARTERS[:] = list(_TAIL_STARTERS), []
        for fn in starters:
            try:
                fn(item.session)
            except Exception:   # noqa: BLE001 —— 见 at_real_model_tail
                pass
    now = time.monotonic()
    if _ARMED[0] is None or now - _ARMED[0] > 1.0:
        out = _REAL_STDERR[0] if _REAL_STDERR else sys.stderr
        faulthandler.dump_traceback_later(TEST_TIMEOUT, exit=True, file=out)
        _ARMED[0] = now


def pytest_sessionfinish(session, exitstatus):
    faulthandler.cancel_dump_traceback_later()


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


class _Unwrapped(str):
    """unwrap 的结果：一个普通的 str，只是 `in` / `not in` 不看空白。"""

    def __contains__(self, needle):
        return "".join(needle.split()) in "".join(self.split())


def unwrap(text):
    """
    把观察的折行接回去（续行的 5 个空格缩进去掉），-> 一个 str；它的 `in` / `not in` 两边都不看空白：
    console 可能在空格处折行（那个空格就丢了），改一个字、折行挪了位置，断言也不受影响。
    """
    return _Unwrapped(text.replace("\n     ", ""))


def run_script(relpath, cwd=None, console_log=None, results=None):
    """
    在 cwd（默认仓库根目录）里用 python3 运行脚本，返回 (退出码, stdout 字节, stderr 字节)。
    console_log 给了路径时，console 把它打印的每一块另外记到那个文件（见 console 的模块说明；打印的内容不变）；
    results 给了路径时，调用 console.save_results 的脚本把演示返回的数存进那个文件。
    """
    cwd = ROOT if cwd is None else cwd
    path = os.path.relpath(os.path.join(ROOT, relpath), cwd)
    # 两个脚本同时跑在两核机器上：每个进程的 BLAS 只用一个线程，免得线程互相抢核（小矩阵上多线程也不快）
    env = dict(os.environ, PYTHONHASHSEED="0", PYTHONIOENCODING="utf-8", OPENBLAS_NUM_THREADS="1",
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("CS349E_CONSOLE_LOG", None)
    env.pop("CS349E_RESULTS", None)
    if console_log:
        env["CS349E_CONSOLE_LOG"] = console_log
    if results:
        env["CS349E_RESULTS"] = results
    r = subprocess.run([sys.executable, path], cwd=cwd, capture_output=True, env=env, timeout=600)
    return r.returncode, r.stdout, r.stderr


# ---------------------------------------------------------------------------
# 真实模型（SmolLM2-135M-Instruct，第 2 讲 real_model_lab）：整个测试会话只找 / 下载一次
# ---------------------------------------------------------------------------
REQUIRE_ENV = "CS349E_REQUIRE_MODEL"   # .ci/run 设成 1：拿不到模型文件就是失败，不是跳过
_REAL = {}


def real_model_path():
    """
    真实模型文件的路径（hub_lab.gguf_path：CS349E_GGUF，否则缓存，否则第一次用时下载）-> str。

    拿不到（离线）时：设了 CS349E_REQUIRE_MODEL=1 就让测试失败，否则跳过，消息里有下载的命令。
    在启动任何脚本之前调用，所以同时跑的两个脚本不会抢着下载，下载那一行 stderr 也不会出现在脚本的输出里。
    """
    import pytest
    if "path" not in _REAL:
        from hub_lab import ModelUnavailableError, gguf_path
        try:
            _REAL["path"] = gguf_path()
        except ModelUnavailableError as e:
            _REAL["path"] = None
            _REAL["why"] = str(e)
    if _REAL["path"] is None:
        msg = "真实模型的文件拿不到，这个测试需要它：\n" + _REAL["why"]
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return _REAL["path"]


def smollm2_path():
    """同 real_model_path，但只给 SmolLM2 本身（哈希核对）：数字钉死在 SmolLM2 上的测试用它；CS349E_GGUF 指向别的文件时跳过。"""
    import pytest
    from hub_lab import is_smollm2
    path = real_model_path()
    if not is_smollm2(path):
        pytest.skip(f"{path} 不是课程的 SmolLM2-135M-Instruct 文件（sha256 不同）：钉死在 SmolLM2 上的数字不适用")
    return path


def real_model(dtype="float64"):
    """
    装好的真实模型 -> (params, cfg, tokenizer)，每种 dtype 整个会话只装一次（float64 约 1 GB）。
    文件只读一次、按 float32 装（比直接装 float64 快一倍）；float64 由 real_model_lab.as_dtype 从它转过来——和
    load_gguf(dtype=float64) 逐位相同（见 as_dtype 的说明；test_real_model_lab 核对）。分词器两种 dtype 共用。
    """
    return _real_model(real_model_path(), dtype)


_PREFETCH_CHILD = []     # 正在后台装模型的子进程（Popen；_handed_over；最低的优先级，有测试等它时调回前台）


class _ModelLock:
    """一把可重入的锁；拿锁之前，要是后台还在装模型（_PREFETCH_CHILD），先把那个子进程调回前台：有测试在等它了。"""

    def __init__(self):
        self._lock = threading.RLock()

    def __enter__(self):
        if _PREFETCH_CHILD:
            from proc_util import foreground
            foreground([c.pid for c in _PREFETCH_CHILD])
        self._lock.acquire()
        return self

    def __exit__(self, *exc):
        self._lock.release()


REAL_LOCK = _ModelLock()   # 后台预装（_prefetch）和测试同时要模型时，只装一次


def _real_model(path, dtype):
    import numpy as np
    from real_model_lab import as_dtype, load_gguf
    with REAL_LOCK:
        if dtype not in _REAL:
            if "float32" not in _REAL:
                _REAL["float32"] = load_gguf(path, dtype=np.float32)
            _REAL[dtype] = as_dtype(_REAL["float32"], np.dtype(dtype))
    return _REAL[dtype]


def _real_model_dtypes(module, _seen={}):
    """一个测试模块在测试进程里用真实模型吗：它的源码里有 smollm2_lm( / real_model( -> 它要的 dtype 的集合（不用：空集）。"""
    path = getattr(module, "__file__", None)
    if path not in _seen:
        try:
            with open(path, encoding="utf-8") as f:
                src = f.read()
        except (OSError, TypeError):
            src = ""
        wants = {"float64"} if "smollm2_lm(" in src or "real_model(" in src else set()
        if 'smollm2_lm("float32")' in src:
            wants.add("float32")
        _seen[path] = wants
    return _seen[path]


def pytest_collection_modifyitems(session, config, items):
    """
    在测试进程里用真实模型的测试文件排到最后（各文件内部、两组各自的先后不变）：收集完后台就开始装模型
    （pytest_collection_finish），先跑的玩具测试不用它，装好之前没有测试要等。测试之间不靠先后（每个测试自己拿它要的东西）。
    """
    items.sort(key=lambda item: bool(_real_model_dtypes(getattr(item, "module", None))))


def pytest_collection_finish(session):
    """
    选中的测试里有用真实模型的（_real_model_dtypes）、模型文件已经在本机：收集完就在后台（_prefetch）把 float32、float64 的
    参数和 float64 的融合模型（smollm2_models.smollm2_lm）装好。测试要模型时拿 REAL_LOCK：装到一半就等它装完，装好了直接用。
    后台出了任何错都不管：测试自己再装一次，错误照常报在测试上。不下载（文件不在本机时什么都不做）。
    """
    _collect_without_gc()
    import background_runs
    background_runs.release()
    if session.config.option.collectonly:
        return
    wants = set()
    for mod in {getattr(item, "module", None) for item in session.items} - {None}:
        wants |= _real_model_dtypes(mod)
    if not wants:
        return
    from hub_lab import ModelUnavailableError, gguf_path
    try:
        path = gguf_path(fetch=False)
    except ModelUnavailableError:
        return
    if path:
        mods = {getattr(item.module, "__name__", None) for item in session.items if getattr(item, "module", None)}
        jobs = [key for key, mod in _EARLY_JOBS if mod in mods]
        with _EARLY_COND:
            _EARLY_PENDING.update(jobs)
        threading.Thread(target=_prefetch, args=(path, sorted(wants, reverse=True), jobs), name="real-model-prefetch",
                         daemon=True).start()


def _prefetch(path, dtypes, jobs=()):
    """
    后台线程：拿着 REAL_LOCK，在一个子进程里（_build_for_parent）装好参数、建好融合的模型，经一个没有名字的文件传回来
    （_handed_over）。装模型的活大半是 numpy 的小运算和 Python，放在测试进程的线程里会和主线程抢 GIL（前面的玩具测试
    因此慢一截）；子进程在另一个核上算，测试进程只映射它写好的数组（不复制）。传回的和这里直接装的逐位相同：同一段代码、
    同一个文件，数组按原样的字节传。不能传（没有 pass_fds 的系统）或者子进程失败时，就在这个线程里照旧装。
    jobs：compute_early 登记的函数（这次选中的模块的）。模型交过来以后，子进程接着算它们，这个线程收结果（_collect_early）。
    """
    early = []                               # 还在算 jobs 的子进程和读结果的管道（_handed_over 交出的）
    try:
        with REAL_LOCK:
            got = _handed_over(path, dtypes, jobs=jobs, early=early) if os.name == "posix" else None
            if _CLOSING:                     # 会话已经结束（pytest_unconfigure 结束了子进程）：什么都不再装
                return
            if got is not None:
                from smollm2_models import _LM
                for key, val in got["real"].items():
                    _REAL.setdefault(key, val)
                for key, val in got["lm"].items():
                    _LM.setdefault(key, val)
            from smollm2_models import smollm2_lm
            for dt in dtypes:                # "float64" 先（用它的测试多）
                _real_model(path, dt)
                smollm2_lm(dt)
    except Exception:   # noqa: BLE001 —— 见 pytest_collection_finish 的说明
        pass
    finally:
        _collect_early(*(early or [None, None]), jobs)


def _handed_over(path, dtypes, background=True, jobs=(), early=None):
    """
    在子进程里装模型（_build_for_parent；background：子进程的优先级调到最低），-> 它装好的 {"real": {dtype: (params, cfg, tok)}, "lm": {dtype: smollm2_lm 的结果}}，
    子进程失败时 -> None。

    传的办法：这里先建一个临时文件、打开、马上删掉名字（Linux 上建在 /dev/shm，内存里），把打开的文件描述符交给子进程；
    子进程把所有数组的字节（pickle 协议 5 的带外缓冲区）和其余部分的 pickle 写进去。这里把文件映射进来（写时复制：
    测试改了哪个数组，只改自己的那一份），数组直接指向映射的内存。文件没有名字，谁退出都不会留下它：最后一个描述符和
    映射一关，内存就还回去。子进程写完文件，在一条管道上说一声 "model"，这里就映射（不等它退出）。
    jobs（compute_early 的 key）：子进程交了模型以后接着算它们，每算完一个就把结果的 pickle 写进同一条管道；这时
    early（一个空 list）里放上 [子进程, 管道读的一头]，由调用者交给 _collect_early 去收。没有 jobs：等子进程退出。
    """
    import mmap
    import pickle
    import select
    shm = "/dev/shm"
    fd, name = tempfile.mkstemp(prefix="cs349e-model-", dir=shm if os.path.isdir(shm) else None)
    r, w = os.pipe()
    handed = False
    try:
        os.unlink(name)
        from proc_util import popen_background
        code = (f"import conftest; conftest._build_for_parent({path!r}, {list(dtypes)!r}, {fd}, {os.getpid()}, "
                f"{w}, {list(jobs)!r})")
        start = popen_background if background else subprocess.Popen
        child = start([sys.executable, "-c", code], cwd=os.path.dirname(os.path.abspath(__file__)),
                      pass_fds=(fd, w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(w)
        w = None
        _PREFETCH_CHILD.append(child)
        try:
            said = b""
            while not said.endswith(b"\n") and len(said) < 64 and select.select([r], [], [], 600)[0]:
                part = os.read(r, 1)                 # 一个字节一个字节地读到换行：后面的结果留给 _collect_early
                if not part:
                    break
                said += part
        finally:
            _PREFETCH_CHILD.clear()
        if said != b"model\n" or os.fstat(fd).st_size == 0:
            child.kill()
            child.wait()
            return None
        if jobs and early is not None:
            early[:] = [child, r]
            _EARLY_CHILD.append(child)
            handed = True
        elif child.wait(timeout=600) != 0:
            return None
        mm = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)
        for end in (w, None if handed else r):
            if end is not None:
                os.close(end)
    import numpy as np
    np.frombuffer(mm, dtype=np.uint8)[::mmap.PAGESIZE].max()   # 每页读一个字节：在这个后台线程里（numpy 放开 GIL）
    view = memoryview(mm)                                      # 把页映射好，测试第一次用这些数组时不再一页一页地缺页
    where, n_bufs = (int(x) for x in bytes(view[:64]).split())   # 开头 64 字节：目录在哪、有几个数组
    table = pickle.loads(view[where:])      # 目录：每个数组的 (偏移, 字节数)，最后一项是对象本身的 pickle 的
    bufs = [view[o:o + n] for o, n in table[:n_bufs]]
    (o, n), = table[n_bufs:]
    return pickle.loads(view[o:o + n], buffers=bufs)


def _build_for_parent(path, dtypes, fd, parent, said=None, jobs=()):
    """
    _handed_over 起的子进程里：装好 path 的 float32 / dtypes 的参数和融合的模型，写进文件描述符 fd（格式见 _handed_over），
    在管道 said 上写 "model\n"；再一个个算 jobs（compute_early 登记的函数，"模块:函数名"），每个的
    (key, 成没成, 结果或出错的文字) 的 pickle 写进同一条管道。
    parent：测试进程的 pid。每装完一步、每算完一个看一眼它还在不在（被杀了的话这个进程归了别人，getppid 变了）：不在就退出。
    """
    import pickle
    from smollm2_models import _LM, smollm2_lm

    def orphaned():
        if os.getppid() != parent:
            sys.exit(1)

    _REAL["path"] = path
    for dt in dtypes:
        orphaned()
        smollm2_lm(dt)
    orphaned()
    obj = {"real": {k: _REAL[k] for k in ("float32", *dtypes)}, "lm": {dt: _LM[dt] for dt in dtypes}}
    bufs = []
    body = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
    with os.fdopen(fd, "wb", closefd=False) as f:
        f.seek(64)
        table = []
        for b in bufs:
            raw = b.raw()
            f.seek(-f.tell() % 64, 1)                    # 每个数组从 64 字节对齐的地方开始
            table.append((f.tell(), raw.nbytes))
            f.write(raw)
        table.append((f.tell(), len(body)))
        f.write(body)
        where = f.tell()
        f.write(pickle.dumps(table))
        f.seek(0)
        f.write(f"{where} {len(bufs)}".encode().ljust(64))
    if said is None:
        return
    with os.fdopen(said, "wb") as out:
        out.write(b"model\n")
        out.flush()
        for key in jobs:
            orphaned()
            try:
                mod, name = key.split(":")
                item = (key, True, getattr(importlib.import_module(mod), name)())
            except Exception as e:   # noqa: BLE001 —— 测试进程自己再算一次，错误照常报在测试上
                item = (key, False, f"{type(e).__name__}: {e}")
            pickle.dump(item, out, protocol=5)
            out.flush()


# ---------------------------------------------------------------------------
# 提前算：用真实模型的测试要的参照，后台装模型的子进程交了模型以后接着算
# ---------------------------------------------------------------------------
_EARLY_JOBS = []                    # [(key, 登记它的模块名)]：compute_early 登记的，按登记的先后
_EARLY = {}                         # key -> (成没成, 结果)：子进程交回来的
_EARLY_PENDING = set()              # 交给了子进程、还没交回来的 key
_EARLY_CHILD = []                   # 正在算的子进程
_EARLY_COND = threading.Condition()


def _early_key(fn):
    return f"{fn.__module__}:{fn.__name__}"


def compute_early(fn):
    """
    登记 fn（测试模块里的一个顶层函数，不带参数，要模型时自己调 smollm2_models.smollm2_lm；它所在的模块要能在别的进程里
    再 import 一次，导入时不起进程）。这次选中了登记它的模块、模型文件在本机时，后台装真实模型的子进程（_prefetch）把
    模型交给测试进程以后，接着在它自己那里算 fn()、把结果交回来（early_result 取）。
    为什么：子进程这时已经装着同一份模型（融合好的 float64，同一段代码建的），算出的和测试进程里算的逐位相同；
    它在后台（最低的优先级）算，那时测试进程在跑前面不用真实模型的测试，另一个核常空着；轮到用真实模型的测试时，
    参照已经算好了。在测试模块导入时（收集时）调用，返回 fn。
    """
    _EARLY_JOBS.append((_early_key(fn), fn.__module__))
    return fn


def early_result(fn):
    """
    fn() 的值：子进程已经算好的直接拿（只拿一次）；它还在算的，把它调回前台、等它交；它没算、算错了、
    没有子进程：在这里调用 fn()（错误照常报在调用的测试上）。
    """
    key = _early_key(fn)
    with _EARLY_COND:
        while key in _EARLY_PENDING and key not in _EARLY:
            from proc_util import foreground
            foreground([c.pid for c in _PREFETCH_CHILD + _EARLY_CHILD])   # 还在装模型的也算：测试在等它了
            _EARLY_COND.wait(1.0)
        got = _EARLY.pop(key, None)
    if got is not None and got[0]:
        return got[1]
    return fn()


def _collect_early(child, r, keys):
    """
    _prefetch 的线程里：从管道 r 一个个收子进程算好的结果，直到它关上管道；最后收掉子进程，keys 里没交的不再等
    （early_result 在测试进程里自己算）。
    """
    import pickle
    try:
        if r is not None:
            with os.fdopen(r, "rb") as f:
                while True:
                    try:
                        key, ok, value = pickle.load(f)
                    except (EOFError, pickle.UnpicklingError, OSError):
                        break
                    with _EARLY_COND:
                        _EARLY[key] = (ok, value)
                        _EARLY_PENDING.discard(key)
                        _EARLY_COND.notify_all()
    finally:
        with _EARLY_COND:
            _EARLY_PENDING.difference_update(keys)
            _EARLY_COND.notify_all()
        if child is not None:
            child.wait()
            if child in _EARLY_CHILD:
                _EARLY_CHILD.remove(child)


def is_real_model_script(relpath):
    """脚本用真实模型吗（源码里导入 real_model_lab）。"""
    with open(os.path.join(ROOT, relpath), encoding="utf-8") as f:
        return "real_model_lab" in f.read()


_OUTPUTS = {}
_LOGS = {}
_RESULTS = {}


def script_run_pair(relpath):
    """
    一个编号脚本跑两次：一次在仓库根目录，一次在脚本自己的目录里（两核机器上两次同时跑）。
    结果缓存在这次 pytest 会话里，供各个测试共用：((退出码, stdout, stderr), (…))。只跑被要到的脚本。
    第二次运行同时让 console 记下它打印的块（script_console_blocks 读它）；第一次运行让调用 console.save_results 的
    脚本存下演示返回的数（script_results 读它）。
    """
    if relpath not in _OUTPUTS:
        if is_real_model_script(relpath):
            real_model_path()          # 先把文件准备好（或者跳过 / 失败），再同时启动两个进程
        fd, log = tempfile.mkstemp(suffix=".jsonl")
        os.close(fd)
        fd, res = tempfile.mkstemp(suffix=".pickle")
        os.close(fd)
        t0 = time.perf_counter()
        try:
            jobs = [(relpath, None, None, res), (relpath, os.path.join(ROOT, os.path.dirname(relpath)), log, None)]
            with ThreadPoolExecutor(max_workers=2) as ex:
                _OUTPUTS[relpath] = tuple(ex.map(lambda j: run_script(*j), jobs))
            with open(log, encoding="utf-8") as f:
                _LOGS[relpath] = [json.loads(line) for line in f if line.strip()]
            if os.path.getsize(res):
                with open(res, "rb") as f:
                    _RESULTS[relpath] = pickle.load(f)
        finally:
            os.remove(log)
            os.remove(res)
            _PAIR_SECONDS[relpath] = time.perf_counter() - t0
    return _OUTPUTS[relpath]


def script_console_blocks(relpath):
    """一个编号脚本通过 console 打印的块：[{"kind": "table"/"observations"/…, "lines": [...], …}, …]。"""
    script_run_pair(relpath)
    return _LOGS[relpath]


def script_results(relpath):
    """
    一个编号脚本（在仓库根目录运行的那次）交给 console.save_results 的数：测试核对的就是这次运行打印的数，
    不用在测试进程里再跑一遍演示。脚本没有调用 save_results 时测试失败。
    """
    code, _, err = script_run_pair(relpath)[0]
    assert code == 0, err.decode("utf-8", "replace")
    assert relpath in _RESULTS, f"{relpath} 没有调用 console.save_results（没有存下演示返回的数）"
    return _RESULTS[relpath]


def script_demo_text(relpath, n):
    """一个编号脚本（在仓库根目录运行的那次）打印的演示 n 那一段：从它的标题行到下一个演示的标题行（原样，折行没有接回）。"""
    text = script_raw_stdout(relpath)
    start = text.index(f"\n演示 {n}：")
    end = text.find(f"\n演示 {n + 1}：", start)
    return text[start:] if end < 0 else text[start:end]


def script_raw_stdout(relpath):
    """一个编号脚本（在仓库根目录运行时）打印的文字，原样（观察按 100 列折过行）。"""
    code, out, err = script_run_pair(relpath)[0]
    assert code == 0, err.decode("utf-8", "replace")
    return out.decode("utf-8")


def script_stdout(relpath):
    """
    一个编号脚本打印的文字，但每条"观察"和每个标题还原成折行之前的一行（"  1. 整条观察"），方便测试按句子查找。
    还原靠 console 的记录（script_console_blocks）：把折好的行换回原文。
    """
    text = script_raw_stdout(relpath)
    for b in script_console_blocks(relpath):
        if b["kind"] == "observations":
            old = "\n".join(b["lines"])
            new = "\n".join(f"  {i}. {t}" for i, t in enumerate(b["items"], 1))
        elif b["kind"] == "header":
            old = "\n".join(b["lines"])
            new = "\n".join([b["lines"][0], b["title"], b["lines"][-1]])
        else:
            continue
        text = text.replace(old, new, 1)
    return text
