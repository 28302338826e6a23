"""
测试共用的进程工具：一个 worker 进程是不是已经退出了（test_routers、test_split_workers 的"父进程被杀不留孩子"）。
"""
import os


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
