"""
tests/background_runs.py（测试提前在后台跑的子进程）：结果和直接跑一样；到时间的杀掉；测试进程退出时不留下进程。
"""
import os
import subprocess
import sys
import time

import pytest

import background_runs
from conftest import ROOT
from proc_util import exited

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_queued_run_gives_what_subprocess_run_gives():
    argv = [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"]
    background_runs.submit(("test_background_runs", "echo"), argv)
    r = background_runs.result(("test_background_runs", "echo"))
    assert (r.returncode, r.stdout.split(), r.stderr.split()) == (3, [b"out"], [b"err"])


# 下面两个测试的子进程几乎全在睡：导入时就启动（now=True，不排在占 CPU 的那些后面；和别的测试同时睡）
SLEEPER_KEY = ("test_background_runs", "sleeper")
background_runs.submit(SLEEPER_KEY, SLEEPER, timeout=0.2, now=True)
EXIT_CODE = ("import sys, time; sys.path.insert(0, sys.argv[1]); import background_runs as b;"
             "b.submit(('t', 1), [sys.executable, '-c', 'import time; time.sleep(60)']);"
             "b.submit(('t', 2), [sys.executable, '-c', 'import time; time.sleep(60)']);"
             "time.sleep(0.3); print(b._JOBS[('t', 1)].proc.pid, b._JOBS[('t', 2)].proc)")
EXIT_KEY = ("test_background_runs", "exit")
background_runs.submit(EXIT_KEY, [sys.executable, "-c", EXIT_CODE, os.path.join(ROOT, "tests")], timeout=30, now=True)


def test_a_run_past_its_time_limit_is_killed_and_raises():
    t0 = time.perf_counter()
    with pytest.raises(subprocess.TimeoutExpired):
        background_runs.result(SLEEPER_KEY)
    assert time.perf_counter() - t0 < 30
    assert background_runs._JOBS[SLEEPER_KEY].proc.poll() is not None      # 已经结束（被杀掉），不是还在睡


def test_exit_kills_a_running_child_and_starts_no_queued_one():
    """一个进程（EXIT_CODE）排了两个会睡 60 秒的子进程就退出：正在跑的那个被杀掉，排队的那个从没启动。"""
    r = background_runs.result(EXIT_KEY)
    assert r.returncode == 0, r.stderr.decode("utf-8", "replace")
    pid, second = r.stdout.split()
    assert second == b"None"
    assert exited(int(pid))                         # 子进程已经被杀掉（不是还在睡）


def test_a_run_submitted_now_starts_at_once_beside_the_queue():
    """now=True 的不排队：submit 一返回它就已经在自己的线程里启动了（不在队里，不等后台线程轮到它）。"""
    key = ("test_background_runs", "now")
    background_runs.submit(key, [sys.executable, "-c", "print(7)"], now=True)
    assert background_runs._JOBS[key].state != "queued" and key not in background_runs._QUEUE
    r = background_runs.result(key)
    assert r.returncode == 0 and r.stdout.split() == [b"7"]



# 一个进程自己的队（空的）：hold 着排一个，0.2 秒后还在排队、没有起；release 之后后台线程自己跑完它（不经过 result）
HOLD_CODE = ("import sys, time; sys.path.insert(0, sys.argv[1]); import background_runs as b\n"
             "b.hold(); b.submit(('t', 1), [sys.executable, '-c', 'print(5)']); time.sleep(0.2)\n"
             "j = b._JOBS[('t', 1)]; print(j.state, j.proc)\n"
             "b.release(); print(j.done.wait(30), j.outcome.stdout.split())\n")
HOLD_KEY = ("test_background_runs", "hold")
background_runs.submit(HOLD_KEY, [sys.executable, "-c", HOLD_CODE, os.path.join(ROOT, "tests")], timeout=60)


def test_nothing_starts_while_held_and_the_queue_runs_after_release():
    """收集时（conftest hold 了）后台线程不起子进程，收集完（release）照常跑；这个测试跑的时候已经 release 了。"""
    assert not background_runs._HELD, "收集完了：conftest 应当已经 release"
    r = background_runs.result(HOLD_KEY)
    assert r.returncode == 0, r.stderr.decode("utf-8", "replace")
    assert r.stdout.decode().splitlines() == ["queued None", "True [b'5']"]
