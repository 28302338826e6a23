"""
测试要的子进程（脚本加 --time 跑一次、没有模型文件时跑一次、在子进程里读 BLAS 的线程数……），提前在后台跑。

测试文件在被导入时（pytest 收集的时候）用 submit 把它要的子进程排进队，一个后台线程按排队的顺序一次跑一个：
测试进程自己只占一个核，两核机器的另一个核在跑别的测试时常常空着，子进程就在那时跑完。测试用 result 取结果：
已经跑完的直接拿；还没轮到的当场在前台跑（不排在别人后面等）；正在后台跑的，等它的同时在前台跑队里同一组
（key 的第一项相同，通常是同一个测试文件排的）的下一个：两个核都用上，而且这个文件接下来就要它。别的组的不帮着跑：
它们原本可以在空着的核上白白跑完，拿到前台来就要测试等。key 是一个元组，第一项是组名。

收集的时候不起（hold / release：conftest 在收集开始前 hold、收集完 release）：收集时两个核都在忙（测试进程导入测试文件、
另一个进程替它改写 assert），这时再起子进程就是三个抢两个核，改写慢到一半；排进队的等收集完再按顺序跑。
不留下进程：每个子进程有时间上限（到时间杀掉，result 抛 subprocess.TimeoutExpired）；测试进程退出时（atexit），还在跑的
杀掉，还没轮到的不再启动，tempdir 给的临时目录删掉。没有一个测试要到的子进程（例如 -k 只选了别的测试）最多白跑一次。
后台线程在，测试进程就别 fork（Python 3.12 起多线程的进程 fork 有 DeprecationWarning，pytest.ini 把警告当错误）：
子进程都用 subprocess（不经过 os.fork），测试里的 multiprocessing 都用 spawn。
"""
import atexit
import collections
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading

_LOCK = threading.Lock()
_WAKE = threading.Condition(_LOCK)
_JOBS = {}                      # key -> _Job
_QUEUE = collections.deque()    # 还没开始的 key，按排队的顺序
_WORKER = []
_CLOSED = []
_DIRS = []
_HELD = []                      # 非空时（hold）后台线程不起新的子进程，等 release


def hold():
    """后台线程先不起新的子进程（submit 照样排队；result 照样当场跑）。"""
    with _LOCK:
        _HELD[:] = [True]


def release():
    """hold 之后：后台线程接着按排队的顺序跑。"""
    with _LOCK:
        _HELD.clear()
        _WAKE.notify_all()


class _Job:
    def __init__(self, argv, env, cwd, timeout):
        self.argv, self.env, self.cwd, self.timeout = list(argv), env, cwd, timeout
        self.state = "queued"           # queued -> running -> done
        self.proc = None
        self.outcome = None             # subprocess.CompletedProcess，或者跑的时候出的异常
        self.done = threading.Event()


def submit(key, argv, *, env=None, cwd=None, timeout=300, now=False):
    """
    把一个子进程排进后台的队（同一个 key 只排一次）。env、cwd 同 subprocess.run；timeout：秒。
    now=True：不排队，马上在它自己的线程里启动。给大部分时间在等（不占 CPU）的子进程用，例如等一个连不上的下载。
    """
    with _LOCK:
        if key in _JOBS or _CLOSED:
            return
        _JOBS[key] = job = _Job(argv, env, cwd, timeout)
        if now:
            job.state = "running"
            threading.Thread(target=_run, args=(job,), name="background_runs_now", daemon=True).start()
            return
        _QUEUE.append(key)
        if not _WORKER:
            t = threading.Thread(target=_work, name="background_runs", daemon=True)
            _WORKER.append(t)
            t.start()
        _WAKE.notify()


def result(key):
    """排过队的子进程的结果 -> subprocess.CompletedProcess（stdout、stderr 是字节）。还没轮到就在这里跑。"""
    with _LOCK:
        job = _JOBS[key]
        mine = job.state == "queued"
        if mine:
            _QUEUE.remove(key)
            job.state = "running"
    if mine:
        _run(job)
    while not job.done.is_set():        # 它在后台跑着：这个进程闲着，先帮着跑队里同一组的下一个（同一个文件很快也要它）
        with _LOCK:
            same = [k for k in _QUEUE if k[0] == key[0]] if not _CLOSED else []
            other = _JOBS[same[0]] if same else None
            if other is not None:
                _QUEUE.remove(same[0])
                other.state = "running"
        if other is None:
            job.done.wait()
        else:
            _run(other)
    if isinstance(job.outcome, BaseException):
        raise job.outcome
    return job.outcome


def tempdir(prefix="cs349e_bg_"):
    """一个新的临时目录（测试进程退出时删掉）：给排队的子进程当缓存目录之类用。"""
    d = tempfile.mkdtemp(prefix=prefix)
    _DIRS.append(d)
    return d


def _run(job):
    try:
        with _LOCK:
            if _CLOSED:
                raise RuntimeError("测试进程正在退出，不再启动子进程")
            job.proc = subprocess.Popen(job.argv, env=job.env, cwd=job.cwd, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = job.proc.communicate(timeout=job.timeout)
        except subprocess.TimeoutExpired:
            job.proc.kill()
            out, err = job.proc.communicate()
            raise subprocess.TimeoutExpired(job.argv, job.timeout, out, err) from None
        job.outcome = subprocess.CompletedProcess(job.argv, job.proc.returncode, out, err)
    except BaseException as e:          # 结果里带着异常，由要结果的测试抛出
        job.outcome = e
        if not isinstance(e, Exception):            # Ctrl-C 之类：子进程杀掉，照样往上抛
            if job.proc is not None and job.proc.poll() is None:
                job.proc.kill()
                job.proc.wait()
            raise
    finally:
        job.state = "done"
        job.done.set()


def _work():
    while True:
        with _LOCK:
            while (not _QUEUE or _HELD) and not _CLOSED:
                _WAKE.wait()
            if _CLOSED:
                return
            job = _JOBS[_QUEUE.popleft()]
            job.state = "running"
        _run(job)


@atexit.register
def _close():
    with _LOCK:
        _CLOSED.append(True)
        _QUEUE.clear()
        _WAKE.notify_all()
        procs = [j.proc for j in _JOBS.values() if j.proc is not None]
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    for d in _DIRS:
        shutil.rmtree(d, ignore_errors=True)
    # 排着队、从没启动的 job 不会有人等（测试进程已经在退出）
    for j in _JOBS.values():
        if j.state == "queued":
            j.outcome = RuntimeError("没有启动")
            j.done.set()


# ---------------------------------------------------------------------------
# 仓库里每个 .py 的语法树：test_scripts（Python 3.9 的语法、编号脚本的 docstring）和 test_lab_layout（实验模块的
# docstring）都要把文件解析一遍，合起来一秒多。改成一个子进程解析一次，两个文件共用：哪个测试文件先被导入就由它排队。
# 子进程对每个文件（argv 给的相对路径）做 ast.parse(源码, feature_version=(3, 9))，记下 SyntaxError 的消息（没有就是
# None）和模块的 docstring（ast.get_docstring），整个 dict 用 JSON 打印出来；断言在各个测试里，一个文件一个。
# ---------------------------------------------------------------------------
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
_PARSED = {}


def python_files(root):
    """root 下所有的 .py（相对路径，排好序；不含隐藏目录里的）。"""
    files = glob.glob(os.path.join(root, "**", "*.py"), recursive=True)
    return sorted(os.path.relpath(p, root) for p in files if "/." not in p)


def submit_parse(root):
    """把"解析 root 下每个 .py"排进队（只排一次）。"""
    submit(("ast.parse 3.9", root), [sys.executable, "-c", PARSE_CHILD, root, *python_files(root)],
           env=dict(os.environ, PYTHONIOENCODING="utf-8"), timeout=300)


def parsed(root, rel):
    """-> {"error": 用 Python 3.9 的语法解析 rel 时的 SyntaxError 消息或 None, "doc": 模块的 docstring 或 None}。"""
    if root not in _PARSED:
        submit_parse(root)
        r = result(("ast.parse 3.9", root))
        assert r.returncode == 0, r.stderr.decode("utf-8", "replace")
        _PARSED[root] = json.loads(r.stdout.decode("utf-8"))
    return _PARSED[root][rel]
