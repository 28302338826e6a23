"""
=============================================================================
CS349E · 第 5 讲 · 10_disaggregation_measured.py —— 真的解耦：两个引擎进程、一个 KV 交接、几个副本前面的路由器
=============================================================================

【这个脚本要回答的问题】
演示 1：一次交接真的要搬多少字节：第 1 讲的公式（2 · 层 · KV 头 · head_dim · 字节）对 KVHandoff.nbytes；
SmolLM2 一个 1,024 token 的提示的交接，放在它的 prefill 旁边、放在 05/03 的 NVLink / InfiniBand / PCIe 旁边要多久。
演示 2：两个核共用一条内存总线：一个 decode 步单独跑、旁边另一个进程也在 decode、旁边另一个进程在 prefill。
演示 3：DistServe 的实验搬到两个核上：同一串请求（泊松到达、05/09 那样的长度），三种部署——2 个副本整段 prefill、
2 个副本分块 prefill、1 个 prefill + 1 个 decode——TTFT、TPOT、最长卡顿、SLO 达标率和 goodput；05/02 在 H100 上的
结论哪些在 CPU 上还成立。
演示 4：几个系统提示、多轮追问的工作负载交给 2 个副本：三种路由策略各让前缀缓存命中多少、要 prefill 多少、TTFT 多长。

【怎么读输出】每个演示的标题说它用哪个时钟。"模型时钟"：worker 进程是真的（multiprocessing spawn），KV 的字节是真的
送过管道 / 共享内存的，但时间按模型算（lockstep_lab：路由器每次推模型时间最早的 worker 一步；一步单独的时间 =
runner_lab.modelled_step_time；交接在发出的时刻 + 字节 / 存下的链路速率到达；两个 worker 的忙碌区间重叠时，decode 步
慢 κ_dd（旁边 decode）或 κ_dp（旁边 prefill）倍）——所以每次打印一样的字节。--live 时旁边多一列墙钟上量到的。
TTFT = 第一个 token − 到达；解耦时第一个 token 在交接到达 decode 那边的时刻才算数（像 vLLM 的代理：用户看到的
第一个 token 来自 decode 实例）。TPOT = (最后一个 − 第一个) / (token 数 − 1)；最长卡顿 = 所有请求相邻两个 token 之间
最长的那次等待；达标 = TTFT 和 TPOT 同时不超过目标。
交接的形状：decode 那边先留块和一个序列的空位，prefill 那边算完提示、抽出第一个 token，连同 KV 和随机数发生器的状态一起
送过去（SGLang 也由 prefill 那边抽第一个 token；vLLM 的代理让 prefill 实例的请求 max_tokens=1 结束、丢掉它的 token，
decode 实例自己再算出第一个）。导入的请求在 decode 那边是最新的：块不够时它最先被挤出、重算——token 不变（随机数发生器
只在抽样时前进），但那次传输白费了。

【模型的假设（务必看）】
- 默认运行不装权重：演示 1 的第一张表是玩具模型（LMConfig(max_seq=64)，float64，种子 1）；其余 worker 是
  ("replay", "smollm2", 7)——SmolLM2-135M 的形状（float32），不跑模型，每个位置抽出占位的 token 7（输出长度 =
  max_tokens，同 05/09），交接的 K、V 是同样大小的 0：字节真实，内容不是。
- 一步的时间：lecture05/cpu_calibration.json 的 "engine_step" 一节（05/08、05/09 的时钟）；κ_dd、κ_dp、管道和共享内存
  的速率：同一个文件的 "disaggregation" 一节（worker_lab.measure_bus、measure_link 在一台 2 核 AMD EPYC 上量的，
  量的时候的负载和有没有别的任务在跑，文件里写着）。prefill 步不因旁边的 decode 变慢（**假设**：只量了 decode 步）。
- 引擎（**假设**，同 05/09）：块 16 个 token、块池 256 块、最多 16 个序列；"整段"的一步预算 2,048 个 token（一个提示
  一步算完，和在跑的 decode 同一步），"分块"的预算 64。2 个副本时请求轮流分（05/02 也是轮流）。
- 工作负载（**假设**，同 05/09）：64 个请求，提示长度在 [32, 160) 均匀、输出在 [16, 80) 均匀（种子 1、2），泊松到达
  （种子 0）；两对 SLO（**假设**）：A：TTFT ≤ 1 s、TPOT ≤ 80 ms，B：TTFT ≤ 500 ms、TPOT ≤ 150 ms；goodput = 到达率网格
  （2、3、4 req/s）里达标率 ≥ 90% 的最高率（粗：只有 3 格）。

【运行】python3 10_disaggregation_measured.py [--live]（默认：起 10 个 worker 进程，不装 SmolLM2；空闲的 2 核机器上
和种子 04 背靠背三对：4.0 秒对 3.9 秒，比值中位数 1.02 倍。--live 装 SmolLM2 float32 的 worker、墙钟，约 2.6 分钟，
打印的数随机器和负载变）

【依赖】本目录的 worker_lab（worker 进程、measure_link、measure_bus）、router_lab（Router、PDRouter、serve_trace）、
lockstep_lab（模型时钟、存下的 κ 和链路速率）、handoff_lab（KV 的字节）、runner_lab（一步的模型时间）、metrics_lab、
goodput_lab、workload_lab、iteration_lab（link_time）；../lecture01 的 console、hw_specs（05/03 用的互联表）。
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))

import numpy as np  # noqa: E402

from console import fmt_bytes, fmt_time, print_header, print_note, print_observations, print_table  # noqa: E402
from console import save_results  # noqa: E402
from goodput_lab import slo_attainment  # noqa: E402
from handoff_lab import kv_bytes_per_token  # noqa: E402
from hw_specs import IB_NDR, NVLINK4, PCIE5_X16  # noqa: E402
from iteration_lab import link_time  # noqa: E402
from lockstep_lab import BUS  # noqa: E402
from metrics_lab import request_metrics  # noqa: E402
from router_lab import PDRouter, Router, serve_trace  # noqa: E402
from runner_lab import load_calibration, modelled_step_time, step_counts  # noqa: E402
from worker_lab import replay_config, spawn_worker, start_workers, wait_all  # noqa: E402
from workload_lab import poisson_arrivals, uniform_ints  # noqa: E402

LIVE = "--live" in sys.argv[1:]
TOY = ("toy", "tiny", 1)                      # 玩具模型：LMConfig(max_seq=64)、float64、init_params 的种子 1
TOY_KW = dict(num_blocks=64, block_size=4, max_num_seqs=8)
REPLAY = ("replay", "smollm2", 7)             # SmolLM2 的形状、不装权重、占位 token 7
SMOL = replay_config("smollm2")
# ---- 引擎（假设，同 05/09）----
ENGINE_KW = dict(num_blocks=256, block_size=16, max_num_seqs=16)
WHOLE, CHUNK = 2048, 64                       # 一步的 token 预算：整段 prefill / 分块 prefill
# ---- 演示 1 ----
PROMPT_1K = 1024
# ---- 演示 3 的工作负载和 SLO（假设，同 05/09 的长度和种子）----
N_REQ = 64
PROMPT_RANGE, OUT_RANGE = (32, 160), (16, 80)
SEED_ARRIVAL, SEED_PROMPT, SEED_OUT, SEED_TOKENS = 0, 1, 2, 3
RATES = (2.0, 3.0, 4.0)                       # req/s；表和 goodput 的网格
TTFT_SLO, TPOT_SLO, GOAL = 1.0, 0.080, 0.9   # SLO A：TPOT 紧
TTFT_SLO_B, TPOT_SLO_B = 0.5, 0.150          # SLO B：TTFT 紧
DEPLOYS = ("2 副本·整段", f"2 副本·分块 {CHUNK}", "1P + 1D")
# ---- --live ----
LIVE_N, LIVE_RATES = 16, (1.0, 2.0)

PROMPT_LENS = uniform_ints(*PROMPT_RANGE, N_REQ, SEED_PROMPT)
OUT_LENS = uniform_ints(*OUT_RANGE, N_REQ, SEED_OUT)
_TOKS = uniform_ints(3, SMOL.vocab, int(PROMPT_LENS.sum()), SEED_TOKENS)
PROMPTS = [[int(t) for t in _TOKS[a:a + n]] for a, n in zip(np.cumsum(PROMPT_LENS) - PROMPT_LENS, PROMPT_LENS)]


def _live_recipe():
    """--live 的 worker 配方：SmolLM2 float32（拿不到模型文件时只打印出路、退出码 1）。"""
    sys.path.insert(0, os.path.join(HERE, "..", "lecture02"))
    from hub_lab import gguf_path_or_exit
    return ("gguf", gguf_path_or_exit(), "float32")


# ---------------------------------------------------------------------------
# 演示 1：交接的字节和时间
# ---------------------------------------------------------------------------
def demo1_handoff(live=False):
    print_header("演示 1：一次交接（真的 worker 进程送真的字节；时间按模型时钟，--live 另量管道和共享内存）")
    cfg_l, cfg_h, cfg_d, itemsize = 2, 2, 8, 8                  # 玩具：层、KV 头、head_dim、float64 的字节
    per_tok = 2 * cfg_l * cfg_h * cfg_d * itemsize
    rng = np.random.default_rng(0)
    lens = (8, 24, 48)
    res = {"per_tok": per_tok, "rows": []}
    ws = start_workers(TOY, 2, **TOY_KW)
    try:
        for via in ("pipe", "shm"):
            for w in ws:
                w.call("reset")
            r = PDRouter(ws[:1], ws[1:], via=via)
            for n in lens:
                b0, wire0 = r.bytes_moved, _wire(ws[1])
                r.add_request([int(t) for t in rng.integers(0, 64, size=n)], 4)
                while r.has_unfinished_requests():
                    r.step()
                res["rows"].append((via, n, r.bytes_moved - b0, _wire(ws[1]) - wire0))
    finally:
        for w in ws:
            w.close()
    by = {(v, n): (nb, w) for v, n, nb, w in res["rows"]}
    print_table(["提示 token", "公式 B", "nbytes B", "线上（管道）B", "线上（共享内存）B"],
                [[n, per_tok * n, by[("pipe", n)][0], by[("pipe", n)][1], by[("shm", n)][1]] for n in lens])

    # SmolLM2 一个 1,024 token 的提示：真的交接一次（replay worker，模型时钟），管道和共享内存各一次
    smol_tok = kv_bytes_per_token(SMOL)
    prompt = [int(t) for t in uniform_ints(3, SMOL.vocab, PROMPT_1K, 9)]
    ws = start_workers(REPLAY, 2, max_num_batched_tokens=WHOLE, **ENGINE_KW)
    got = {}
    try:
        for via in ("pipe", "shm"):
            for w in ws:
                w.call("reset")
            with_r = PDRouter(ws[:1], ws[1:], via=via, clock="model")
            gid = serve_trace(with_r, [(0.0, prompt, 2)])[0]
            got[via] = {"nbytes": with_r.bytes_moved, "xfer": with_r.transfer_s[gid],
                        "prefill": with_r.token_times[gid][0] - with_r.transfer_s[gid]}
    finally:
        for w in ws:
            w.close()
    total, t_pre = got["pipe"]["nbytes"], got["pipe"]["prefill"]
    links = [("管道（存下的速率）", got["pipe"]["xfer"]), ("共享内存（存下的速率）", got["shm"]["xfer"])]
    links += [(name, link_time(total, link)) for link, name in
              ((NVLINK4, "NVLink 4（05/03）"), (IB_NDR, "IB NDR 一个端口（05/03）"), (PCIE5_X16, "PCIe Gen5 x16（05/03）"))]
    measured = {}
    if live:
        from worker_lab import measure_link
        measured = {"管道（存下的速率）": total / measure_link("pipe", total),
                    "共享内存（存下的速率）": total / measure_link("shm", total)}
    rows = [["prefill（模型时钟，这台 CPU）", fmt_time(t_pre), "100%"] + (["—"] if live else [])]
    for name, t in links:
        rows.append([name, fmt_time(t), f"{t / t_pre * 100:.1f}%"]
                    + ([fmt_time(measured[name]) if name in measured else "—"] if live else []))
    print_table([f"SmolLM2 {PROMPT_1K} token 的交接 {fmt_bytes(total)}", "时间", "占 prefill"]
                + (["--live 量到"] if live else []), rows)
    res.update(smol_per_tok=smol_tok, smol_total=total, t_prefill=t_pre,
               times=dict(links), shm_nbytes=got["shm"]["nbytes"], measured=measured)
    same = all(per_tok * n == by[("pipe", n)][0] for n in lens)
    head_pipe = by[("pipe", lens[0])][1] - by[("pipe", lens[0])][0]
    pipe_t, shm_t = res["times"]["管道（存下的速率）"], res["times"]["共享内存（存下的速率）"]
    print_observations([
        f"公式和 nbytes {'处处相等' if same else '不相等'}：玩具每个 token 2 · {cfg_l} 层 · {cfg_h} 个 KV 头 · "
        f"{cfg_d} · {itemsize} 字节 = {per_tok} B。管道上多出来的是头（token、采样设置、随机数发生器的状态、时间戳）："
        f"{lens[0]} 个 token 时 {head_pipe} B；共享内存只送头，K、V 留在那段内存里由 decode 那边直接写进自己的块池。",
        f"SmolLM2 float32 每个 token {fmt_bytes(smol_tok)}，{PROMPT_1K} 个 token 的交接真的送了 {fmt_bytes(total)}"
        f"（= {smol_tok} B × {PROMPT_1K}：{'相等' if total == smol_tok * PROMPT_1K else '不相等'}）。"
        f"按存下的速率，管道要 {fmt_time(pipe_t)}、共享内存 {fmt_time(shm_t)}，是它的 prefill（{fmt_time(t_pre)}）的 "
        f"{pipe_t / t_pre * 100:.1f}% 和 {shm_t / t_pre * 100:.1f}%。",
        f"同样的字节在 05/03 的链路上：NVLink 4 {fmt_time(res['times']['NVLink 4（05/03）'])}、IB NDR 一个端口 "
        f"{fmt_time(res['times']['IB NDR 一个端口（05/03）'])}——这台机器上两个进程之间的"
        f"{'共享内存' if shm_t > pipe_t else '管道'}比 IB NDR 慢 "
        f"{max(pipe_t, shm_t) / res['times']['IB NDR 一个端口（05/03）']:.0f} 倍；"
        f"可这台 CPU 的 prefill 也慢，交接仍只占它的 {max(pipe_t, shm_t) / t_pre * 100:.1f}%。",
    ])
    return res


def _wire(w):
    return w.call("info")["wire_bytes"]


# ---------------------------------------------------------------------------
# 演示 2：共享的内存总线
# ---------------------------------------------------------------------------
def demo2_bus(live=False):
    print_header("演示 2：两个核共用一条内存总线（默认：存下的 κ；--live 量两个 SmolLM2 worker，墙钟）")
    sec = load_calibration("disaggregation")
    t1 = modelled_step_time(step_counts(SMOL, [(1, 64, True)]))         # 一个序列、上下文 64 的 decode 步
    kdd, kdp = BUS["kappa_dd"], BUS["kappa_dp"]
    meas = None
    if live:
        from worker_lab import measure_bus
        meas = measure_bus(_live_recipe())
    rows = []
    for name, k, mk in (("单独 decode", 1.0, "one"), ("旁边另一个进程 decode（κ_dd）", kdd, "kappa_dd"),
                        ("旁边另一个进程 prefill（κ_dp）", kdp, "kappa_dp")):
        row = [name, f"{k:.2f}", fmt_time(t1 * k)]
        if live:
            mk_v = 1.0 if mk == "one" else meas[mk]
            row += [f"{mk_v:.2f}", fmt_time(meas["decode_alone_s"] * mk_v)]
        rows.append(row)
    print_table(["一个 decode 步（B = 1，上下文 64）", "倍数", "模型时间"] + (["量到倍数", "量到时间"] if live else []), rows)
    mach = sec["machine"]
    print_note(f"κ 来自 lecture05/cpu_calibration.json 的 \"disaggregation\" 一节（{sec['date']}，量的时候 1 分钟负载 "
               f"{mach['load_avg_1min_at_start']}–{mach['load_avg_1min_at_end']}"
               f"{'，机器上还有别人在跑' if mach.get('loaded') else '，量的两个 worker 以外没有别的任务'}）；"
               "重量：python3 tests/bench_engine.py --calibrate disaggregation。")
    print_observations([
        f"decode 步读一遍全部权重（受带宽限制）：旁边再来一个 decode，两个进程抢同一条总线，慢 {(kdd - 1) * 100:.0f}%；"
        f"旁边是 prefill（主要在算），只慢 {(kdp - 1) * 100:.0f}%。",
        f"所以在这台 CPU 上，两个都在 decode 的副本互相拖慢得{'多' if kdd > kdp else '少'}，"
        f"一个 prefill worker 配一个 decode worker 拖得{'少' if kdd > kdp else '多'}——GPU 上每块卡有自己的 HBM，"
        "没有这一项（05/02 的模拟里也没有）。",
    ])
    return {"t1": t1, "kappa_dd": kdd, "kappa_dp": kdp, "measured": meas}


# ---------------------------------------------------------------------------
# 演示 3：DistServe 的实验，两个核
# ---------------------------------------------------------------------------
def trace_at(rate, n=N_REQ):
    """前 n 个请求按到达率 rate（泊松，种子 SEED_ARRIVAL）-> [(到达, prompt, max_tokens)]。"""
    arr = poisson_arrivals(rate, n, SEED_ARRIVAL)
    return [(float(arr[i]), PROMPTS[i], int(OUT_LENS[i])) for i in range(n)]


def deploy_workers(recipe, clock="model"):
    """演示 3 的 4 个 worker：[整段, 整段, 分块, 分块]（一步的预算 WHOLE / CHUNK）；先全部 spawn 再等（同时装模型）。"""
    return wait_all([spawn_worker(recipe, max_num_batched_tokens=b, clock=clock, **ENGINE_KW)
                     for b in (WHOLE, WHOLE, CHUNK, CHUNK)])


def run_deploy(name, ws, trace, clock="model"):
    """部署 name 用 worker ws（[整段, 整段, 分块, 分块]）跑 trace -> 指标 dict（ttft、tpot、最长卡顿……）。"""
    for w in ws:
        w.call("reset")
    if name == DEPLOYS[0]:
        r = Router(ws[:2], "round_robin", clock=clock)
    elif name == DEPLOYS[1]:
        r = Router(ws[2:], "round_robin", clock=clock)
    else:
        r = PDRouter(ws[:1], ws[1:2], via="shm", clock=clock)
    ids = serve_trace(r, trace)
    ms = [request_metrics(r.requests[g]) for g in ids]
    out = {"ttft": [m["ttft"] for m in ms], "tpot": [m["tpot"] for m in ms],
           "stall": max(max(m["itl"]) for m in ms if m["itl"]),
           "times": [(r.requests[g].arrival, list(r.requests[g].token_times)) for g in ids]}
    out["att"] = slo_attainment(out, TTFT_SLO, TPOT_SLO)
    out["att_b"] = slo_attainment(out, TTFT_SLO_B, TPOT_SLO_B)
    return out


def _pcts(x):
    return float(np.percentile(x, 50)), float(np.percentile(x, 99))


def demo3_distserve(live=False):
    print_header(f"演示 3：DistServe 的实验，两个核（模型时钟；{N_REQ} 个请求；泊松到达）")
    ws = deploy_workers(REPLAY)
    res = {}
    try:
        for rate in RATES:
            for d in DEPLOYS:
                res[(rate, d)] = run_deploy(d, ws, trace_at(rate))
    finally:
        for w in ws:
            w.close()
    rows = []
    for rate in RATES:
        for d in DEPLOYS:
            m = res[(rate, d)]
            (a50, a99), (b50, b99) = _pcts(m["ttft"]), _pcts(m["tpot"])
            m.update(ttft50=a50, ttft99=a99, tpot50=b50, tpot99=b99)
            rows.append([f"{rate:g}", d, fmt_time(a50), fmt_time(a99), fmt_time(b50), fmt_time(b99),
                         fmt_time(m["stall"]), f"{m['att'] * 100:.0f}%", f"{m['att_b'] * 100:.0f}%"])
    print_table(["req/s", "部署", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "最长卡顿", "达标 A", "达标 B"], rows)
    print_note(f"达标 A：TTFT ≤ {fmt_time(TTFT_SLO)} 且 TPOT ≤ {fmt_time(TPOT_SLO)}（TPOT 紧）；达标 B：TTFT ≤ "
               f"{fmt_time(TTFT_SLO_B)} 且 TPOT ≤ {fmt_time(TPOT_SLO_B)}（TTFT 紧）。")
    good = {d: max([r for r in RATES if res[(r, d)]["att"] >= GOAL], default=0.0) for d in DEPLOYS}
    good_b = {d: max([r for r in RATES if res[(r, d)]["att_b"] >= GOAL], default=0.0) for d in DEPLOYS}
    fmt_g = lambda g, k=1: f"{g / k:g} req/s" if g else f"< {RATES[0] / k:g} req/s"  # noqa: E731
    print_table(["部署", "goodput A", "每个核 A", "goodput B", "每个核 B"],
                [[d, fmt_g(good[d]), fmt_g(good[d], 2), fmt_g(good_b[d]), fmt_g(good_b[d], 2)] for d in DEPLOYS])
    print_note(f"goodput = 到达率网格 {'、'.join(f'{r:g}' for r in RATES)} req/s 里达标率 ≥ {GOAL * 100:.0f}% 的最高率。")
    mid = RATES[1]
    w, c, pd = (res[(mid, d)] for d in DEPLOYS)
    stall_order = w["stall"] > c["stall"] and w["stall"] > pd["stall"]
    tpot_pd = all(res[(r, DEPLOYS[2])]["tpot99"] < min(res[(r, DEPLOYS[0])]["tpot99"], res[(r, DEPLOYS[1])]["tpot99"])
                  for r in RATES)
    ttft_pd = all(res[(r, DEPLOYS[2])]["ttft99"] > res[(r, DEPLOYS[0])]["ttft99"] for r in RATES)
    best_a = "、".join(d for d in DEPLOYS if good[d] == max(good.values()))
    best_b = "、".join(d for d in DEPLOYS if good_b[d] == max(good_b.values()))
    obs = [
        f"05/02 说整段 prefill 插进 decode 的批里会卡住在跑的用户：{mid:g} req/s 时整段的最长卡顿 {fmt_time(w['stall'])}，"
        f"分块 {fmt_time(c['stall'])}，解耦 {fmt_time(pd['stall'])}——{'在这里也成立' if stall_order else '在这里不成立'}。",
        f"05/02 说解耦的 decode 那边没有 prefill，TPOT 最稳：每个到达率下 1P + 1D 的 TPOT p99 "
        f"{'都是三种里最低的' if tpot_pd else '不都是最低的'}（{mid:g} req/s：{fmt_time(pd['tpot99'])}，整段 "
        f"{fmt_time(w['tpot99'])}、分块 {fmt_time(c['tpot99'])}）。模型时钟在这台 CPU 上还多算了一项（演示 2）：两个副本的 "
        f"decode 互相抢总线（κ_dd = {BUS['kappa_dd']:.2f}），解耦时 decode 旁边只是 prefill（κ_dp = {BUS['kappa_dp']:.2f}）。",
        f"代价在 TTFT：所有 prefill 挤在一个核上，1P + 1D 的 TTFT p99 {'每个到达率下都比' if ttft_pd else '不都比'}"
        f"整段的两个副本长（{mid:g} req/s：{fmt_time(pd['ttft99'])} 对 {fmt_time(w['ttft99'])}）。",
        f"选哪种部署看 SLO：A（TPOT 紧）下 {mid:g} req/s 的达标率整段 {w['att'] * 100:.0f}%、分块 "
        f"{c['att'] * 100:.0f}%、解耦 {pd['att'] * 100:.0f}%，goodput 最高的是 {best_a}；B（TTFT 紧）下是 "
        f"{w['att_b'] * 100:.0f}%、{c['att_b'] * 100:.0f}%、{pd['att_b'] * 100:.0f}%，goodput 最高的是 {best_b}。"
        "DistServe 按应用的 SLO 给 prefill 和 decode 选资源，就是这个意思。",
    ]
    print_observations(obs)
    out = {"res": res, "goodput": good, "goodput_b": good_b, "best_a": best_a, "best_b": best_b,
           "stall_order": stall_order, "tpot_pd": tpot_pd, "ttft_pd": ttft_pd}
    if live:
        out["live"] = demo3_live()
    return out


def demo3_live(n=LIVE_N, rates=LIVE_RATES):
    """--live：同样的部署，SmolLM2 float32 的 worker、墙钟；旁边是同样 n 个请求在模型时钟上的（replay worker）。"""
    recipe = _live_recipe()
    print("起 SmolLM2 worker……", file=sys.stderr, flush=True)
    out = {}
    for clock, rec in (("model", REPLAY), ("wall", recipe)):
        ws = deploy_workers(rec, clock)
        try:
            for rate in rates:
                for d in DEPLOYS:
                    out[(clock, rate, d)] = run_deploy(d, ws, trace_at(rate, n), clock=clock)
        finally:
            for w in ws:
                w.close()
    rows = []
    for rate in rates:
        for d in DEPLOYS:
            m, l = out[("model", rate, d)], out[("wall", rate, d)]
            rows.append([f"{rate:g}", d, fmt_time(np.median(m["ttft"])), fmt_time(np.median(l["ttft"])),
                         fmt_time(np.median(m["tpot"])), fmt_time(np.median(l["tpot"])),
                         f"{m['att'] * 100:.0f}%", f"{l['att'] * 100:.0f}%"])
    print_table(["req/s", "部署", "TTFT 模型", "TTFT 量到", "TPOT 模型", "TPOT 量到", "达标 A 模型", "达标 A 量到"], rows)
    print_note(f"--live：SmolLM2 float32 的 worker、墙钟，每格 {n} 个请求、中位数；量完时 1 分钟负载 {_load():.2f}"
               "（2 个核：负载 > 2 时别的进程在抢这两个核，量到的比模型的慢）。")
    return out


def _load():
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


# ---------------------------------------------------------------------------
# 演示 4：路由
# ---------------------------------------------------------------------------
def shared_prefix_workload(n_systems=3, n_users=5, n_turns=3, sys_len=96, turn_len=24, gap=2.0, seed=0):
    """几个系统提示、每个用户几轮追问 -> [(到达, 提示, max_tokens)]：第 t 轮的请求在 t·gap 秒一起到，提示带着前几轮的。"""
    rng = np.random.default_rng(seed)
    systems = [[int(t) for t in rng.integers(3, SMOL.vocab, size=sys_len)] for _ in range(n_systems)]
    convs = [list(systems[u % n_systems]) for u in range(n_users)]
    out = []
    for t in range(n_turns):
        for u in range(n_users):
            convs[u] = convs[u] + [int(x) for x in rng.integers(3, SMOL.vocab, size=turn_len)]
            out.append((t * gap, list(convs[u]), 8))
    return out


def demo4_routing(live=False):
    print_header("演示 4：2 个副本前面的路由器（真的 worker 进程；模型时钟；--live 另跑 SmolLM2，墙钟）")
    trace = shared_prefix_workload()
    res, rows = {}, []
    runs = [("model", REPLAY)] + ([("wall", _live_recipe())] if live else [])
    for clock, rec in runs:
        ws = start_workers(rec, 2, max_num_batched_tokens=WHOLE, clock=clock, **ENGINE_KW)
        try:
            for policy in ("round_robin", "least_loaded", "prefix"):
                for w in ws:
                    w.call("reset")
                r = Router(ws, policy, clock=clock)
                ids = serve_trace(r, trace)
                infos = [w.call("info") for w in ws]
                ttft = [request_metrics(r.requests[g])["ttft"] for g in ids]
                res[(clock, policy)] = {"hit": sum(i["hit_tokens"] for i in infos),
                                        "prefill": sum(i["prefill_tokens"] for i in infos),
                                        "total": sum(len(p) for _, p, _ in trace), "ttft50": float(np.median(ttft)),
                                        "ttft_mean": float(np.mean(ttft))}
        finally:
            for w in ws:
                w.close()
    for policy in ("round_robin", "least_loaded", "prefix"):
        v = res[("model", policy)]
        row = [policy, v["total"], v["hit"], v["prefill"], f"{v['hit'] / v['total'] * 100:.0f}%",
               fmt_time(v["ttft50"]), fmt_time(v["ttft_mean"])]
        if live:
            row += [fmt_time(res[("wall", policy)]["ttft50"])]
        rows.append(row)
    print_table(["策略", "提示 token", "命中", "prefill", "命中率", "TTFT p50", "TTFT 平均"]
                + (["TTFT p50 量到"] if live else []), rows)
    if live:
        print_note(f"--live：SmolLM2 float32 的 worker、墙钟；量完时 1 分钟负载 {_load():.2f}。")
    m = {p: res[("model", p)] for p in ("round_robin", "least_loaded", "prefix")}
    top = max(v["hit"] for v in m.values())
    best = "、".join(k for k in m if m[k]["hit"] == top)
    n_turns = len({a for a, _, _ in trace})
    print_observations([
        f"{n_turns} 轮、每轮 {len(trace) // n_turns} 个请求一起到，{len(trace)} 个请求、{m['prefix']['total']} 个提示 token："
        f"prefix 策略命中 {m['prefix']['hit']} 个，round_robin {m['round_robin']['hit']} 个，least_loaded "
        f"{m['least_loaded']['hit']} 个（最多的是 {best}）。",
        f"命中省掉的 token 不用 prefill：每种策略 prefill + 命中"
        f"{'都' if all(v['hit'] + v['prefill'] == v['total'] for v in m.values()) else '不都'}等于提示 token"
        f"（前缀缓存只按整块命中）。少算的 prefill 直接变成 TTFT：平均 TTFT prefix {fmt_time(m['prefix']['ttft_mean'])}，"
        f"round_robin {fmt_time(m['round_robin']['ttft_mean'])}。",
    ])
    return res


if __name__ == "__main__":
    if LIVE:
        _live_recipe()
    r1 = demo1_handoff(LIVE)
    r2 = demo2_bus(LIVE)
    r3 = demo3_distserve(LIVE)
    r4 = demo4_routing(LIVE)
    save_results({"demo1": r1, "demo2": r2, "demo3": r3, "demo4": r4})       # 测试读这次运行的数（设了 CS349E_RESULTS 时）
