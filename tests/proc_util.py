"""
测试共用的进程工具（test_routers、test_split_workers、test_lockstep）：一个 worker 进程是不是已经退出了（"父进程被杀
不留孩子"）；早早起的备用进程降低优先级（background）、轮到用它们时恢复（foreground）；测试模块在被导入（收集）时就起的
共用 worker 记在 EARLY 里（别的模块查"没有留下子进程"时不算它们）。
"""
import os

BACKGROUND_NICE = 19     # 备用进程比测试进程高这么多 nice（最低的优先级）：CPU 闲着时它们照样起，忙时让前台先跑


def exited(pid):
    """pid 这个进程已经退出了吗：不在了，或者退出了、只剩进程表里的一项等父进程收（僵尸：Linux 的 /proc/pid/status 里
    State 是 Z 或 X）。父进程被杀以后 worker 归 PID 1 收，有的容器里 PID 1 隔一两秒才收一次：那段时间 os.kill(pid, 0)
    还成功，可 worker 早已不跑了。没有 /proc 的系统只看 os.kill。"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            state = next((line.split()[1] for line in f if line.startswith("State:")), "?")
    except FileNotFoundError:
        return os.path.isdir("/proc/self")           # 有 /proc、这一项刚没了：退出了；没有 /proc：看不出，算还在
    except OSError:
        return False
    return state in ("Z", "X")


def _own_nice():
    return os.getpriority(os.PRIO_PROCESS, 0)


def background(pids):
    """这些进程的 nice 调到测试进程的 + BACKGROUND_NICE（调高谁都可以）；进程已经不在了就算了。"""
    for pid in pids:
        try:
            os.setpriority(os.PRIO_PROCESS, pid, min(19, _own_nice() + BACKGROUND_NICE))
        except (ProcessLookupError, PermissionError):
            pass


def popen_background(argv, **kw):
    """
    subprocess.Popen(argv, **kw)，起来就调到后台（background）-> Popen。它以后 spawn 的孩子继承这个 nice（它要先 import
    完才 spawn，那时 nice 早已调好）。不用 preexec_fn：有 preexec_fn 时 Popen 只能 fork 整个测试进程（装着几 GB 的模型，
    一次要零点几秒），没有时它用 vfork / posix_spawn，和进程多大无关。
    """
    import subprocess
    p = subprocess.Popen(argv, **kw)
    background([p.pid])
    return p


def foreground(pids):
    """把 nice 调回测试进程自己的；普通用户不能调低 nice（PermissionError）：那就留在后台，只是在忙的机器上慢一点。"""
    for pid in pids:
        try:
            os.setpriority(os.PRIO_PROCESS, pid, _own_nice())
        except (ProcessLookupError, PermissionError):
            pass


EARLY = {}      # 测试模块的名字 -> 它早早起了的进程（被导入时、用真实模型的那组测试开始时；multiprocessing.Process 的 list）


def early(module, procs):
    """模块 module 早早起了这些进程（被导入时起的共用 worker；conftest.at_real_model_tail 时起的）：调到后台（background），
    记进 EARLY（加在它已有的后面）-> procs。
    收集之后、轮到这个模块之前还有几十个测试文件要跑，它们在那段时间里用闲着的 CPU 装好；没有选中用它们的测试时
    由模块自己关掉（模块的测试一个都没选中：测试进程退出时 multiprocessing 结束这些 daemon 进程）。"""
    procs = list(procs)
    background(p.pid for p in procs)
    EARLY.setdefault(module, []).extend(procs)
    return procs


def early_elsewhere(module):
    """别的模块在被导入时起的、还在的进程 -> set（它们归那个模块关、查）。"""
    return {p for m, ps in EARLY.items() if m != module for p in ps}


def kill_and_close(procs):
    """还在跑的 Popen 杀掉、等它退出（最多 10 秒），再关掉它的管道（没有的跳过）。"""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        for f in (p.stdin, p.stdout, p.stderr):
            if f is not None:
                f.close()
