"""
引擎的基准（不是 pytest 的测试：文件名不以 test_ 开头）：SmolLM2-135M float32、一个 BLAS 线程。

三种用法（仓库根目录）：
  python3 tests/bench_engine.py [--batches 1,2,4,8,16,32,64]
      decode 一步的时间随批怎么变、引擎自己的开销（调度、块的账、建下标数组、postprocess）占一步的多少。
  python3 tests/bench_engine.py --profile [--batches …] [--contexts 64,256]
  （这两种都可以加 --temperature T（默认 0：贪心）和 --sample-threads N（默认 1；引擎的 sample_threads）：
   T > 0 时一行的抽样是 [V] 的 softmax + 累积和，批大时占一步的几个百分点，两个线程各抽一半）
      一步的账（ledger）：每类算子（qkv、注意力、o、gate/up、down、lm_head、取 K/V、其余的逐元素运算、抽样、调度）
      量到的时间，旁边是账上的 FLOPs 和字节、达到的 GFLOP/s 和 GB/s，和同一个形状的矩阵乘单独跑（权重是模型自己
      那 30 层的矩阵、不够 96 MiB 时加几份拷贝，一个接一个地乘：从内存流过来，不在缓存里）的时间——那是这个算子
      自己的上限；还有"一次 GEMM"
      和"一行一次"在 M = 1…8 行上的比较（runner_lab.ROWWISE_MAX_ROWS 从这里来）。
  python3 tests/bench_engine.py --calibrate [--write]
      量一串真实的引擎步（decode：批 1, 2, 3, 4, 8, 16, 32, 64 × 上下文 64 和 256；prefill 的块；decode 和 prefill
      混在一起的步），把 runner_lab.modelled_step_time 的五个常数拟合上去，打印每一步的残差（模型 / 实测 − 1）。
      加 --write 才把常数、这台机器（CPU、numpy、BLAS）、日期、残差写进 lecture05/cpu_calibration.json 的
      "engine_step" 一节（别的节原样保留）：学生的运行从不改页面。先量 "heterogeneous" 一节（链路的往返、split 那一对
      玩具模型的代价，calibrate_heterogeneous）；只量它：--calibrate heterogeneous [--write] [--note "一句话"]。
      之后再量解耦的一节（calibrate_disaggregation：两个 worker 进程的共享总线 κ_dd、κ_dp，管道和共享内存的速率，
      各 3 次的中位数），--write 时写进 "disaggregation"；只量它：--calibrate disaggregation [--write]。
      只量引擎一步的一节（引擎的分派改了以后重新标定它，另外两节不动）：--calibrate engine_step [--write]。

每一步取 3 次里最快的一次。decode 的步之前那些 prefill 不跑模型（TimingRunner 直接给一个占位的 token，K/V 留着
零）：量的是一步的时间，不看 token 的值，这样批 64、上下文 256 也不用先 prefill 一万六千个 token。
这台机器的速度一小时里能差两倍：目标都是同一次运行里的比值；量之前看 uptime 的负载。
"""
import datetime
import itertools
import json
import os
import platform
import sys
import time

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _sub in ("lecture01", "lecture02", "lecture05", "lecture06"):
    sys.path.insert(0, os.path.join(ROOT, _sub))

import numpy as np  # noqa: E402

from engine_lab import LLMEngine  # noqa: E402
import runner_lab  # noqa: E402
from runner_lab import CALIBRATION_PATH, COST_KEYS, ModelRunner, modelled_step_time, step_counts  # noqa: E402

BLOCK, REPEAT = 16, 3
DECODE_BATCHES = (1, 2, 3, 4, 8, 16, 32, 64)
CONTEXTS = (64, 256)
PREFILL_CHUNKS = (16, 64, 128, 256)
MIXED = ((4, 128), (16, 64), (8, 256))          # (decode 的序列数, 同一步里 prefill 的 token 数)，上下文 64
SECTION = "engine_step"
COMMAND = "python3 tests/bench_engine.py --calibrate --write"
GOAL_FIT = 0.15


class TimingRunner:
    """包着真的 ModelRunner：real 为 False 时不跑模型（抽样的段给 token 1），True 时照常跑。"""

    def __init__(self, runner):
        self.inner, self.real = runner, False

    @property
    def prepare_s(self):
        return self.inner.prepare_s if self.real else 0.0

    def run(self, chunks):
        if self.real:
            return self.inner.run(chunks)
        return [1 if c.sample else None for c in chunks], None


TEMPERATURE, SAMPLE_THREADS = 0.0, 1                 # --temperature T、--sample-threads N（decode 的步；标定不用）


def make_engine(model, cfg, n_seqs, ctx):
    nb = max(-(-cfg.max_seq // BLOCK), (n_seqs + 1) * -(-(ctx + 260 + REPEAT + 2) // BLOCK))
    runner = TimingRunner(ModelRunner(model, cfg, nb, BLOCK, sample_threads=SAMPLE_THREADS))
    budget = (n_seqs + 1) * (ctx + 1) + 512          # 占位的 prefill 一步做完（不跑模型，预算大也不花时间）
    eng = LLMEngine(None, cfg, nb, block_size=BLOCK, max_num_batched_tokens=budget, max_num_seqs=n_seqs + 1,
                    enable_prefix_caching=False, runner=runner, clock="wall")
    return eng, runner


def prompt(i, n):
    return [(7 * i + j) % 1000 + 100 for j in range(n)]


def timed_step(eng):
    t0 = time.perf_counter()
    eng.step()
    return time.perf_counter() - t0, eng.steps[-1]


def measure_decode(model, cfg, B, ctx, timer=None):
    """-> (最快一步的秒数, 那一步的开销秒数, 那一步的账 chunks)：B 个序列各缓存 ctx 个 token 时的 decode 一步。"""
    eng, runner = make_engine(model, cfg, B, ctx)
    for b in range(B):
        eng.add_request(prompt(b, ctx), REPEAT + 2, TEMPERATURE, b)
    while eng.scheduler.waiting or any(not r.output for r in eng.requests):
        eng.step()                                             # 占位的 prefill
    runner.real, best = True, None
    for _ in range(REPEAT):
        if timer is not None:
            runner.inner.timer = {}
        dt, s = timed_step(eng)
        if timer is not None:                                  # 每一项取几步里最少的（别的进程抢走 CPU 的那一步不算）
            runner.inner.timer.update(step=dt, engine=s["overhead"] - runner.prepare_s)
            for k, v in runner.inner.timer.items():
                timer[k] = min(timer.get(k, v), v)
        if s["decodes"] == B and (best is None or dt < best[0]):
            best = (dt, s["overhead"])
    runner.inner.timer = None
    if best is None:
        raise RuntimeError(f"批 {B}、上下文 {ctx}：没有一步是纯 decode（last_error = {eng.last_error!r}）")
    return best[0], best[1], [(1, ctx + 1, True)] * B


def measure_prefill(model, cfg, n):
    """-> (最快一步的秒数, 开销, 账)：一个 n 个 token 的提示一步 prefill 完（抽第一个 token）。"""
    best = None
    for _ in range(REPEAT):
        eng, runner = make_engine(model, cfg, 1, n)
        runner.real = True
        eng.add_request(prompt(0, n), 1)
        dt, s = timed_step(eng)
        if best is None or dt < best[0]:
            best = (dt, s["overhead"])
    return best[0], best[1], [(n, 0, True)]


def measure_mixed(model, cfg, B, n, ctx=64):
    """-> (最快一步的秒数, 开销, 账)：B 个序列 decode（上下文 ctx）+ 一个新请求的 n 个提示 token 一步。"""
    best = None
    for rep in range(REPEAT):
        eng, runner = make_engine(model, cfg, B, ctx)
        for b in range(B):
            eng.add_request(prompt(b, ctx), REPEAT + 2)
        eng.step()                                             # 占位的 prefill：B 个提示一步
        eng.add_request(prompt(B + rep, n), 2)
        runner.real = True
        dt, s = timed_step(eng)
        if s["decodes"] == B and s["prefill"] == n and (best is None or dt < best[0]):
            best = (dt, s["overhead"])
    return best[0], best[1], [(1, ctx + 1, True)] * B + [(n, 0, True)]


# ---------------------------------------------------------------------------
# 拟合
# ---------------------------------------------------------------------------
def _nnls(X, y):
    """非负最小二乘（贪心：解一次，有负的就把最负的那一项固定成 0 再解）-> (p, 残差平方和)。"""
    active = list(range(X.shape[1]))
    while True:
        p = np.zeros(X.shape[1])
        if active:
            p[active] = np.linalg.lstsq(X[:, active], y, rcond=None)[0]
        if not active or p[active].min() >= 0:
            r = X @ p - y
            return p, float(r @ r)
        active.remove(active[int(np.argmin(p[active]))])


def fit_cost(points, n_grid=31, rounds=3):
    """
    points：[(账 dict, 实测秒)] -> 常数的 dict（COST_KEYS），使相对残差的平方和最小。

    【推导】给定算力 F、带宽 BW、overlap ω，模型时间对其余五个量是线性的：1 / KV 速率、每步 a、每序列 b，和一行一次的
    两个系数 u = 1 / gemv 带宽、v = reread / gemv 带宽（只在行数 ≤ ROWWISE_MAX_ROWS 的步上不为 0）：加权（1/实测）
    非负最小二乘。F、BW 在对数网格上搜，ω 在 0…1 上搜，最好的一格附近再细搜。
    """
    R = runner_lab.ROWWISE_MAX_ROWS
    t = np.array([m for _, m in points])
    fl = np.array([c["flops"] for c, _ in points])
    kv = np.array([c["kv_bytes"] for c, _ in points])
    by = np.array([c["bytes"] for c, _ in points]) - kv
    sq = np.array([c["seqs"] for c, _ in points], dtype=float)
    M = np.array([c["tokens"] for c, _ in points], dtype=float)
    row = M <= R
    w = 1.0 / t
    X = np.stack([kv * w, w, sq * w, by * row * w, by * (M - 1) * row * w], axis=1)

    def solve(F, BW, om):
        tf, tb = fl / F, by / BW
        g = np.where(row, 0.0, np.maximum(tf, tb) + (1 - om) * np.minimum(tf, tb))
        p, err = _nnls(X, (t - g) * w)
        return err, p

    grid_f, grid_b = np.geomspace(5e9, 400e9, n_grid), np.geomspace(2e9, 100e9, n_grid)
    grid_o = np.linspace(0, 1, 11)
    best = None
    for _ in range(rounds):
        for F in grid_f:
            for BW in grid_b:
                for om in grid_o:
                    err, p = solve(F, BW, om)
                    if best is None or err < best[0]:
                        best = (err, F, BW, om, p)
        _, F, BW, om, _ = best
        grid_f = np.geomspace(F / 1.25, F * 1.25, n_grid // 2)
        grid_b = np.geomspace(BW / 1.25, BW * 1.25, n_grid // 2)
        grid_o = np.clip(np.linspace(om - 0.1, om + 0.1, 11), 0, 1)
    _, F, BW, om, p = best
    u = p[3] if p[3] > 0 else 1e-30
    return {"flops_per_s": float(F), "bytes_per_s": float(BW), "overlap": float(om),
            "kv_bytes_per_s": float(1 / p[0]) if p[0] > 0 else 1e30, "gemv_bytes_per_s": float(1 / u),
            "reread": float(p[4] / u), "rowwise_rows": R, "step_s": float(p[1]), "seq_s": float(p[2])}


def machine_info():
    """这台机器：CPU 型号（/proc/cpuinfo）、核数、numpy 和 BLAS 的版本（numpy.show_config）、BLAS 的线程数。"""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    blas = "unknown"
    try:
        cfg = np.show_config(mode="dicts")
        b = cfg["Build Dependencies"]["blas"]
        blas = f"{b.get('name')} {b.get('version')}"
    except Exception:                                   # numpy < 1.26 没有 mode="dicts"
        pass
    try:
        load1 = os.getloadavg()[0]
    except OSError:
        load1 = float("nan")
    return {"cpu": cpu, "logical_cpus": os.cpu_count(), "numpy": np.__version__, "blas": blas,
            "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"), "python": platform.python_version(),
            "load_avg_1min_at_start": round(load1, 2)}


def mark_load_at_end(info):
    """量完时的 1 分钟负载记进 info；开始或结束时 > 1.5（2 核机器上除了量的进程还有别的在跑）就标 loaded。"""
    try:
        info["load_avg_1min_at_end"] = round(os.getloadavg()[0], 2)
    except OSError:
        info["load_avg_1min_at_end"] = float("nan")
    info["loaded"] = bool(max(info["load_avg_1min_at_start"], info["load_avg_1min_at_end"]) > 1.5)


def write_section(name, section):
    """把一节写进 lecture05/cpu_calibration.json（别的节原样保留），打印写了哪一节。"""
    try:
        with open(CALIBRATION_PATH, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        doc = {}
    doc.setdefault("schema", 1)
    doc.setdefault("sections", {})[name] = section
    with open(CALIBRATION_PATH, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"写进了 {os.path.relpath(CALIBRATION_PATH, ROOT)} 的 {name!r} 一节")


def calibrate(model, cfg, write, command=COMMAND):
    info = machine_info()
    points = []
    print(f"标定：{info['cpu']}，numpy {info['numpy']}，BLAS {info['blas']}，"
          f"{info['blas_threads']} 个线程；开始时 1 分钟负载 {info['load_avg_1min_at_start']}")
    for ctx in CONTEXTS:
        for B in DECODE_BATCHES:
            dt, ov, chunks = measure_decode(model, cfg, B, ctx)
            points.append((f"decode B={B} ctx={ctx}", chunks, dt, ov))
    for n in PREFILL_CHUNKS:
        dt, ov, chunks = measure_prefill(model, cfg, n)
        points.append((f"prefill {n}", chunks, dt, ov))
    for B, n in MIXED:
        dt, ov, chunks = measure_mixed(model, cfg, B, n)
        points.append((f"mixed B={B}+{n}", chunks, dt, ov))
    data = [(step_counts(cfg, ch), dt) for _, ch, dt, _ in points]
    cost = fit_cost(data)
    old = runner_lab.CPU_COST
    rows, worst = [], 0.0
    print(f"{'步':<20}{'实测 ms':>9}{'模型 ms':>9}{'残差':>8}{'旧常数 ms':>11}{'开销占比':>9}")
    for (name, ch, dt, ov), (cnt, _) in zip(points, data):
        mod, mod_old = modelled_step_time(cnt, cost), modelled_step_time(cnt, old)
        res = mod / dt - 1
        worst = max(worst, abs(res))
        rows.append({"step": name, "measured_ms": round(dt * 1e3, 3), "modelled_ms": round(mod * 1e3, 3),
                     "residual": round(res, 4), "host_share": round(ov / dt, 4)})
        print(f"{name:<20}{dt * 1e3:>9.1f}{mod * 1e3:>9.1f}{res:>+8.1%}{mod_old * 1e3:>11.1f}{ov / dt:>9.1%}")
    print("拟合：" + "，".join(f"{k} = {cost[k]:.4g}" for k in COST_KEYS))
    print(f"最大 |残差| = {worst:.1%}（目标 ≤ {GOAL_FIT:.0%}：{'达到' if worst <= GOAL_FIT else '没达到'}）")
    mark_load_at_end(info)
    section = {"command": command, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "machine": info, "model": f"SmolLM2-135M {cfg.dtype}",
               "form": "tokens > rowwise_rows: max(t_f, t_w) + (1 - overlap) * min(t_f, t_w); tokens <= rowwise_rows: "
                       "(bytes - kv_bytes) / gemv_bytes_per_s * (1 + (tokens - 1) * reread); plus kv_bytes / "
                       "kv_bytes_per_s + step_s + seqs * seq_s; t_f = flops / flops_per_s, t_w = (bytes - kv_bytes) "
                       "/ bytes_per_s (runner_lab.step_counts, runner_lab.modelled_step_time)",
               "constants": cost, "fit": {"max_abs_residual": round(worst, 4), "goal": GOAL_FIT, "points": rows}}
    if write:
        write_section(SECTION, section)
    else:
        print("没有写文件（加 --write 才写）")
    return section


# ---------------------------------------------------------------------------
# 异构的草稿（lecture05/link_lab、split_clock_lab、split_models_lab）："heterogeneous" 一节
# ---------------------------------------------------------------------------
HETERO_SECTION = "heterogeneous"
HETERO_COMMAND = "python3 tests/bench_engine.py --calibrate heterogeneous --write"
HETERO_PAIR = ("split:0", "split-draft:0")              # (目标, 草稿) 的配方


def calibrate_heterogeneous(write, note=""):
    """
    量拆开的投机解码要的常数，写进 cpu_calibration.json 的 "heterogeneous" 一节（别的节原样保留）：
    链路的往返（split_worker_lab.measure_round_trip：父进程 ↔ spawn 的孩子，经 Link；不加延迟、加 100 µs、加 1 ms），
    这一对玩具模型 decode 一步（split_models_lab.measure_pair_costs）和目标验证 n = 1..9 个位置（measure_verify_ms）。
    不读 SmolLM2。note：写进 machine 的一句话（例如"别的进程也在跑"）。
    """
    from split_models_lab import measure_pair_costs
    from link_lab import measure_round_trip
    from split_clock_lab import measure_verify_ms
    info = machine_info()
    print(f"标定异构的一节：{info['cpu']}，{info['blas_threads']} 个 BLAS 线程；开始时 1 分钟负载 "
          f"{info['load_avg_1min_at_start']}")
    rt = measure_round_trip(2000)
    rt100 = measure_round_trip(500, delay_s=100e-6)
    rt1m = measure_round_trip(100, delay_s=1e-3)
    pair = measure_pair_costs(*HETERO_PAIR)
    ver = measure_verify_ms(HETERO_PAIR[0])
    c = {"rtt_p50_s": rt["p50_s"], "rtt_p90_s": rt["p90_s"], "rtt_min_s": rt["min_s"],
         "rtt_delay_100us_p50_s": rt100["p50_s"], "rtt_delay_1ms_p50_s": rt1m["p50_s"],
         "target_ms": pair["target_ms"], "draft_ms": pair["draft_ms"], "c": pair["c"], "verify_ms": ver["verify_ms"]}
    print(f"链路往返：p50 {rt['p50_s'] * 1e6:.1f} µs、p90 {rt['p90_s'] * 1e6:.1f} µs（{rt['n']} 次，消息 "
          f"{rt['wire_bytes']} 字节）；加 100 µs：p50 {rt100['p50_s'] * 1e6:.1f} µs；加 1 ms：p50 "
          f"{rt1m['p50_s'] * 1e6:.1f} µs")
    print(f"{HETERO_PAIR[0]} 一步 {pair['target_ms']:.3f} ms，{HETERO_PAIR[1]} 一步 {pair['draft_ms']:.3f} ms，"
          f"c = {pair['c']:.3f}；验证 n = 1..{len(ver['verify_ms'])} 个位置："
          + " ".join(f"{v:.2f}" for v in ver["verify_ms"]) + " ms")
    mark_load_at_end(info)
    if note:
        info["note"] = note
    section = {"command": HETERO_COMMAND,
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "machine": info, "model": f"target {HETERO_PAIR[0]}, draft {HETERO_PAIR[1]} (split_models_lab), "
                                         "float64, one BLAS thread; link = a pipe between two spawned processes",
               "form": "one way = max(rtt_p50_s / 2, delay + bytes / link rate) (link_lab.one_way_s); "
                       "round = gamma * draft_ms + verify_ms[gamma] + two one-way times, or with overlap "
                       "max(gamma * draft_ms, verify + link) (+ gamma * draft_ms after a rejection) "
                       "(split_clock_lab.modelled_round_s, modelled_verify_s)",
               "constants": c}
    if write:
        write_section(HETERO_SECTION, section)
    else:
        print("没有写文件（加 --write 才写）")
    return section


# 解耦的一节（"disaggregation"）：共享总线的 κ、管道和共享内存的速率（lockstep_lab 的模型时钟用它们）
# ---------------------------------------------------------------------------
DISAGG_SECTION, DISAGG_RUNS = "disaggregation", 3


def calibrate_disaggregation(write, runs=DISAGG_RUNS):
    """
    量两个 spawn 的 SmolLM2 float32 worker 的 κ_dd、κ_dp（worker_lab.measure_bus）和管道、共享内存的速率
    （worker_lab.measure_link，父进程 → 孩子，收进孩子自己的数组）-> 这一节的 dict；各取 runs 次的中位数，打印每一次。
    write：写进 lecture05/cpu_calibration.json 的 "disaggregation" 一节（别的节原样保留）。
    """
    from hub_lab import gguf_path
    from worker_lab import measure_bus, measure_link
    info = machine_info()
    print(f"解耦的一节：开始时 1 分钟负载 {info['load_avg_1min_at_start']}（两个 worker 各占一个核：机器要空着）")
    recipe = ("gguf", gguf_path(), "float32")
    bus, pipe, shm = [], [], []
    for i in range(runs):
        bus.append(measure_bus(recipe))
        pipe.append(measure_link("pipe"))
        shm.append(measure_link("shm"))
        b = bus[-1]
        print(f"第 {i + 1} 次：decode 单独 {b['decode_alone_s'] * 1e3:.2f} ms，κ_dd = {b['kappa_dd']:.3f}，"
              f"κ_dp = {b['kappa_dp']:.3f}；管道 {pipe[-1] / 1e9:.3f} GB/s，共享内存 {shm[-1] / 1e9:.3f} GB/s")
    med = lambda xs: float(np.median(xs))  # noqa: E731
    const = {"decode_alone_s": round(med([b["decode_alone_s"] for b in bus]), 6),
             "kappa_dd": round(med([b["kappa_dd"] for b in bus]), 4),
             "kappa_dp": round(med([b["kappa_dp"] for b in bus]), 4),
             "pipe_bytes_per_s": med(pipe), "shm_bytes_per_s": med(shm)}
    print("中位数：" + "，".join(f"{k} = {v:.4g}" for k, v in const.items()))
    mark_load_at_end(info)
    section = {"command": COMMAND + f" (section {DISAGG_SECTION!r}: medians of {runs} runs)",
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "machine": info, "model": "SmolLM2-135M float32, two spawned workers, one BLAS thread each",
               "form": "a decode step beside another decoding worker takes kappa_dd times as long, beside a worker "
                       "running prefill kappa_dp times (worker_lab.measure_bus); a handoff of n bytes takes n / "
                       "pipe_bytes_per_s or n / shm_bytes_per_s (worker_lab.measure_link: parent -> spawned child, "
                       "received into the child's arrays)",
               "constants": const}
    if write:
        write_section(DISAGG_SECTION, section)
    else:
        print("没有写文件（加 --write 才写）")
    return section


# ---------------------------------------------------------------------------
# 一步的账
# ---------------------------------------------------------------------------
WEIGHT_OPS = ("qkv", "o_proj", "gate_up", "down", "lm_head")


def weight_of(model, op, li):
    if op == "lm_head":
        return model._head
    return model._layers[li][{"qkv": 0, "o_proj": 1, "gate_up": 2, "down": 3}[op]]


STREAM_BYTES = 96 << 20          # 单独跑时一轮乘过的权重至少这么多字节（3 倍于这台机器的 32 MiB L3）：从内存流过来
_STREAM = {}


def stream_set(model, op):
    """op 的权重矩阵：模型自己那 30 层（lm_head 一个），不够 STREAM_BYTES 时再加几份拷贝——下一次用到一个矩阵时它已经被挤出缓存。"""
    if op not in _STREAM:
        cfg = model.cfg
        Ws = [weight_of(model, op, -1)] if op == "lm_head" else [weight_of(model, op, li) for li in range(cfg.n_layers)]
        total = sum(w.nbytes for w in Ws)
        extra = [w.copy() for _ in range(max(0, -(-STREAM_BYTES // total) - 1)) for w in Ws]
        _STREAM[op] = Ws + extra
    return _STREAM[op]


def alone(model, op, M, mm):
    """同一个形状单独跑：x [M, k] 依次乘 stream_set 里的矩阵（权重从内存流过来）-> 一步里这个算子的秒数（按层数折算）。"""
    Ws = stream_set(model, op)
    n_step = 1 if op == "lm_head" else model.cfg.n_layers
    x = np.random.default_rng(0).standard_normal((M, Ws[0].shape[0])).astype(Ws[0].dtype)
    best = float("inf")
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        for W in Ws:
            mm(x, W)
        best = min(best, (time.perf_counter() - t0) / len(Ws) * n_step)
    return best


def gemm(x, w):
    return x @ w


def profile(model, cfg, batches, contexts):
    print("一次 GEMM vs 一行一次（权重从内存流过来；一步里这个算子的 ms：30 层，lm_head 一次）：")
    print(f"{'M':>3}" + "".join(f"{op:>18}" for op in WEIGHT_OPS))
    for M in range(1, 9):
        cells = []
        for op in WEIGHT_OPS:
            g, r = alone(model, op, M, gemm), alone(model, op, M, runner_lab.rowwise_matmul)
            cells.append(f"{g * 1e3:>7.2f}/{r * 1e3:<7.2f}{'*' if r < g else ' '}")
        print(f"{M:>3}  " + "  ".join(f"{c:>16}" for c in cells))
    print("（GEMM/一行一次；* = 一行一次快。runner_lab.ROWWISE_MAX_ROWS = "
          f"{runner_lab.ROWWISE_MAX_ROWS}：M ≤ 它时一行一次）")
    for ctx in contexts:
        for B in batches:
            timer = {}
            dt, ov, _ = measure_decode(model, cfg, B, ctx, timer)
            steps = 1
            print(f"\n批 {B}、每个序列缓存 {ctx} 个 token：一步 {dt * 1e3:.1f} ms（最快的一步）；"
                  f"下面每一项是 {REPEAT} 步里最少的")
            print(f"{'算子':<10}{'ms':>8}{'GFLOP':>8}{'MB':>8}{'GFLOP/s':>9}{'GB/s':>7}{'单独 ms':>9}{'× 单独':>8}")
            ledger = runner_lab.decode_op_ledger(cfg, B, ctx)
            for op in WEIGHT_OPS + ("attention", "gather", "other", "sample", "prepare", "engine"):
                t = timer.get(op, 0.0) / steps
                f, b = ledger.get(op, (0, 0))
                line = f"{op:<10}{t * 1e3:>8.2f}{f / 1e9:>8.3f}{b / 1e6:>8.1f}"
                line += f"{f / t / 1e9 if t and f else 0:>9.1f}{b / t / 1e9 if t and b else 0:>7.1f}"
                if op in WEIGHT_OPS:
                    a = min(alone(model, op, B, gemm), alone(model, op, B, runner_lab.dispatch_matmul))
                    line += f"{a * 1e3:>9.2f}{t / a:>8.2f}"
                print(line)
            step = timer.pop("step") / steps
            rest = step - sum(timer.values()) / steps
            sched = (timer.get("prepare", 0) + timer.get("engine", 0)) / steps
            host = sched + timer.get("sample", 0) / steps
            print(f"{'未计入':<10}{rest * 1e3:>8.2f}   （最快的一步 {step * 1e3:.1f} ms − 上面各项的最小值）")
            print(f"主机的活（抽样 + 建下标 + 调度和 postprocess）占一步 {host / step:.1%}，"
                  f"其中建下标 + 调度和 postprocess {sched / step:.1%}（抽样 {SAMPLE_THREADS} 个线程）")


def decode_table(model, cfg, batches):
    print(f"SmolLM2-135M {cfg.dtype}，一个 BLAS 线程，每个序列缓存 64 个 token；每个批量 {REPEAT} 步 decode 取最快；"
          f"温度 {TEMPERATURE:g}，抽样 {SAMPLE_THREADS} 个线程")
    print(f"{'批':>4}  {'一步 ms':>9}  {'token/s':>9}  {'× 批 1':>7}  {'开销 ms':>8}  {'开销占比':>8}  {'模型 ms':>8}")
    base, res = None, {}
    for B in batches:
        dt, ov, ch = measure_decode(model, cfg, B, 64)
        tps = B / dt
        base = base or tps
        res[B] = (dt, ov, tps)
        mod = modelled_step_time(step_counts(cfg, ch))
        print(f"{B:>4}  {dt * 1e3:>9.1f}  {tps:>9.1f}  {tps / base:>7.2f}  {ov * 1e3:>8.2f}  {ov / dt:>8.1%}  "
              f"{mod * 1e3:>8.1f}")
    if 1 in res:
        for B, lim in ((2, 1.3), (4, 1.6)):
            if B in res:
                print(f"批 {B} 一步 / 批 1 一步 = {res[B][0] / res[1][0]:.2f}（目标 ≤ {lim}）")
        if 16 in res:
            print(f"批 16 / 批 1 的吞吐 = {res[16][2] / res[1][2]:.2f} 倍（目标 ≥ 5）")
    if 64 in res:
        dt, _, _ = measure_prefill(model, cfg, 64)
        print(f"批 64 decode {res[64][2]:.0f} token/s；64 个 token 的 prefill {64 / dt:.0f} token/s；"
              f"比值 {res[64][2] / (64 / dt):.2f}（目标 ≥ 0.75）")
    print(f"开销占一步最多 {max(v[1] / v[0] for v in res.values()):.1%}（目标 ≤ 5%）")


def main(argv):
    from real_model_lab import load_gguf
    from transformer_lab import NumpyTransformer
    batches = (1, 2, 4, 8, 16, 32, 64)
    if "--batches" in argv:
        batches = tuple(int(x) for x in argv[argv.index("--batches") + 1].split(","))
    global TEMPERATURE, SAMPLE_THREADS
    if "--temperature" in argv:
        TEMPERATURE = float(argv[argv.index("--temperature") + 1])
    if "--sample-threads" in argv:
        SAMPLE_THREADS = int(argv[argv.index("--sample-threads") + 1])
    contexts = CONTEXTS
    if "--contexts" in argv:
        contexts = tuple(int(x) for x in argv[argv.index("--contexts") + 1].split(","))
    only_engine = SECTION in argv                      # --calibrate engine_step：只量引擎一步的一节
    if "--calibrate" in argv and DISAGG_SECTION not in argv and not only_engine:   # 异构的一节（玩具模型和链路，不读 SmolLM2）；只要这一节：加 heterogeneous
        note = argv[argv.index("--note") + 1] if "--note" in argv[:-1] else ""
        calibrate_heterogeneous("--write" in argv, note)
        if HETERO_SECTION in argv:
            return
    P, cfg, _ = load_gguf(dtype=np.float32)
    model = NumpyTransformer(P, cfg)
    if "--calibrate" in argv:
        if DISAGG_SECTION not in argv:                 # 只要解耦的一节：--calibrate disaggregation [--write]
            calibrate(model, cfg, "--write" in argv,
                      command=f"python3 tests/bench_engine.py --calibrate {SECTION} --write" if only_engine else COMMAND)
        if not only_engine:
            calibrate_disaggregation("--write" in argv)
    elif "--profile" in argv:
        profile(model, cfg, batches, contexts)
    else:
        decode_table(model, cfg, batches)


if __name__ == "__main__":
    main(sys.argv[1:])
