"""
blas_threads —— 每个编号脚本的 BLAS 只用一个线程（学生自己设了线程数的环境变量时照他的）。

【规则】OPENBLAS_NUM_THREADS、OMP_NUM_THREADS、MKL_NUM_THREADS 三个变量有任何一个设了（非空），什么也不做：
BLAS 在 numpy 装进来时已经读过它们了。三个都没设时：把三个都设成 "1"（子进程继承），再调用已经装进来的 BLAS 库
自己的函数把线程数设成 1。console 在 import 时调用 apply_rule()，而每个编号脚本（两个种子也在内）都 import console，
所以这条规则管到所有脚本。

【为什么在 numpy 之后】种子脚本先 import numpy、再 import 实验模块，而且不能改：numpy 一装进来，BLAS 就按当时的
环境变量定好了线程数，之后再改环境变量没有用。所以这里像 threadpoolctl 那样，用 ctypes 找到进程里已经装进来的
BLAS 库，调它自己的 set_num_threads。不加新的依赖。

【哪个函数】不同的 OpenBLAS 构建导出的名字不同：numpy 2.x 的 wheel 带的 scipy-openblas 是
scipy_openblas_set_num_threads64_，numpy 1.2x 的 wheel 是 openblas_set_num_threads64_，系统的 OpenBLAS 是
openblas_set_num_threads；MKL 是 MKL_Set_Num_Threads / mkl_set_num_threads。

【怎么找库】Linux：/proc/self/maps 里已经映射的共享库；macOS：dyld 列出的已装库（numpy 的 wheel 把 OpenBLAS 放在
numpy/.dylibs；用 Accelerate 的 numpy 没有可设的库，也不需要）；其他系统：numpy.libs/ 和 numpy/.dylibs 里的库文件。
找不到、调不动时安静地什么也不做，绝不让脚本因此出错。
"""
import ctypes
import glob
import os
import sys

import numpy as np

THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

# (设线程数的函数, 读线程数的函数)，按 threadpoolctl 的名单
_SYMBOLS = (
    ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
    ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
    ("openblas_set_num_threads", "openblas_get_num_threads"),
    ("MKL_Set_Num_Threads", "MKL_Get_Max_Threads"),
    ("mkl_set_num_threads", "mkl_get_max_threads"),
)
_NAME_HINTS = ("openblas", "mkl_rt", "libmkl")


def student_setting(environ=None):
    """学生设了的线程变量 -> {名字: 值}（只算非空的）；空字典表示三个都没设，规则是一个线程。"""
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in THREAD_VARS if environ.get(k, "").strip()}


def _loaded_paths():
    """进程里已经装进来的、名字像 BLAS 的共享库的路径（去重、保持顺序）。"""
    paths = []
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
                for line in f:
                    parts = line.split(None, 5)
                    if len(parts) == 6 and parts[5].startswith("/"):
                        paths.append(parts[5].strip())
        except OSError:
            pass
    elif sys.platform == "darwin":
        try:
            dyld = ctypes.CDLL(None)
            dyld._dyld_get_image_name.restype = ctypes.c_char_p
            for i in range(dyld._dyld_image_count()):
                name = dyld._dyld_get_image_name(i)
                if name:
                    paths.append(os.fsdecode(name))
        except (OSError, AttributeError):
            pass
    if not any(h in os.path.basename(p).lower() for p in paths for h in _NAME_HINTS):
        root = os.path.dirname(os.path.abspath(np.__file__))      # numpy wheel 自带的库
        for pattern in (os.path.join(root + ".libs", "*"), os.path.join(root, ".dylibs", "*")):
            paths += sorted(glob.glob(pattern))
    seen, out = set(), []
    for p in paths:
        if p not in seen and any(h in os.path.basename(p).lower() for h in _NAME_HINTS):
            seen.add(p)
            out.append(p)
    return out


def _open(path):
    """已经装进来的库 -> ctypes 句柄；没装进来（RTLD_NOLOAD）或打不开时 None。不装新库。"""
    mode = getattr(os, "RTLD_NOLOAD", 0) | getattr(os, "RTLD_LOCAL", 0) if os.name != "nt" else 0
    try:
        return ctypes.CDLL(path, mode=mode)
    except OSError:
        return None


def blas_libraries():
    """进程里能设线程数的 BLAS -> [(路径, 设的函数, 读的函数)]；一个也找不到时是空列表。"""
    found = []
    for path in _loaded_paths():
        lib = _open(path)
        if lib is None:
            continue
        for set_name, get_name in _SYMBOLS:
            setter, getter = getattr(lib, set_name, None), getattr(lib, get_name, None)
            if setter is not None:
                found.append((path, setter, getter))
                break
    return found


def set_threads(n):
    """把每个找到的 BLAS 设成 n 个线程 -> 设了几个库（0：没找到，什么也没做）。"""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"线程数必须是正整数（收到 {n!r}）")
    done = 0
    for _, setter, _ in blas_libraries():
        try:
            setter(ctypes.c_int(n))
            done += 1
        except Exception:   # noqa: BLE001  调不动就算了：线程数只影响快慢，不影响结果
            pass
    return done


def thread_counts():
    """每个找到的 BLAS 现在用几个线程 -> [(路径, 线程数)]（没有读的函数的库不列）。"""
    out = []
    for path, _, getter in blas_libraries():
        if getter is not None:
            try:
                out.append((path, int(getter())))
            except Exception:   # noqa: BLE001
                pass
    return out


def apply_rule():
    """
    执行模块说明里的规则 -> 设成的线程数（1），或 None（学生设了变量，照他的；或者出了任何问题）。

    【边界】找不到 BLAS 库时仍然设环境变量（子进程照样只用一个线程），返回 1。永不抛异常。
    """
    try:
        if student_setting():
            return None
        for k in THREAD_VARS:
            os.environ[k] = "1"
        set_threads(1)
        return 1
    except Exception:   # noqa: BLE001  这条规则只管快慢：无论如何不让脚本因此出错
        return None
