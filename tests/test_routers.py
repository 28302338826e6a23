"""
worker 进程和路由器（worker_lab、router_lab）：玩具模型（float64，离线、快），worker 按模块共用（一个模块起一次）。

- 神谕：Router 每种策略下、PDRouter（管道和共享内存）下，每个请求 == decode_lab.autoregressive_generate(…,
  default_rng(seed))，T = 0 和 T = 1；
- 故障：被杀的 worker 手上的请求在限定时间内以 "error" 结束；close() 之后没有子进程、没有共享内存段。
"""
import os
import signal
import subprocess
import sys
import time
import multiprocessing as mp

import numpy as np
import pytest

from decode_lab import TransformerLM, autoregressive_generate
from conftest import at_real_model_tail
from proc_util import early, early_elsewhere, exited, foreground, kill_and_close, popen_background
from router_lab import PDRouter, Router
from transformer_lab import LMConfig, init_params
from worker_lab import spawn_worker, wait_all

CFG = LMConfig(max_seq=64)
MODEL = TransformerLM(init_params(CFG, 1), CFG)
RECIPE = ("toy", "tiny", 1)
_R = np.random.default_rng(21)
SYSTEM = [int(t) for t in _R.integers(0, CFG.vocab, size=12)]
PROMPTS = [SYSTEM + [int(t) for t in _R.integers(0, CFG.vocab, size=k)] for k in (3, 9, 1)] + \
          [[int(t) for t in _R.integers(0, CFG.vocab, size=k)] for k in (5, 17)]
N_NEW = 8


_SOLO = {}


def _drain(r, why="路由器 10 秒内没把请求做完"):
    """一步一步跑到路由器没有没结束的请求；每步最多等 5 秒，总共不超过 10 秒（有界：死掉的 worker 不会让测试挂住）。"""
    t0 = time.monotonic()
    while r.has_unfinished_requests():
        r.step(timeout=5)
        assert time.monotonic() - t0 < 10, why


def solo(prompt, n, T, seed):
    """单独生成的参照；三种策略（两种交接方式）对同一个 (提示, n, T, seed) 用同一份，只算一次。"""
    key = (tuple(prompt), n, T, seed)
    if key not in _SOLO:
        _SOLO[key] = [int(t) for t in autoregressive_generate(MODEL, prompt, n, T, np.random.default_rng(seed))]
    return _SOLO[key]


def shm_names():
    return {f for f in os.listdir("/dev/shm") if f.startswith("psm_")} if os.path.isdir("/dev/shm") else set()


SMOLLM2_TEST = "test_smollm2_float64_pd_router_equals_each_request_alone"
SMOLLM2_LAYERS = 2
PARENT_TEST = "test_a_killed_parent_leaves_no_worker_behind"
PARENT_SIGS = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)
# 父进程：起一个 worker、马上报它的 pid（测试要把它调回前台：父进程在后台时起的 worker 也在后台），装好了报 ready，
# 然后等着（读 stdin：测试进程不在了，管道一关它也走）
# 第一行：Ctrl-C 照常结束父进程。从脚本里 `pytest &`、nohup 起的测试集继承了"忽略 SIGINT"，Python 那时不装自己的
# 处理函数，父进程就收不到 Ctrl-C 了；这里明写它要的行为（和学生在终端里按 Ctrl-C 时一样）
PARENT_CODE = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
               "sys.path[:0] = sys.argv[1:]\n"
               "from worker_lab import spawn_worker\n"
               "w = spawn_worker(('toy', 'tiny', 1), num_blocks=16, block_size=4)\n"
               "print(w.proc.pid, flush=True)\n"
               "w.wait_ready()\n"
               "print('ready', flush=True)\n"
               "sys.stdin.readline()\n")


def _pd_spawn(**pre_kw):
    return [spawn_worker(RECIPE, num_blocks=32, block_size=4, **pre_kw),
            spawn_worker(RECIPE, num_blocks=32, block_size=4)]


# 自己起 worker 的测试 -> 它要的 worker（spawn、不等）
SPARES = {
    "test_pd_router_waits_for_a_decode_slot_instead_of_dropping_the_request":
        lambda: [spawn_worker(RECIPE, num_blocks=32, block_size=4),
                 spawn_worker(RECIPE, num_blocks=32, block_size=4, max_num_seqs=1)],
    "test_decode_worker_killed_before_the_import_leaves_no_segment_and_errors_in_bounded_time":
        lambda: _pd_spawn(max_num_batched_tokens=4),
    "test_prefill_worker_killed_fails_its_requests_and_cancels_their_reservations":
        lambda: _pd_spawn(max_num_batched_tokens=4),
}

# 玩具模型的进程都在收集时就起（proc_util.early：后台）：这个模块排在用真实模型的那一组里、测试集的最后，轮到它时它们
# 早已装好。共用的三个 worker（fixture workers）、自己起 worker 的测试各自的（SPARES）、父进程被杀的测试的三个父进程
# （PARENT_CODE：各起一个 worker、报 pid、等着；Popen，不是 multiprocessing 的孩子）
_WORKERS = [spawn_worker(RECIPE, num_blocks=32, block_size=4, max_num_seqs=8) for _ in range(3)]
_SPARES = {name: make() for name, make in SPARES.items()}
_DIRS = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", d)
         for d in ("lecture05", "lecture01", "lecture02", "lecture06")]
_PARENTS = [popen_background([sys.executable, "-c", PARENT_CODE] + _DIRS, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in PARENT_SIGS]
early(__name__, [w.proc for w in _WORKERS] + [w.proc for ws in _SPARES.values() for w in ws])


_SMOLLM2 = []    # 真实模型的两个 worker（_start_smollm2 起的）


def _start_smollm2(session):
    """选中了 SMOLLM2_TEST、模型文件拿得到时，起它的两个 worker（在后台装，不等），放进 _SMOLLM2；已经起了就什么都不做。"""
    if _SMOLLM2 or not any(it.name == SMOLLM2_TEST and it.module.__name__ == __name__ for it in session.items):
        return
    from conftest import real_model_path
    try:
        path = real_model_path()
    except (pytest.skip.Exception, pytest.fail.Exception):
        return
    _SMOLLM2.extend(spawn_worker(("gguf", path, "float64", SMOLLM2_LAYERS), block_size=16) for _ in range(2))
    early(__name__, [w.proc for w in _SMOLLM2])     # 后台装；别的模块查"没有留下子进程"时知道它们归这里


at_real_model_tail(_start_smollm2)      # 用真实模型的那组测试一开始就起（这个文件排在那组的后面）


class Started:
    """
    这个模块要的进程都早早起、不等（spawn_worker、Popen）：它们 import、装模型的时候，别的测试照常跑。
    - 收集时：玩具模型的进程（_WORKERS、_SPARES、_PARENTS）；这次没有选中用它们的测试：模块开头就关掉。
      测试拿走的进程由测试关、查。
    - 用真实模型的那组测试开始时（conftest.at_real_model_tail；只跑这个文件时：模块开头）：真实模型的两个 worker
      （_start_smollm2：SmolLM2 float64 的前 2 层，装模型、算指纹约 0.8 秒 CPU，内存新分配得慢的机器上要几秒；在后台装；
      模型文件拿不到：[]，那个测试自己跳过或失败）。用它们的测试是文件里最后一个。
    """

    def __init__(self, request):
        items = [it for it in request.session.items if it.module is request.module]
        names = {it.name for it in items}
        if not any("workers" in it.fixturenames for it in items):
            for w in _WORKERS:
                w.close()
        self.names, self.smollm2, self.ws, self.parents = names, [], {}, []
        for name, ws in _SPARES.items():
            if name in names:
                self.ws[name] = ws
            else:
                for w in ws:
                    w.close()
        if PARENT_TEST in names:
            self.parents = _PARENTS
        else:
            kill_and_close(_PARENTS)
        if SMOLLM2_TEST in names:
            _start_smollm2(request.session)
            self.smollm2 = _SMOLLM2

    def take(self, name):
        """这个测试的 worker：等它们装好 -> list。"""
        ws = self.ws.pop(name)
        foreground(w.proc.pid for w in ws)
        return wait_all(ws)

    def close(self):
        kill_and_close(self.parents)             # 测试没跑到（或中途失败）：父进程一死，它的 worker 跟着退出
        for w in self.smollm2 + [w for ws in self.ws.values() for w in ws]:
            w.close()


@pytest.fixture(scope="module", autouse=True)
def started(request):
    s = Started(request)
    yield s
    s.close()


@pytest.fixture(scope="module")
def workers(started):
    foreground(w.proc.pid for w in _WORKERS)
    ws = wait_all(_WORKERS)
    yield ws
    for w in ws:
        w.close()
    others = early_elsewhere(__name__)           # 别的模块收集时起的；真实模型的两个、还没用的备用 worker：它们的测试
    others |= {w.proc for w in started.smollm2}  # 自己关、自己查
    others |= {w.proc for ws in started.ws.values() for w in ws}
    assert not set(mp.active_children()) - others, "没有留下子进程"


def drive(router, prompts, T, seed, mts=None):
    ids = [router.add_request(p, (mts or {}).get(i, N_NEW), temperature=T, seed=seed + i) for i, p in enumerate(prompts)]
    t0 = time.monotonic()
    while router.has_unfinished_requests():
        router.step()
        assert time.monotonic() - t0 < 60
    return ids


@pytest.mark.parametrize("T", [0.0, 1.0])
@pytest.mark.parametrize("policy", ["round_robin", "least_loaded", "prefix"])
def test_router_each_policy_equals_each_request_alone(workers, policy, T):
    r = Router(workers[:2], policy)
    ids = drive(r, PROMPTS + PROMPTS[:2], T, 3)
    for i, gid in enumerate(ids):
        assert r.outputs[gid] == solo((PROMPTS + PROMPTS[:2])[i], N_NEW, T, 3 + i), f"{policy} 请求 {i}"
        assert r.finished[gid] == "length" and len(r.token_times[gid]) == N_NEW
    if policy == "prefix":
        assert r.prefix_hits > 0
    for w in workers[:2]:
        info = w.call("info")
        assert info["num_free_blocks"] == info["num_blocks"]


@pytest.mark.parametrize("via", ["pipe", "shm"])
@pytest.mark.parametrize("T", [0.0, 1.0])
def test_pd_router_equals_each_request_alone(workers, via, T):
    before = shm_names()
    r = PDRouter(workers[:1], workers[1:], via=via)
    ids = drive(r, PROMPTS, T, 7, mts={2: 1})                    # 请求 2：max_tokens 1，在 prefill 那边就结束
    for i, gid in enumerate(ids):
        assert r.outputs[gid] == solo(PROMPTS[i], 1 if i == 2 else N_NEW, T, 7 + i), f"{via} 请求 {i}"
    assert r.n_handoffs == len(PROMPTS) - 1
    assert r.bytes_moved == sum(2 * 2 * 2 * 8 * 8 * len(p) for i, p in enumerate(PROMPTS) if i != 2)
    for w in workers:
        info = w.call("info")
        assert info["num_free_blocks"] == info["num_blocks"], "不漏块（两边）"
    assert shm_names() == before


def test_pd_router_waits_for_a_decode_slot_instead_of_dropping_the_request(started):
    """回归：decode 那边的块够、序列的空位（max_num_seqs）不够时，import 拒绝（返回 None），旧的路由器把 None 当成
    请求 id 记下，请求再也结束不了。现在 reserve 连空位一起留：请求在路由器的队列里等，每个都等于单独生成的。
    两个 worker（decode 那边 max_num_seqs = 1）早早起了（SPARES）。"""
    ws = started.take("test_pd_router_waits_for_a_decode_slot_instead_of_dropping_the_request")
    with PDRouter(ws[:1], ws[1:], via="pipe") as r:
        ids = [r.add_request(p, 4, temperature=1.0, seed=30 + i) for i, p in enumerate(PROMPTS[:3])]
        _drain(r, "请求被丢了：路由器永远有没结束的请求")
        for i, gid in enumerate(ids):
            assert r.outputs[gid] == solo(PROMPTS[i], 4, 1.0, 30 + i) and r.finished[gid] == "length"
        assert r.n_handoffs == 3
        info = ws[1].call("info")
        assert info["num_free_blocks"] == info["num_blocks"]


def test_decode_worker_killed_before_the_import_leaves_no_segment_and_errors_in_bounded_time(started):
    """回归：共享内存的段由收的一边 unlink；decode worker 在交接送到之前死了，旧的路由器不 unlink，段留在 /dev/shm。
    prefill 一步只算 4 个 token（_pd_spawn(max_num_batched_tokens=4)，早早起了），所以杀 decode 时交接还没出发。"""
    before = shm_names()
    ws = started.take("test_decode_worker_killed_before_the_import_leaves_no_segment_and_errors_in_bounded_time")
    with PDRouter(ws[:1], ws[1:], via="shm") as r:
        gid = r.add_request(PROMPTS[4], 6, seed=1)              # 17 个提示 token：prefill 要 5 步
        r.step()
        os.kill(ws[1].proc.pid, signal.SIGKILL)
        _drain(r)
        assert r.finished[gid] == "error" and "decode" in r.error_message[gid]
        with pytest.raises(RuntimeError):
            r.add_request(PROMPTS[0], 2)                        # decode 那边一个都不剩：说它不能服务
        info = ws[0].call("info")
        assert info["num_free_blocks"] == info["num_blocks"], "prefill 那边不漏块"
    assert shm_names() == before
    assert not any(w.proc.is_alive() for w in ws)


def test_prefill_worker_killed_fails_its_requests_and_cancels_their_reservations(started):
    """回归：prefill worker 死了，它手上的请求以 "error" 结束，但旧的路由器不取消它们在 decode 那边的预留：块漏了。
    prefill 一步只算 4 个 token（_pd_spawn(max_num_batched_tokens=4)，早早起了）。"""
    ws = started.take("test_prefill_worker_killed_fails_its_requests_and_cancels_their_reservations")
    with PDRouter(ws[:1], ws[1:], via="pipe") as r:
        ids = [r.add_request(p, 6, seed=i) for i, p in enumerate(PROMPTS[3:5])]
        r.step()
        os.kill(ws[0].proc.pid, signal.SIGKILL)
        _drain(r)
        assert [r.finished[g] for g in ids] == ["error", "error"]
        info = ws[1].call("info")
        assert info["num_free_blocks"] == info["num_blocks"], "decode 那边的预留取消了"
    assert not any(w.proc.is_alive() for w in ws)


def test_gguf_recipe_with_a_layer_count_is_checked_before_any_process_starts(tmp_path):
    """("gguf", 路径, dtype, K)：K 不是 ≥ 1 的整数时 spawn_worker 不起进程就说不行；K 出界（≥ 文件的层数）时 _first_layers
    说。K 合规矩时只装前 K 层：和整个文件装出来的前 K 层逐位相同，配置的 n_layers = K（一个 2 层的小 GGUF，
    test_real_model_lab 写它的办法）。"""
    from real_model_lab import load_gguf
    from test_real_model_lab import _params, _write
    from worker_lab import _first_layers
    before = len(mp.active_children())
    for bad in (("gguf", "m.gguf", "float64", 0), ("gguf", "m.gguf", "float64", 1.0),
                ("gguf", "m.gguf", "float64", True), ("gguf", "m.gguf")):
        with pytest.raises(ValueError, match="层数"):
            spawn_worker(bad)
    assert len(mp.active_children()) == before
    path = _write(tmp_path, _params(True))
    for k in (0, 2, 1.0):
        with pytest.raises(ValueError, match="1..1"):
            _first_layers(path, np.float64, k)
    P, cfg, _ = load_gguf(path, np.float64)
    P1, cfg1 = _first_layers(path, np.float64, 1)
    assert cfg.n_layers == 2 and cfg1.n_layers == 1 and len(P1["layers"]) == 1 and cfg1.d_model == cfg.d_model
    for k, v in P["layers"][0].items():
        assert np.array_equal(P1["layers"][0][k], v), k
    for k in ("embed", "final_norm", "lm_head"):
        assert np.array_equal(P1[k], P[k]), k


def test_a_killed_parent_leaves_no_worker_behind(started):
    """父进程被杀（SIGKILL）、被 SIGTERM、被 Ctrl-C（SIGINT）：worker 的管道关了，它自己退出。三个父进程早早同时起了
    （收集时，_PARENTS：各起好一个 worker、报了 pid、在等着）。"""
    ps, sigs = started.parents, PARENT_SIGS
    foreground([p.pid for p in ps])             # 还没装好（忙的机器上）：先把父进程调回前台，它们之后起的 worker 跟着
    pids = [int(p.stdout.readline()) for p in ps]
    foreground(pids)
    assert [p.stdout.readline() for p in ps] == ["ready\n"] * len(ps), "worker 都装好了"
    for p, sig in zip(ps, sigs):
        assert p.poll() is None, "父进程还在"
        p.send_signal(sig)
    for p in ps:
        p.wait(10)
    t0, left = time.monotonic(), dict(zip(pids, sigs))
    while left and time.monotonic() - t0 < 10:
        for pid in list(left):
            if exited(pid):
                del left[pid]
        time.sleep(0.02)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f"父进程被 {sorted(left.values())} 结束之后 worker {sorted(left)} 还在"
    for p in ps:
        assert "resource_tracker" not in p.stderr.read()


def test_serve_flags_refuse_pd_with_speculative_config_and_bad_pd(capsys):
    """serve.py --pd P:D：写法不对、和 --speculative-config 一起：参数错误（退出码 2），不装模型。"""
    from conftest import load_script
    serve = load_script("lecture05/serve.py")
    assert serve.parse_pd("2:1") == (2, 1)
    for bad in ("1x1", "0:1", "1:0", "a:b"):
        with pytest.raises(ValueError, match="P:D"):
            serve.parse_pd(bad)
    for argv in (["--pd", "1:1", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'],
                 ["--pd", "1x1"], ["--replicas", "0"], ["--routing", "random", "--replicas", "2"]):
        with pytest.raises(SystemExit) as e:
            serve.main(argv)
        assert e.value.code == 2
    with pytest.raises(ValueError, match="speculative"):
        serve.load_server(pd=(1, 1), speculative_config={"method": "ngram"})


def test_router_speaks_the_engine_face_serve_uses(workers):
    """serve.py 的引擎线程用的几处：add_request(prompt, n, T, seed, stop, logprobs=k)、requests.get(id).logprobs、
    release、cfg、num_blocks、block_size。"""
    r = Router(workers[:2], "least_loaded")
    gid = r.add_request(PROMPTS[0], 3, 0.0, 0, None, logprobs=2)
    while r.has_unfinished_requests():
        r.step()
    rec = r.requests.get(gid)
    assert rec.output == solo(PROMPTS[0], 3, 0.0, 0) and len(rec.logprobs) == 3
    n_ids = len(r.token_times)
    with pytest.raises(ValueError):
        r.add_request([CFG.vocab + 5], 2)                        # worker 拒绝：路由器不留这个 id 的记录
    assert len(r.token_times) == n_ids and len(r.arrival) == n_ids
    r.release(gid)
    assert r.requests.get(gid) is None and gid not in r.arrival
    assert r.cfg == CFG and r.num_blocks == 32 and r.block_size == 4
    r.release(gid)
    assert r.requests.get(gid) is None


def test_killed_worker_fails_its_requests_with_error_in_bounded_time(workers):
    """共用的前两个 worker：这是文件里最后一个用 workers 的测试（它杀掉一个、关掉另一个；第三个归 fixture 关）。
    它们之前服务过别的测试的请求、前缀缓存里有东西：输出照样逐 token 等于单独生成的。"""
    ws = workers[:2]
    with Router(ws, "round_robin") as r:
        ids = [r.add_request(p, 40, seed=i) for i, p in enumerate(PROMPTS[:4])]
        r.step()
        os.kill(ws[0].proc.pid, signal.SIGKILL)
        _drain(r)
        assert [r.finished[g] for g in ids] == ["error", "length", "error", "length"]
        assert "died" in r.error_message[ids[0]]
        gid = r.add_request(PROMPTS[0], 3)                      # 用剩下的接着服务
        while r.has_unfinished_requests():
            r.step()
        assert r.outputs[gid] == solo(PROMPTS[0], 3, 0.0, 0)
    assert not any(w.proc.is_alive() for w in ws)
    assert all(p not in mp.active_children() for p in (w.proc for w in ws))


def test_smollm2_float64_pd_router_equals_each_request_alone(started):
    """真实模型一次：SmolLM2 float64 的前 2 层（worker 的配方 ("gguf", 路径, "float64", 2)），1 个 prefill + 1 个 decode
    的 worker，T = 1，KV 经共享内存过去；token 等于单独生成的（测试进程里 drafts_lab.early_exit_draft(会话共用的模型, 2)，
    它和只留前 2 层参数重建的模型逐位相同）。
    为什么 2 层就够：跨进程逐位相等靠的是交接把每一层的 K、V 原样送过去、随机数发生器的状态接着用，和层数无关；2 层让
    "层的顺序送错了"也看得出来；其余都是真的：分词器、49,152 的词表、9 个 Q 头对 3 个 KV 头、head_dim 64、共享的
    lm_head、float64。30 层时 worker 要融合约 1 GB 的权重、算同样大的指纹，慢几秒，证明的是同一件事。
    两个 worker 在用真实模型的那组测试开始时就 spawn 了（_start_smollm2；只从文件装前 2 层，装载时各到约 0.8 GB，VmHWM，
    之后约 0.6 GB），这个测试排在文件的最后：它们在别的测试跑的时候装；一个提示、3 个 token（第 1 个在 prefill 那边抽，
    后 2 个在 decode 那边用送过去的随机数发生器的状态抽）。"""
    from conftest import real_model_path
    from drafts_lab import early_exit_draft
    from smollm2_models import smollm2_lm
    real_model_path()
    ws = started.smollm2
    try:
        model, cfg, tok = smollm2_lm("float64")
        prompt = tok.encode("The capital of France is")
        two = early_exit_draft(model, SMOLLM2_LAYERS)
        want = [int(t) for t in autoregressive_generate(two, prompt, 3, 1.0, np.random.default_rng(5))]
        foreground(w.proc.pid for w in ws)
        for w in ws:
            info = w.wait_ready()
            assert info["cfg"] == two.cfg and info["cfg"].n_layers == SMOLLM2_LAYERS
        with PDRouter(ws[:1], ws[1:], via="shm") as r:
            gid = r.add_request(prompt, 3, temperature=1.0, seed=5)
            while r.has_unfinished_requests():
                r.step()
            assert r.outputs[gid] == want and r.n_handoffs == 1
    finally:
        for w in ws:
            w.close()
    assert len(ws) == 2 and not any(w.proc.is_alive() for w in ws)
