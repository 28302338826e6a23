"""
拆开的投机解码（split_worker_lab、link_lab、split_clock_lab）：草稿 worker 和目标 worker 之间一条链路。
玩具模型（float64，离线、快）；一对 worker 整个模块只起一次。

- 神谕：不重叠时 full_q、lazy_q == decode_lab.speculative_generate(…, default_rng(seed))，point_mass ==
  tree_lab.dynamic_tree_generate(…, budget=γ, top_k=1, depth=γ)，T = 0 和 T = 1，逐 token、逐轮的接受数；
  重叠时 == overlap_spec_lab.overlap_speculative_generate（两条随机数流）；
- 账：每轮的有效载荷 == split_clock_lab.round_payload_bytes（手算的数另外核对）；链路的延迟是每一程的下界；
- 故障：被杀的 worker 让请求在限定时间里以 WorkerDied 结束、说是哪个；父进程被杀 / SIGTERM / Ctrl-C 不留孩子。
"""
import functools
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from decode_lab import speculative_generate
from link_lab import COUNT_BYTES, ID_BYTES, RNG_STATE_BYTES, Link, measure_round_trip, one_way_s
from conftest import at_real_model_tail
from proc_util import background, early, early_elsewhere, exited, foreground, kill_and_close, popen_background
from split_clock_lab import modelled_round_s, modelled_verify_s, round_payload_bytes
from split_models_lab import build_split_model
from split_worker_lab import SplitPair, WorkerDied, split_speculative_generate
from tree_lab import dynamic_tree_generate

TARGET, DRAFT = "qcfg:0", "qcfg-layers:2:0"        # 草稿 = 目标的前 2 层：T = 1 时既有全部接受的轮，也有拒绝的轮
V = 192                                           # QCFG 的词表
PROMPT = [5, 17, 101, 3, 44, 9]
N_NEW = 14
HERE = os.path.dirname(os.path.abspath(__file__))


SMOLLM2_TEST = "test_smollm2_float64_split_lazy_q_equals_speculative_generate"
SMOLLM2_PAIR = ("smollm2-layers:1", "smollm2-layers:3")     # (草稿, 目标)：SmolLM2 float64 的前 1 层、前 3 层
VICTIM_TEST = "test_a_killed_worker_fails_the_request_naming_it_in_bounded_time"
PARENT_TEST = "test_a_killed_interrupted_or_terminated_parent_leaves_no_worker_behind"
BLAS_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
PARENT_SIGS = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)
# 父进程：起一对、马上报两个 worker 的 pid（测试要把它们调回前台：父进程在后台时起的 worker 也在后台），装好了报
# ready，等测试说"go"才开始请求（请求要跑 ≥ 240 / 2 轮 × 2 × 0.05 秒 = 12 秒）；没等到（测试进程不在了，stdin 关了）
# 就直接退出
# 第一行：Ctrl-C 照常结束父进程。从脚本里 `pytest &`、nohup 起的测试集继承了"忽略 SIGINT"，Python 那时不装自己的
# 处理函数，父进程就收不到 Ctrl-C 了；这里明写它要的行为（和学生在终端里按 Ctrl-C 时一样）
PARENT_CODE = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
               "sys.path[:0] = sys.argv[1:]\n"
               "from split_worker_lab import SplitPair\n"
               f"with SplitPair({DRAFT!r}, {TARGET!r}, wait=False) as p:\n"
               "    print(*(q.pid for q in p.procs), flush=True)\n"
               "    p.wait_ready()\n"
               "    print('ready', flush=True)\n"
               "    if sys.stdin.readline():\n"
               f"        p.generate({PROMPT}, 240, num_speculative_tokens=1, T=1.0, seed=0, link_delay_s=0.05)\n")

# 玩具模型的一对（fixture pair 共用）、父进程被杀的测试的三个父进程（PARENT_CODE：各起一对、报 pid、等"go"；
# Popen，不是 multiprocessing 的孩子）在收集时就起（proc_util.early、popen_background：后台）：这个模块排在用真实
# 模型的那一组里、测试集的最后，轮到它时它们早已装好
_TOY = SplitPair(DRAFT, TARGET, wait=False)
early(__name__, _TOY.procs)
_DIRS = [os.path.join(HERE, "..", d) for d in ("lecture05", "lecture01", "lecture02", "lecture06")]
_PARENTS = [popen_background([sys.executable, "-c", PARENT_CODE] + _DIRS, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in PARENT_SIGS]


_SMOLLM2 = []    # 真实模型的那一对（_start_smollm2 起的 SplitPair）


def _start_smollm2(session):
    """选中了 SMOLLM2_TEST、模型文件拿得到时，起它的那一对（在后台装，不等），放进 _SMOLLM2；已经起了就什么都不做。"""
    if _SMOLLM2 or not any(it.name == SMOLLM2_TEST and it.module.__name__ == __name__ for it in session.items):
        return
    from conftest import real_model_path
    try:
        real_model_path()
    except (pytest.skip.Exception, pytest.fail.Exception):
        return
    _SMOLLM2.append(SplitPair(*SMOLLM2_PAIR, wait=False))
    early(__name__, _SMOLLM2[0].procs)     # 后台装（spares() 和那个测试调回前台）；别的模块查"没有留下子进程"时知道它们归这里


at_real_model_tail(_start_smollm2)      # 用真实模型的那组测试一开始就起（这个文件排在那组的后面）


class Started:
    """
    这个模块要的进程都早早起、不等（SplitPair(…, wait=False)、Popen），只起这次选中的测试要的；它们 import、装模型的
    时候，别的测试照常跑——那些测试大多在等进程之间的消息，两个核常有一个闲着。备用的进程在后台（proc_util.background：
    最低的优先级），CPU 忙时让前台的测试先跑；测试拿到它们时调回前台。
    - 收集时："toy"（玩具模型的一对 _TOY，fixture pair 共用；没有选中用它的测试：关掉，None）；"parents"（_PARENTS，
      父进程被杀的测试的三个父进程；没有选中那个测试：杀掉，[]）。
    - 用真实模型的那组测试开始时（conftest.at_real_model_tail；只跑这个文件时：模块开头）："smollm2"（真实模型
      那一对，_start_smollm2，只装前 1 / 3 层，约 0.5 秒 CPU，内存新分配得慢的机器上要几秒；最后一个测试才用；在后台，
      spares() 调回前台；模型文件拿不到：None，那个测试自己跳过或失败）。
    - spares()（玩具的一对装好之后，或第一个要它们的测试）："victims"：被杀 worker 的测试各一对，起的时候父进程的环境里
      没有 BLAS 的变量（测试查 worker 里是一个线程、父进程的环境不变）。环境是整个进程的：收集时别的线程
      （tests/background_runs）可能正在起子进程，所以它们不在收集时起。
    """

    def __init__(self, request):
        items = [it for it in request.session.items if it.module is request.module]
        names = {it.name.split("[")[0] for it in items}
        self.names, self.victims, self.parents, self.spawned = names, [], [], False
        self.toy = _TOY if any("pair" in it.fixturenames for it in items) else None
        if self.toy is None:
            _TOY.close()
        if PARENT_TEST in names:
            self.parents = _PARENTS
        else:
            kill_and_close(_PARENTS)
        _start_smollm2(request.session)
        self.smollm2 = _SMOLLM2[0] if _SMOLLM2 else None

    def spares(self):
        if self.spawned:
            return self
        self.spawned = True
        if self.smollm2 is not None:
            foreground(q.pid for q in self.smollm2.procs)
        if VICTIM_TEST in self.names:
            saved = {v: os.environ.pop(v) for v in BLAS_ENV if v in os.environ}
            try:
                for _ in range(2):
                    p = SplitPair(DRAFT, TARGET, wait=False)
                    background(q.pid for q in p.procs)
                    self.victims.append((p, [v for v in BLAS_ENV if v in os.environ]))   # 起完之后父进程的环境里有的
            finally:
                os.environ.update(saved)
        return self

    def close(self):
        kill_and_close(self.parents)             # 测试没跑到（或中途失败）：父进程一死，它的 worker 跟着退出
        for p in [self.toy, self.smollm2] + [v[0] for v in self.victims]:
            if p is not None:
                p.close()


@pytest.fixture(scope="module", autouse=True)
def started(request):
    s = Started(request)
    yield s
    s.close()


@functools.lru_cache(maxsize=None)
def _models():
    return build_split_model(TARGET), build_split_model(DRAFT)


@pytest.fixture(scope="module")
def models():
    return _models()


@pytest.fixture(scope="module")
def pair(started):
    foreground(q.pid for q in started.toy.procs)
    p = started.toy.wait_ready()
    started.spares()
    yield p
    p.close()
    assert not any(q.is_alive() for q in p.procs)
    others = early_elsewhere(__name__)   # 别的模块收集时起的；别的测试的（真实模型那一对、被杀 worker 的那几对）
    for q in [started.smollm2] + [v[0] for v in started.victims]:      # 归它们的模块、测试关、查
        others |= set(q.procs) if q is not None else set()
    assert not set(mp.active_children()) - others, "没有留下子进程"


def seeds(T, n):
    """T = 1 时 n 个种子；T = 0 只要种子 0：贪心时 adjust 给 one-hot，每次抽样都落在 argmax，输出、每轮的接受数都和种子
    无关（三个参照在 T = 0 对种子 0..3 的输出逐 token 相同），别的种子只是把同一个请求再跑一遍。"""
    return range(n) if T else range(1)


def run(pair, protocol, gamma, T, seed, **kw):
    return pair.generate(PROMPT, kw.pop("n_new", N_NEW), num_speculative_tokens=gamma, T=T, seed=seed,
                         protocol=protocol, **kw)


def run_beside(pair, jobs, reference):
    """jobs（每个 (protocol, γ, T, seed, kw)）在一个线程里依次穿过这一对 worker，同时本进程按同样的顺序算 reference(job)
    -> [(job, (tokens, stats), 参照), …]。两边各用自己的核；参照和 worker 不共享状态（参照有自己的模型和发生器）。"""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(5e-4)     # 线程每个请求只收发三条控制消息：别让它等本进程的参照放 GIL 等满默认的 5 ms
    try:
        with ThreadPoolExecutor(1) as ex:
            fut = ex.submit(lambda: [run(pair, pr, g, T, s, **dict(kw)) for pr, g, T, s, kw in jobs])
            refs = [reference(job) for job in jobs]
            return list(zip(jobs, fut.result(), refs))
    finally:
        sys.setswitchinterval(switch)


@functools.lru_cache(maxsize=None)
def ref_speculative(gamma, T, seed):
    """speculative_generate 的参照：full_q、lazy_q 两个协议对同一个 (γ, T, seed) 用同一份（只算一次）。"""
    target, draft = _models()
    return speculative_generate(target, draft, PROMPT, N_NEW, gamma, T, np.random.default_rng(seed))


@functools.lru_cache(maxsize=None)
def ref_overlap(gamma, T, seed, point_mass):
    """overlap_speculative_generate 的参照：lazy_q、full_q（point_mass=False）共用一份。"""
    from overlap_spec_lab import overlap_speculative_generate
    target, draft = _models()
    return overlap_speculative_generate(target, draft, PROMPT, N_NEW, gamma, T, seed, point_mass=point_mass)


# ---------------------------------------------------------------------------
# 神谕：不重叠
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", ["full_q", "lazy_q"])
@pytest.mark.parametrize("T", [0.0, 1.0])
def test_full_q_and_lazy_q_equal_speculative_generate_token_for_token(pair, protocol, T):
    """一个发生器，状态跟着消息走：丢了状态（目标用自己的 default_rng(seed)、或者草稿不接回来）T = 1 时就不等。"""
    rejected = all_accepted = 0
    jobs = [(protocol, gamma, T, seed, ()) for gamma in (1, 3) for seed in seeds(T, 4)]
    for (_, gamma, _, seed, _), (out, st), (ref, rs) in run_beside(pair, jobs, lambda j: ref_speculative(*j[1:4])):
        assert out == [int(t) for t in ref], (gamma, seed)
        assert st["accepted"] == rs["accepted"] and st["rounds"] == rs["target_calls"]
        assert st["messages_to_target"] == st["messages_to_draft"] == st["rounds"]
        rejected += sum(n < gamma for n in st["accepted"])
        all_accepted += sum(n == gamma for n in st["accepted"])
    assert rejected and all_accepted, "两种轮都要走到（拒绝时 lazy_q 的 p_n 回到草稿那边）"


@pytest.mark.parametrize("T", [0.0, 1.0])
def test_point_mass_equals_dynamic_tree_with_one_candidate_per_level(pair, models, T):
    target, draft = models
    jobs = [("point_mass", gamma, T, seed, ()) for gamma in (1, 3) for seed in seeds(T, 3)]

    def reference(job):
        _, gamma, T, seed, _ = job
        return dynamic_tree_generate(target, draft, PROMPT, N_NEW, gamma, T, np.random.default_rng(seed),
                                     top_k=1, depth=gamma)
    for (_, gamma, _, seed, _), (out, st), (ref, rs) in run_beside(pair, jobs, reference):
        assert out == [int(t) for t in ref], (gamma, seed)
        assert st["accepted"] == rs["accepted"]
        assert rs["nodes"] == [gamma] * rs["target_calls"], "参照每轮验证的是一条 γ 个节点的链"


def test_stop_token_ends_the_request_like_speculative_generate(pair, models):
    target, draft = models
    stop = int(ref_speculative(2, 1.0, 1)[0][5])
    want, _ = speculative_generate(target, draft, PROMPT, N_NEW, 2, 1.0, np.random.default_rng(1), stop=stop)
    for protocol in ("lazy_q", "full_q"):
        out, _ = run(pair, protocol, 2, 1.0, 1, stop=stop)
        assert out == [int(t) for t in want] and out[-1] == stop and len(out) < N_NEW


def test_split_speculative_generate_starts_a_pair_runs_one_request_and_closes_it():
    """一次性的外观：起一对、跑一个请求、关掉；token 和接受数等于 speculative_generate，之后不留进程。"""
    before = set(mp.active_children())
    ref, rs = ref_speculative(2, 1.0, 5)
    out, st = split_speculative_generate(DRAFT, TARGET, PROMPT, N_NEW, num_speculative_tokens=2, T=1.0, seed=5)
    assert out == [int(t) for t in ref] and st["accepted"] == rs["accepted"] and st["protocol"] == "lazy_q"
    assert set(mp.active_children()) == before


def test_wall_times_only_when_timed(pair):
    _, st = run(pair, "lazy_q", 2, 1.0, 0)
    assert not any(k.endswith("_s") for k in st)
    _, st = run(pair, "lazy_q", 2, 1.0, 0, timed=True)
    assert st["wall_s"] >= st["wait_s"] > 0 and st["draft_s"] > 0 and st["verify_s"] > 0


def test_a_model_side_error_names_the_worker_and_the_pair_keeps_serving(pair):
    with pytest.raises(ValueError, match="worker"):
        pair.generate(list(range(250)), 20, num_speculative_tokens=3, T=1.0, seed=0)     # 超过 max_seq = 256
    out, _ = run(pair, "full_q", 2, 0.0, 0)
    assert out == [int(t) for t in ref_speculative(2, 0.0, 0)[0]]


@pytest.mark.parametrize("kw, what", [
    (dict(protocol="full_p"), "protocol"), (dict(num_speculative_tokens=0), "num_speculative_tokens"),
    (dict(link_delay_s=-1e-3), "link_delay_s"), (dict(link_bytes_per_s=0), "link_bytes_per_s"),
    (dict(overlap=1), "overlap"), (dict(T=-1.0), "T")])
def test_bad_arguments_are_refused_before_any_process_starts(kw, what):
    args = dict(num_speculative_tokens=2, T=1.0, seed=0)
    args.update(kw)
    before = len(mp.active_children())
    with pytest.raises(ValueError, match=what):
        split_speculative_generate(DRAFT, TARGET, PROMPT, 4, **args)
    with pytest.raises(ValueError, match="draft_recipe"):
        SplitPair(("toy", "tiny", 1), TARGET)
    assert len(mp.active_children()) == before


# ---------------------------------------------------------------------------
# 神谕：重叠（两条随机数流）
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", ["point_mass", "lazy_q", "full_q"])
@pytest.mark.parametrize("T", [0.0, 1.0])
def test_overlap_equals_overlap_speculative_generate_token_for_token(pair, protocol, T):
    """目标验证时草稿预先草稿 γ 个；拒绝之后还拿预先草稿的当下一轮（过时的草稿）、全部接受时还抽额外的 token、
    lazy_q 的修正 token 抽完不把目标那条流的状态送回去：T = 1 时都不等。"""
    kinds = set()
    jobs = [(protocol, gamma, T, seed, (("overlap", True),)) for gamma in (1, 3) for seed in seeds(T, 4)]
    reference = lambda j: ref_overlap(*j[1:4], point_mass=protocol == "point_mass")   # noqa: E731
    for (_, gamma, _, seed, _), (out, st), (ref, rs) in run_beside(pair, jobs, reference):
        assert out == [int(t) for t in ref], (gamma, seed)
        assert st["accepted"] == rs["accepted"]
        kinds |= {n == gamma for n in st["accepted"]}
    assert kinds == {True, False}, "全部接受（预先草稿的接上）和拒绝（预先草稿的扔掉）两种轮都要走到"


# ---------------------------------------------------------------------------
# 账：每轮的字节
# ---------------------------------------------------------------------------
def test_round_payload_bytes_by_hand():
    """γ = 3、V = 192、float64：id 4 字节，q / p 8 字节一个，状态 32 字节，个数 4 字节。"""
    assert round_payload_bytes("point_mass", 3, V, rejected=True) == (12, 8)
    assert round_payload_bytes("full_q", 3, V, rejected=False) == (12 + 3 * 192 * 8 + 32, 4 + 4 + 32)
    assert round_payload_bytes("lazy_q", 3, V, rejected=False) == (12 + 24 + 32, 4 + 4 + 32)
    assert round_payload_bytes("lazy_q", 3, V, rejected=True) == (12 + 24 + 32 + 4, 4 + 192 * 8 + 32)
    assert round_payload_bytes("full_q", 4, 49152, 4, rejected=False)[0] == 16 + 4 * 196608 + 32    # SmolLM2、float32
    assert round_payload_bytes("lazy_q", 3, V, rejected=True, overlap=True) == (12 + 24 + 4 + 32, 4 + 192 * 8 + 32)
    assert (ID_BYTES, COUNT_BYTES, RNG_STATE_BYTES) == (4, 4, 32)
    with pytest.raises(ValueError, match="protocol"):
        round_payload_bytes("q", 3, V, rejected=False)


@pytest.mark.parametrize("protocol", ["point_mass", "lazy_q", "full_q"])
def test_measured_payload_per_round_equals_the_formula(pair, protocol):
    """lazy_q 不能偷偷把整个 q 送过去：量到的有效载荷逐轮等于公式（最后一轮的修正 token 不再过去：减 4 字节）。"""
    gamma = 3
    for seed in range(3):
        _, st = run(pair, protocol, gamma, 1.0, seed)
        rows = [round_payload_bytes(protocol, gamma, V, rejected=n < gamma) for n in st["accepted"]]
        last = ID_BYTES if protocol == "lazy_q" and st["accepted"][-1] < gamma else 0
        assert st["payload_to_target"] == sum(r[0] for r in rows) - last
        assert st["payload_to_draft"] == sum(r[1] for r in rows)
        assert st["bytes_to_target"] >= st["payload_to_target"] + 8 * st["messages_to_target"]
        assert st["bytes_to_draft"] >= st["payload_to_draft"] + 8 * st["messages_to_draft"]


# ---------------------------------------------------------------------------
# 链路和模型时钟
# ---------------------------------------------------------------------------
def test_link_delivers_no_earlier_than_delay_plus_bytes_over_rate():
    a, b = mp.Pipe()
    tx, rx = Link(a, delay_s=2e-3), Link(b)
    t0 = time.perf_counter()
    tx.send(("v", np.zeros(4, dtype=np.int32)))
    rx.recv()
    assert time.perf_counter() - t0 >= 2e-3
    tx.configure(0.0, bytes_per_s=1e6)                       # 1 MB/s：两条 ~1 KB 的消息排队，第二条不早于 2 KB / 1 MB/s
    msg = np.zeros(125, dtype=np.float64)
    t0 = time.perf_counter()
    tx.send(msg)
    tx.send(msg)
    rx.recv()
    rx.recv()
    assert time.perf_counter() - t0 >= 2 * (1000 + 8) / 1e6
    assert tx.sent["messages"] == 2 and tx.sent["payload"] == 2000 and tx.sent["bytes"] > 2000 + 16
    a.close()
    b.close()


def test_round_trip_with_added_delay_is_at_least_two_delays():
    """两次量（各起一个回声的孩子）同时跑，两个孩子同时 import：断言都是不看机器快慢的（顺序、≥ 2 倍延迟的下界）。"""
    before = set(mp.active_children())
    with ThreadPoolExecutor(2) as ex:
        fast, slow = ex.submit(measure_round_trip, 200, warmup=20), ex.submit(measure_round_trip, 30, delay_s=1e-3,
                                                                               warmup=2)
        rt, rt_delay = fast.result(), slow.result()
    assert 0 < rt["min_s"] <= rt["p50_s"] <= rt["p90_s"]
    assert rt_delay["min_s"] >= 2e-3
    assert set(mp.active_children()) == before


def test_one_way_and_round_clock_by_hand():
    assert one_way_s(1000, 10e-6) == 10e-6                             # 没加延迟：管道自己的
    assert one_way_s(1000, 10e-6, 100e-6) == 100e-6
    assert one_way_s(10_000, 10e-6, 100e-6, 1e8) == pytest.approx(100e-6 + 100e-6)
    # γ = 4、草稿 1 ms、验证 10 ms、两程各 0.5 ms
    assert modelled_round_s(4, 1e-3, 10e-3, split=False) == pytest.approx(14e-3)
    assert modelled_round_s(4, 1e-3, 10e-3, split=True, to_target_s=5e-4, to_draft_s=5e-4) == pytest.approx(15e-3)
    kw = dict(split=True, overlap=True, to_target_s=5e-4, to_draft_s=5e-4)
    assert modelled_round_s(4, 1e-3, 10e-3, all_accepted=True, **kw) == pytest.approx(11e-3)        # max(4, 11)
    assert modelled_round_s(4, 1e-3, 10e-3, all_accepted=False, **kw) == pytest.approx(15e-3)       # + 4 个重新草稿
    assert modelled_round_s(4, 5e-3, 10e-3, all_accepted=True, **kw) == pytest.approx(20e-3)        # 草稿慢：max(20, 11)
    with pytest.raises(ValueError, match="overlap"):
        modelled_round_s(4, 1e-3, 10e-3, split=False, overlap=True)
    c = {"verify_ms": [2.0, 6.0, 6.5]}
    assert modelled_verify_s(3, c) == 6.5e-3
    with pytest.raises(ValueError, match="1..3"):
        modelled_verify_s(4, c)


# ---------------------------------------------------------------------------
# 故障
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("victim", [0, 1])
def test_a_killed_worker_fails_the_request_naming_it_in_bounded_time(victim, started):
    """这一对早早起了（Started.spares），起的时候父进程的环境里没有 BLAS 的变量。"""
    p, env_after = started.spares().victims[victim]
    try:
        foreground(q.pid for q in p.procs)
        p.wait_ready()
        assert p.draft_info["blas_threads"] == p.target_info["blas_threads"] == "1", "没设的变量：一个 BLAS 线程"
        assert "OPENBLAS_NUM_THREADS" not in env_after, "父进程的环境不变"
        threading.Timer(0.1, os.kill, (p.procs[victim].pid, signal.SIGKILL)).start()      # 请求要跑 ≥ 2 秒
        t0 = time.monotonic()
        with pytest.raises(WorkerDied, match=("草稿", "目标")[victim]):
            p.generate(PROMPT, 200, num_speculative_tokens=1, T=1.0, seed=0, link_delay_s=5e-3)   # 每轮 ≥ 10 ms
        assert time.monotonic() - t0 < 10
        assert not any(q.is_alive() for q in p.procs), "另一个 worker 也关掉了"
        with pytest.raises(WorkerDied):
            p.generate(PROMPT, 2, num_speculative_tokens=1, T=1.0, seed=0)
    finally:
        p.close()


def test_a_killed_interrupted_or_terminated_parent_leaves_no_worker_behind(started):
    """父进程在请求进行中被 SIGKILL、SIGTERM、Ctrl-C（SIGINT）：两个 worker 的控制管道关了，它们自己退出。
    三个父进程在收集时就起了（_PARENTS，PARENT_CODE）：各自起好一对、报了 pid，在这里才收到"go"开始请求。"""
    ps, sigs = started.parents, PARENT_SIGS
    foreground([p.pid for p in ps])             # 还没装好（忙的机器上）：先把父进程调回前台，它们之后起的 worker 跟着
    pids = [[int(x) for x in p.stdout.readline().split()] for p in ps]
    foreground([pid for ws in pids for pid in ws])
    assert [p.stdout.readline() for p in ps] == ["ready\n"] * len(ps), "worker 都装好了"
    for p in ps:
        p.stdin.write("go\n")
        p.stdin.flush()
    time.sleep(0.2)
    for p, sig in zip(ps, sigs):
        assert p.poll() is None, "父进程还在请求中"
        p.send_signal(sig)
    for p in ps:
        p.wait(10)
    left = []
    t0 = time.monotonic()
    for sig, ws in zip(sigs, pids):
        for pid in ws:
            while time.monotonic() - t0 < 10:
                if exited(pid):
                    break
                time.sleep(0.02)
            else:
                left.append((sig, pid))
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    for p in ps:
        assert "resource_tracker" not in p.stderr.read()
    assert not left, f"父进程结束之后这些 worker 还在：{left}"


# ---------------------------------------------------------------------------
# 真实模型一次
# ---------------------------------------------------------------------------
def test_smollm2_float64_split_lazy_q_equals_speculative_generate(started):
    """SmolLM2 float64 的前 3 层当目标、前 1 层当草稿（split_models_lab 的 smollm2-layers:3、smollm2-layers:1：worker
    里只为这几层做融合），T = 1，γ = 2，6 个 token；既有拒绝的轮（p_n 带着 49,152 个 float64 回到草稿那边）也有接受的。
    为什么 3 层的目标就够：两个进程逐 token 等于进程内的参照，靠的是两边按同一个配方造出逐位相同的模型、随机数发生器的状态
    跟着消息走、q 和 p_n 以 float64 原样过去——和层数无关；其余都是真的：49,152 的词表、9 个 Q 头对 3 个 KV 头、共享的
    lm_head、float64。30 层的目标要多融合约 1 GB 的权重、每轮多算 27 层，证明的是同一件事。
    这一对 worker 在用真实模型的那组测试开始时就起了（_start_smollm2）；它们跑请求的时候，本进程算参照。
    内存：两个 worker 只从文件装前 1 / 3 层（load_gguf(n_layers=K)），各到约 0.56 / 0.65 GB（VmHWM），
    测试进程里的参照约 2.2 GB（会话共用）。"""
    from conftest import real_model_path
    from drafts_lab import early_exit_draft
    from smollm2_models import smollm2_lm
    real_model_path()
    p = started.smollm2
    foreground(q.pid for q in p.procs)          # 只选了这个测试时，玩具的一对没起，它们还在后台
    model, cfg, tok = smollm2_lm("float64")
    prompt = tok.encode("The capital of France is")
    try:
        with ThreadPoolExecutor(1) as ex:
            fut = ex.submit(p.generate, prompt, 6, num_speculative_tokens=2, T=1.0, seed=3, protocol="lazy_q")
            target, draft = early_exit_draft(model, 3), early_exit_draft(model, 1)
            ref, rs = speculative_generate(target, draft, prompt, 6, 2, 1.0, np.random.default_rng(3))
            out, st = fut.result()
    finally:
        p.close()
    assert (p.draft_info["vocab"], p.target_info["vocab"]) == (cfg.vocab, cfg.vocab)
    assert out == [int(t) for t in ref] and st["accepted"] == rs["accepted"]
    assert min(st["accepted"]) < 2 and max(st["accepted"]) > 0, st["accepted"]
    assert not any(q.is_alive() for q in p.procs) and not set(p.procs) & set(mp.active_children())
