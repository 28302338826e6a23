"""
=============================================================================
CS349E · 第 5 讲 · 10_disaggregation_measured.py —— 真的解耦：两个引擎进程、一个 KV 交接、几个副本前面的路由器
=============================================================================

【这个脚本要回答的问题】
演示 1：一次交接真的要搬多少字节：第 1 讲的公式（2 · 层 · KV 头 · head_dim · 字节）对 KVHandoff.nbytes，
管道和共享内存在线上各走多少字节；同样的字节数放到 SmolLM2 的 1,024 个 token 上，在 05/03 的三种链路上要多久。
演示 2：几个系统提示、多轮追问的工作负载交给 2 个副本：三种路由策略各让前缀缓存命中多少、要 prefill 多少 token。

【怎么读输出】演示 1 的第一张表每行一个请求（真的在两个 worker 进程之间交接过），"公式"和"nbytes"两列应当相等；
"线上（管道）"多出来的是头（pickle 的元数据），"线上（共享内存）"只有头：K、V 在共享内存里，不经过管道。
演示 2 每行一种策略：命中 = 前缀缓存省掉的提示 token，prefill = 真的算了的提示 token。

【模型的假设（务必看）】默认运行起真的 worker 进程（multiprocessing spawn）、送真的字节，但只数字节和 token，
不计时（所以每次打印一样）；模型是玩具（LMConfig(max_seq=64)，float64，种子 1）。链路时间 = 字节 / 单向带宽
（iteration_lab.link_time：不含延迟和协议开销，和 05/03 一样）。

【运行】python3 10_disaggregation_measured.py （约 1.1 秒，起 4 个 worker 进程；种子 04 背靠背 3.8 秒）

【依赖】本目录的 worker_lab（worker 进程）、router_lab（Router、PDRouter）、handoff_lab（KVHandoff、线）、
engine_lab、iteration_lab（link_time）；../lecture01 的 console、hw_specs（互联表）、llm_math（SmolLM2 的配置）。
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))

import numpy as np  # noqa: E402

from console import fmt_bytes, fmt_time, print_header, print_observations, print_table  # noqa: E402
from hw_specs import IB_NDR, NVLINK4, PCIE5_X16  # noqa: E402
from iteration_lab import link_time  # noqa: E402
from llm_math import SMOLLM2_135M  # noqa: E402
from router_lab import PDRouter, Router  # noqa: E402
from worker_lab import start_worker  # noqa: E402

RECIPE = ("toy", "tiny", 1)          # 玩具模型：LMConfig(max_seq=64)、float64、init_params 的种子 1
ENGINE_KW = dict(num_blocks=64, block_size=4, max_num_seqs=8)
SMOLLM2_PROMPT = 1024                # 演示 1：SmolLM2 一个 1,024 token 的提示
SMOLLM2_BYTES = 4                    # float32（SmolLM2 在 CPU 上跑的 dtype）


# ---------------------------------------------------------------------------
# 演示 1：交接的字节
# ---------------------------------------------------------------------------
def demo1_handoff_bytes():
    print_header("演示 1：一次交接的字节（真的两个 worker 进程：1 个 prefill + 1 个 decode；只数字节）")
    cfg_l, cfg_h, cfg_d, itemsize = 2, 2, 8, 8                  # 玩具：层、KV 头、head_dim、float64 的字节
    per_tok = 2 * cfg_l * cfg_h * cfg_d * itemsize
    rng = np.random.default_rng(0)
    lens = (8, 24, 48)
    rows, res = [], {"per_tok": per_tok, "rows": []}
    for via in ("pipe", "shm"):
        ws = [start_worker(RECIPE, **ENGINE_KW) for _ in range(2)]
        with PDRouter(ws[:1], ws[1:], via=via) as r:
            for n in lens:
                b0 = r.bytes_moved
                wire0 = _wire(ws[1])
                gid = r.add_request([int(t) for t in rng.integers(0, 64, size=n)], 4)
                while r.has_unfinished_requests():
                    r.step()
                res["rows"].append((via, n, r.bytes_moved - b0, _wire(ws[1]) - wire0))
    by = {(v, n): (nb, w) for v, n, nb, w in res["rows"]}
    for n in lens:
        rows.append([n, per_tok * n, by[("pipe", n)][0], by[("pipe", n)][1], by[("shm", n)][1]])
    print_table(["提示 token", "公式 B", "nbytes B", "线上（管道）B", "线上（共享内存）B"], rows)
    m = SMOLLM2_135M
    tok_b = 2 * m.n_layers * m.n_kv_heads * m.head_dim * SMOLLM2_BYTES
    total = tok_b * SMOLLM2_PROMPT
    links = [(NVLINK4, "NVLink 4"), (IB_NDR, "IB NDR 一个端口"), (PCIE5_X16, "PCIe Gen5 x16")]
    rows2 = [[name, fmt_bytes(total), fmt_time(link_time(total, link))] for link, name in links]
    print_table(["链路（05/03 的表）", f"SmolLM2 {SMOLLM2_PROMPT} token", "搬运时间"], rows2)
    res.update(smol_per_tok=tok_b, smol_total=total,
               times={name: link_time(total, link) for link, name in links})
    same = all(per_tok * n == by[("pipe", n)][0] for n in lens)
    head_pipe = by[("pipe", lens[0])][1] - by[("pipe", lens[0])][0]
    print_observations([
        f"公式和 nbytes {'处处相等' if same else '不相等'}：玩具每个 token 2 · {cfg_l} 层 · {cfg_h} 个 KV 头 · "
        f"{cfg_d} · {itemsize} 字节 = {per_tok} B，{lens[-1]} 个 token 的提示交接 {per_tok * lens[-1]} B。",
        f"管道上多出来的是头（token、采样设置、随机数发生器的状态、时间戳）：{lens[0]} 个 token 时 {head_pipe} B；"
        f"共享内存只送头，K、V 留在那段内存里由 decode 那边直接写进自己的块池。",
        f"SmolLM2 float32 每个 token {fmt_bytes(tok_b)}，{SMOLLM2_PROMPT} 个 token 是 {fmt_bytes(total)}：在 NVLink 4 上 "
        f"{fmt_time(res['times']['NVLink 4'])}，IB NDR 一个端口 {fmt_time(res['times']['IB NDR 一个端口'])}。",
    ])
    return res


def _wire(w):
    return w.call("info")["wire_bytes"]


# ---------------------------------------------------------------------------
# 演示 2：路由
# ---------------------------------------------------------------------------
def shared_prefix_workload(n_systems=3, n_users=5, n_turns=3, seed=0):
    """几个系统提示、每个用户几轮追问 -> 每一轮一个提示的 list（第 t 轮的追问带着前几轮的提示）。"""
    rng = np.random.default_rng(seed)
    systems = [[int(t) for t in rng.integers(0, 64, size=16)] for _ in range(n_systems)]
    convs = [list(systems[u % n_systems]) for u in range(n_users)]
    out = []
    for _ in range(n_turns):
        turn = []
        for u in range(n_users):
            convs[u] = convs[u] + [int(t) for t in rng.integers(0, 64, size=6)]
            turn.append(list(convs[u]))
        out.append(turn)
    return out


def demo2_routing():
    print_header("演示 2：2 个副本前面的路由器（真的 worker 进程；前缀缓存命中的 token，不计时）")
    turns = shared_prefix_workload()
    prompts = [p for turn in turns for p in turn]
    ws = [start_worker(RECIPE, **ENGINE_KW) for _ in range(2)]
    res, rows = {}, []
    try:
        for policy in ("round_robin", "least_loaded", "prefix"):
            for w in ws:
                w.call("reset")
            r = Router(ws, policy)
            for turn in turns:                                # 一轮的请求一起到，这一轮都结束了下一轮才到
                for p in turn:
                    r.add_request(p, 2)
                while r.has_unfinished_requests():
                    r.step()
            infos = [w.call("info") for w in ws]
            hit = sum(i["hit_tokens"] for i in infos)
            pre = sum(i["prefill_tokens"] for i in infos)
            total = sum(len(p) for p in prompts)
            res[policy] = {"hit": hit, "prefill": pre, "total": total}
            rows.append([policy, total, hit, pre, f"{hit / total * 100:.0f}%"])
    finally:
        for w in ws:
            w.close()
    print_table(["策略", "提示 token", "命中", "prefill", "命中率"], rows)
    top = max(v["hit"] for v in res.values())
    best = "、".join(k for k in res if res[k]["hit"] == top)
    print_observations([
        f"{len(turns)} 轮、每轮 {len(turns[0])} 个请求一起到，{len(prompts)} 个请求、{res['prefix']['total']} 个提示 token：prefix 策略命中 {res['prefix']['hit']} 个，"
        f"round_robin 命中 {res['round_robin']['hit']} 个，least_loaded 命中 {res['least_loaded']['hit']} 个"
        f"（最多的是 {best}）。",
        f"命中省掉的 token 不用 prefill：每种策略 prefill + 命中 {'都' if all(v['hit'] + v['prefill'] == v['total'] for v in res.values()) else '不都'}"
        f"等于提示 token（前缀缓存只按整块命中，最后一个 token 总要算）。",
    ])
    return res


if __name__ == "__main__":
    demo1_handoff_bytes()
    demo2_routing()
