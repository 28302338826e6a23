"""
=============================================================================
CS349E · 第 1 讲 · 05_tensor_parallel.py —— n 块 GPU 的代价：张量并行的 all-reduce
=============================================================================

【这个脚本要回答的问题】
演示 1：一次环形 all-reduce 要多久：每块卡发 2(n−1)/n 份数据、走 2(n−1) 步，小消息的时间几乎全是每跳的延迟。
演示 2：Llama-3.1-70B（BF16，一块 H100 放不下）在 2、4、8 块 H100 SXM（NVLink）和 8 块 H100 PCIe（PCIe Gen5）上
decode：TPOT 和每块卡每秒的 token 随批大小怎么变，和不算通信的 gang 差多少；再把同一个模型放到 gpt-fast 量过的
A100 张量并行旁边，看它对在哪里、错在哪里。
演示 3：每跳延迟没有数据手册给——它在 1、3、10 µs 之间变时，"加卡还划不划算"的答案怎么变。
演示 4：prefill 时 all-reduce 的数据随提示变长：1k 和 8k 个 token 时通信占一步的多少。
演示 5：对照流水线并行：没有每层的 all-reduce，但批大小 1 的 TPOT 一点也不缩短。

【怎么读输出】时间都是 roofline 下界加通信：分到每块卡的工作（= hw_specs.gang 上的 decode_step / prefill_step，
gang 把 n 块卡当成一块 n 倍的卡、不算通信）+ 每层两次 all-reduce（llm_math.tp_decode_step / tp_prefill_step，
环形 all-reduce 的公式在 hw_specs.ring_allreduce）。"每卡 tok/s" = 批大小 ÷ TPOT ÷ 卡数。演示 2 的最后一张表
另列 gpt-fast 公布的实测 tok/s（[G]），和同一个模型的预测并排。

【模型的假设（务必看）】
- 每跳延迟（hop latency）是**假设**：默认 3 µs（hw_specs 的 Link 表），演示 3 扫 1、3、10 µs。它取决于软件栈。
  环形 all-reduce 要走 2(n−1) 步；对 decode 这种几十 kB 的消息，不少系统用不走环的算法：one-shot all-reduce（每块卡
  直接读其余各块的数据、自己加起来，一步完成；gpt-fast 用的 PyTorch intra-node all-reduce 就是这类，见 [G']）。
  对这样的系统，这里的通信项偏悲观：演示 2 的最后一张表是证据。（默认的 NCCL 对这么小的消息在 8 块 H100 上
  仍走环：见第 1 讲 06 的演示 2。）
- 链路带宽用单向带宽：NVLink 4 每块 H100 SXM 450 GB/s（数据手册的 900 GB/s 是双向合计），
  PCIe Gen5 x16 64 GB/s（数据手册 128 GB/s 双向合计）；8 块 PCIe 卡之间经 PCIe 交换，不用 NVLink 桥。
- 计算和通信不重叠（通信时间的上界）；每层两次 all-reduce（Megatron-LM，Shoeybi et al. 2019，arXiv 1909.08053），
  词表切分的 lm_head 那次小通信不算。decode 的上下文 4096 个位置（假设），权重和 KV 都是 BF16。
- 流水线的一段 = 整个模型 1/n 的工作；"一块卡的时间"假想这块卡装得下整个模型（只用来比较）。
- 演示 2 的实测对照：A100 用 hw_specs 的 A100 和 NVLINK3（单向 300 GB/s）；上下文 105 个位置（假设：[G] 的提示
  5 个 token，generate.py 命令行默认生成 200 个，取一半）；KV 只占读的字节的零头，这个假设几乎不影响结果。

【出处】
- [G] pytorch-labs/gpt-fast README 的 "Tensor Parallelism" 表：8 块 A100-80GB（功耗限制 330 W，README 说是
  hybrid cube mesh 拓扑），批 1、提示 5 个 token，Llama-2-70B BF16，2/4/8 块卡。2023-11-30 的版本（提交 d2c5d82，
  all-reduce 用默认的 NCCL）：20.53、34.15、47.25 token/s；2023-12-16 起（提交 c5d3454，"new custom collectives"，
  命令加了 ENABLE_INTRA_NODE_COMM=1）：21.32、38.01、62.50 token/s。README 还写 A100"经验上峰值带宽约 1700 GB/s"。
- [G'] pytorch/pytorch PR #114001（2023-11）：给 PyTorch 加了三种节点内的小消息 all-reduce——one-shot（每块卡同时读
  所有别的卡的数据并累加）、two-shot（one-shot 的 reduce-scatter + all-gather）、hybrid cube mesh（不经 PCIe 的
  one-shot 变体）。ENABLE_INTRA_NODE_COMM=1 打开的就是它们。
- H100 上 all-reduce 的实测（Azure 公布的、强制 NVLS 的 NCCL all-reduce）和环形模型的对照：第 1 讲 06 的演示 2。

【运行】python3 05_tensor_parallel.py （约 0.2 秒）

【依赖】本目录的 console、hw_specs（芯片、互联（含 A100 的 NVLINK3）、ring_allreduce、gang）、llm_math（tp_decode_step、tp_prefill_step、
pp_decode_step、max_batch）。
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))

from console import fmt_bytes, fmt_time, print_header, print_observations, print_table  # noqa: E402
from hw_specs import A100, H100, H100_PCIE, IB_NDR, NVLINK3, NVLINK4, PCIE5_X16, gang, ring_allreduce  # noqa: E402
from llm_math import (LLAMA2_70B, LLAMA31_70B, max_batch, pp_decode_step, tp_decode_step,  # noqa: E402
                      tp_prefill_step, weight_bytes)

MODEL = LLAMA31_70B
CONTEXT = 4096                                   # decode 的上下文（假设）
# 四种配置：(名字, 芯片, 卡数, 互联)
CONFIGS = [("2×SXM", H100, 2, NVLINK4), ("4×SXM", H100, 4, NVLINK4), ("8×SXM", H100, 8, NVLINK4),
           ("8×PCIe", H100_PCIE, 8, PCIE5_X16)]
BATCHES = (1, 8, 32, 128)
LATENCIES = (1e-6, 3e-6, 10e-6)                  # 每跳延迟的扫描范围（假设）

# ---- 实测对照：gpt-fast 的张量并行（[G]：8 块 A100-80GB，批 1，Llama-2-70B BF16）----  卡数 -> token/s
GPT_FAST_TP_NCCL = {2: 20.53, 4: 34.15, 8: 47.25}     # README 2023-11-30（提交 d2c5d82）：默认的 NCCL all-reduce
GPT_FAST_TP_CUSTOM = {2: 21.32, 4: 38.01, 8: 62.50}   # README 2023-12-16（提交 c5d3454）起：PyTorch 的 intra-node all-reduce
GPT_FAST_CONTEXT = 105                           # 平均上下文（假设：提示 5 + 命令行默认生成 200 个的一半）
GPT_FAST_EMPIRICAL_BW = 1700e9                   # [G]：A100"经验上峰值带宽约 1700 GB/s"


def _pct(x):
    return f"{100 * x:.0f}%"


def _fits(chip, n, batch):
    """n 块 chip 装得下权重 + batch 个上下文 CONTEXT 的序列吗（llm_math.max_batch，gang 的容量）。"""
    return batch <= max_batch(MODEL, gang(chip, n), CONTEXT)


# ---------------------------------------------------------------------------
def demo1_one_allreduce():
    print_header("演示 1：一次环形 all-reduce 的时间（每跳延迟 3 µs，假设）")
    d = MODEL.d_model
    rows, res = [], {}
    for label, n, link in [("NVLink", 2, NVLINK4), ("NVLink", 8, NVLINK4), ("PCIe", 8, PCIE5_X16)]:
        for batch in (1, 64):
            size = batch * d * 2
            ar = ring_allreduce(size, n, link)
            res[(label, n, batch)] = ar
            rows.append([f"{n}×{label}", batch, fmt_bytes(size), fmt_bytes(ar["bytes_per_gpu"]), ar["steps"],
                         fmt_time(ar["t_latency"]), fmt_time(ar["t_bandwidth"]), fmt_time(ar["time"])])
    print_table(["卡数×互联", "批", "消息", "每卡发送", "步数", "延迟项", "带宽项", "合计"], rows)
    a = res[("NVLink", 8, 1)]
    b = res[("PCIe", 8, 64)]
    print_observations([
        f"decode 一步的 all-reduce 数据很小：批 1 时是一个 token 的激活，{d} 个 BF16 = {fmt_bytes(d * 2)}。"
        f"环形 all-reduce 在 8 块卡上要走 {a['steps']} 步，延迟项 {fmt_time(a['t_latency'])}，带宽项只有 {fmt_time(a['t_bandwidth'])}："
        f"小消息的时间几乎全是每跳的固定延迟，和链路带宽几乎无关。",
        f"每块卡发送 2(n−1)/n 份数据：n = 8 时是消息的 {a['bytes_per_gpu'] / (d * 2):.2f} 倍，卡再多也不超过 2 倍。"
        f"批 64 经 PCIe（单向 {fmt_bytes(PCIE5_X16.bw)}/s）时带宽项是 {fmt_time(b['t_bandwidth'])}，"
        f"约为 NVLink 的 {NVLINK4.bw / PCIE5_X16.bw:.0f} 倍。",
    ])
    return {"b1_latency": a["t_latency"], "b1_bandwidth": a["t_bandwidth"], "ratio_bytes_8": a["bytes_per_gpu"] / (d * 2),
            "pcie_b64_bw": b["t_bandwidth"], "bw_ratio": NVLINK4.bw / PCIE5_X16.bw}


# ---------------------------------------------------------------------------
def demo2_decode_vs_batch():
    print_header(f"演示 2：{MODEL.name} decode 的 TPOT 与每卡吞吐（上下文 {CONTEXT}，BF16，每跳 3 µs）")
    print(f"权重 {fmt_bytes(weight_bytes(MODEL))}，一块 H100（{fmt_bytes(H100.mem_bytes)}）放不下；"
          f"\"—\" = 权重 + 批里的 KV cache 放不下。")
    tpot, comm, gang_t = {}, {}, {}
    rows = []
    for batch in BATCHES:
        row = [batch]
        for name, chip, n, link in CONFIGS:
            r = tp_decode_step(MODEL, chip, n, link, batch, CONTEXT)
            tpot[(name, batch)], comm[(name, batch)], gang_t[(name, batch)] = r["time"], r["t_comm"], r["t_work"]
            ok = _fits(chip, n, batch)
            row += [f"{r['time'] * 1e3:.1f}" if ok else "—", f"{batch / r['time'] / n:.0f}" if ok else "—"]
        rows.append(row)
    heads = ["批"]
    for name, *_ in CONFIGS:
        heads += [f"{name}\nTPOT ms", f"{name}\n每卡 tok/s"]
    print_table(heads, rows)
    rows2 = []
    for name, chip, n, link in CONFIGS:
        for batch in (1, 32):
            rows2.append([name, batch, fmt_time(gang_t[(name, batch)]), fmt_time(comm[(name, batch)]),
                          fmt_time(tpot[(name, batch)]), f"{100 * comm[(name, batch)] / tpot[(name, batch)]:.0f}%"])
    print()
    print_table(["配置", "批", "gang（不算通信）", "all-reduce 合计", "TPOT", "通信占"], rows2)
    # ---- 同一个模型对照实测：gpt-fast 在 A100 上的张量并行（[G]）----
    gf, rows3 = {}, []
    for n in (2, 4, 8):
        r = tp_decode_step(LLAMA2_70B, A100, n, NVLINK3, 1, GPT_FAST_CONTEXT)
        gf[n] = {"t_work": r["t_work"], "t_comm": r["t_comm"], "time": r["time"], "bytes": r["w_bytes"] + r["kv_bytes"]}
        rows3.append([n, fmt_time(r["t_work"]), fmt_time(r["t_comm"]), fmt_time(r["time"]), f"{1 / r['time']:.1f}",
                      f"{GPT_FAST_TP_NCCL[n]:.2f}", f"{GPT_FAST_TP_CUSTOM[n]:.2f}"])
    print()
    print(f"对照实测 [G]（{LLAMA2_70B.name} BF16，批 1，A100 + NVLink 3；模型同上，上下文 {GPT_FAST_CONTEXT} 是假设）：")
    print_table(["A100\n块数", "模型：gang", "模型：\nall-reduce", "模型 TPOT", "模型\ntok/s", "实测 tok/s\nNCCL",
                 "实测 tok/s\n自定义 AR"], rows3)
    t2, t4, t8 = (tpot[(f"{n}×SXM", 1)] for n in (2, 4, 8))
    p8 = tpot[("8×PCIe", 1)]
    n_ar = 2 * MODEL.n_layers
    model_48 = gf[8]["time"] / gf[4]["time"]
    custom_48 = GPT_FAST_TP_CUSTOM[4] / GPT_FAST_TP_CUSTOM[8]
    nccl_48 = GPT_FAST_TP_NCCL[4] / GPT_FAST_TP_NCCL[8]
    t_meas8 = 1 / GPT_FAST_TP_CUSTOM[8]
    implied_bw = gf[8]["bytes"] / 8 / (t_meas8 - gf[8]["t_comm"])     # 通信若真如模型，读权重要多快
    comm_max = t_meas8 - gf[8]["bytes"] / 8 / GPT_FAST_EMPIRICAL_BW     # 读权重不快于经验峰值时，通信最多多少
    n_ar2 = 2 * LLAMA2_70B.n_layers
    print_observations([
        f"每步 {n_ar} 次 all-reduce（{MODEL.n_layers} 层 × 2）。按这个模型（环形 all-reduce，每跳 3 µs 是假设），批 1："
        f"2、4、8 块 SXM 的 TPOT 是 {t2 * 1e3:.1f}、{t4 * 1e3:.1f}、{t8 * 1e3:.1f} ms——2→4 块剩 {100 * t4 / t2:.0f}%，"
        f"4→8 块剩 {100 * t8 / t4:.0f}%：读权重的时间按 1/n 缩短，模型里的通信却按 2(n−1) 步变长"
        f"（8 块卡时占 {100 * comm[('8×SXM', 1)] / t8:.0f}%）。这是模型的推论，不是测量：实测见观察 4。",
        f"gang 只是一个下界：8 块 SXM、批 1 时 gang 给出 {fmt_time(gang_t[('8×SXM', 1)])}，算上 all-reduce 是 "
        f"{fmt_time(t8)}（{t8 / gang_t[('8×SXM', 1)]:.1f} 倍）；批 32 时是 {tpot[('8×SXM', 32)] / gang_t[('8×SXM', 32)]:.1f} 倍。",
        f"8 块 PCIe 卡：每块带宽 {fmt_bytes(H100_PCIE.mem_bw)}/s（SXM 是 {fmt_bytes(H100.mem_bw)}/s），互联慢 "
        f"{NVLINK4.bw / PCIE5_X16.bw:.0f} 倍；批 1 时 TPOT {p8 * 1e3:.1f} ms，是 8 块 SXM 的 {p8 / t8:.1f} 倍。",
        f"最后一张表：同一个模型放到 A100 上预测 2、4、8 块 {1 / gf[2]['time']:.1f}、{1 / gf[4]['time']:.1f}、"
        f"{1 / gf[8]['time']:.1f} tok/s，4→8 块时间剩 {_pct(model_48)}；gpt-fast 实测 {GPT_FAST_TP_CUSTOM[2]:.2f}、"
        f"{GPT_FAST_TP_CUSTOM[4]:.2f}、{GPT_FAST_TP_CUSTOM[8]:.2f} tok/s，剩 {_pct(custom_48)}。模型的 tok/s 每一格都比"
        f"实测高（读权重按手册带宽算，是下界），实测却随卡数涨得比模型快：加卡比模型说的划算，问题出在通信项（观察 5）。",
        f"模型说 8 块卡每步通信 {fmt_time(gf[8]['t_comm'])}。通信和计算不重叠时（decode 的下一层要等 all-reduce 的"
        f"结果），实测的 {fmt_time(t_meas8)} 里读权重只剩 {fmt_time(t_meas8 - gf[8]['t_comm'])}，每块卡要读到 "
        f"{implied_bw / 1e9:,.0f} GB/s，"
        f"高于 [G] 说的经验峰值约 {GPT_FAST_EMPIRICAL_BW / 1e9:.0f} GB/s。反过来，读权重不快于它时，通信最多 "
        f"{fmt_time(comm_max)}，一次 all-reduce（每步 {n_ar2} 次）最多 {fmt_time(comm_max / n_ar2)}，少于环形模型的 "
        f"{fmt_time(gf[8]['t_comm'] / n_ar2)}：对 {LLAMA2_70B.d_model * 2:,} 字节这种 decode 大小的消息，环形模型"
        f"（每跳 3 µs）的通信项偏悲观。这组实测打开了 PyTorch 的节点内 all-reduce（[G']：one-shot 一类，不走环）；README 早两周"
        f"的版本用默认的 NCCL，8 块卡是 {GPT_FAST_TP_NCCL[8]:.2f} tok/s，4→8 块剩 {_pct(nccl_48)}。"
        f"H100 上 NCCL all-reduce 的实测和环形模型的对照：第 1 讲 06 的演示 2。",
    ])
    return {"tpot": tpot, "comm": comm, "gang": gang_t, "n_allreduce": n_ar, "gpt_fast": gf, "model_48": model_48,
            "custom_48": custom_48, "nccl_48": nccl_48, "implied_bw_8": implied_bw, "comm_max_8": comm_max}


# ---------------------------------------------------------------------------
def demo3_latency_sweep():
    print_header("演示 3：每跳延迟（假设）决定小批时加卡划不划算（NVLink，批 1 和批 32）")
    rows, best = [], {}
    for lat in LATENCIES:
        for batch in (1, 32):
            times = {n: tp_decode_step(MODEL, H100, n, NVLINK4, batch, CONTEXT, hop_latency=lat)["time"]
                     for n in (2, 4, 8)}
            b = min(times, key=times.get)
            best[(lat, batch)] = (b, times)
            rows.append([f"{lat * 1e6:.0f} µs", batch] + [f"{times[n] * 1e3:.1f}" for n in (2, 4, 8)] + [f"{b} 块"])
    print_table(["每跳延迟", "批", "2 块 TPOT ms", "4 块", "8 块", "最快"], rows)
    b1 = [best[(lat, 1)][0] for lat in LATENCIES]
    t10 = best[(10e-6, 1)][1]
    print_observations([
        f"批 1 时最快的卡数：每跳 1 µs → {b1[0]} 块，3 µs → {b1[1]} 块，10 µs → {b1[2]} 块。"
        f"每跳 10 µs 时 8 块卡（{t10[8] * 1e3:.1f} ms）比 4 块（{t10[4] * 1e3:.1f} ms）还慢："
        f"多出来的 all-reduce 步数吃掉了读权重省下的时间。",
        f"所以\"几块卡最好\"不是数据手册能回答的：它取决于通信软件（用什么算法、每一步多快；这里的环形和每跳延迟"
        f"都是假设，实测对照见演示 2 的最后一张表）。"
        f"批 32 时最快的是 {best[(1e-6, 32)][0]}、{best[(3e-6, 32)][0]}、{best[(10e-6, 32)][0]} 块（按同样三个延迟）。",
    ])
    return {"best": {k: v[0] for k, v in best.items()}, "times": {k: v[1] for k, v in best.items()}}


# ---------------------------------------------------------------------------
def demo4_prefill():
    print_header("演示 4：prefill 时 all-reduce 随提示变长（每跳 3 µs）")
    rows, share, tcomm, twork, ar = [], {}, {}, {}, {}
    for n_tokens in (1024, 8192):
        for name, chip, n, link in CONFIGS:
            r = tp_prefill_step(MODEL, chip, n, link, n_tokens)
            share[(name, n_tokens)], ar[(name, n_tokens)] = r["comm_share"], r["allreduce"]
            tcomm[(name, n_tokens)], twork[(name, n_tokens)] = r["t_comm"], r["t_work"]
            rows.append([n_tokens, name, fmt_bytes(n_tokens * MODEL.d_model * 2), fmt_time(r["t_work"]),
                         fmt_time(r["t_comm"]), f"{100 * r['comm_share']:.0f}%"])
    print_table(["提示 token", "配置", "每次 all-reduce", "计算（gang）", "all-reduce 合计", "通信占"], rows)
    a1, a8 = ar[("8×SXM", 1024)], ar[("8×SXM", 8192)]
    print_observations([
        f"prefill 的 all-reduce 是整个提示的激活：8k 个 token 时一次 {fmt_bytes(8192 * MODEL.d_model * 2)}，"
        f"带宽项成了主角（8 块 SXM 上一次的带宽项 {fmt_time(a8['t_bandwidth'])}，延迟项 {fmt_time(a8['t_latency'])}）。"
        f"8 块 SXM 上通信占 {100 * share[('8×SXM', 1024)]:.0f}%（1k）和 {100 * share[('8×SXM', 8192)]:.0f}%（8k）："
        f"提示长了，占比反而小一些，因为 1k 时固定的延迟项还占通信的 "
        f"{100 * a1['t_latency'] / a1['time']:.0f}%，而注意力的计算按 N² 增长。"
        f"8 块 PCIe 卡上是 {100 * share[('8×PCIe', 1024)]:.0f}% 和 {100 * share[('8×PCIe', 8192)]:.0f}%。",
        f"这里假设计算和通信不重叠；能重叠时，通信最多藏到和计算一样长。8 块 PCIe 卡、8k 个 token 时 all-reduce "
        f"本身（{fmt_time(tcomm[('8×PCIe', 8192)])}）就比计算（{fmt_time(twork[('8×PCIe', 8192)])}）长，重叠也藏不住。"
        f"跨机器的网络也是这个量级（hw_specs 的 Link 表：InfiniBand NDR 一个端口单向 {fmt_bytes(IB_NDR.bw)}/s，"
        f"PCIe Gen5 x16 是 {fmt_bytes(PCIE5_X16.bw)}/s），所以按这个模型，跨机器做张量并行的 prefill 也会像"
        f" 8 块 PCIe 卡这样，通信比计算还长。",
    ])
    return {"share": share, "t_comm": tcomm, "t_work": twork, "allreduce": ar}


# ---------------------------------------------------------------------------
def demo5_pipeline():
    n = 4
    print_header(f"演示 5：对照流水线并行（{n} 块 H100 SXM，NVLink，每跳 3 µs）")
    rows, res = [], {}
    for batch in (1, 32):
        tp = tp_decode_step(MODEL, H100, n, NVLINK4, batch, CONTEXT)
        pp1 = pp_decode_step(MODEL, H100, n, NVLINK4, batch, CONTEXT, in_flight=1)
        ppn = pp_decode_step(MODEL, H100, n, NVLINK4, batch, CONTEXT, in_flight=n)
        res[batch] = (tp, pp1, ppn)
        rows.append([batch, "张量并行", fmt_time(tp["time"]), f"{batch / tp['time'] / n:.0f}",
                     f"{100 * tp['t_work'] / tp['time']:.0f}%"])
        rows.append([batch, "流水线，1 个批在跑", fmt_time(pp1["tpot"]), f"{pp1['tokens_per_s'] / n:.0f}",
                     f"{100 * pp1['busy']:.0f}%"])
        rows.append([batch, f"流水线，{n} 个批轮流", fmt_time(ppn["tpot"]), f"{ppn['tokens_per_s'] / n:.0f}",
                     f"{100 * ppn['busy']:.0f}%"])
    print_table(["每批序列", "切法", "TPOT", "每卡 tok/s", "每块卡在算"], rows)
    tp, pp1, ppn = res[1]
    print_observations([
        f"批 1：流水线的 TPOT {fmt_time(pp1['tpot'])}，和假想一块卡装下整个模型的 {fmt_time(pp1['t_one_chip'])} "
        f"只差 {n} 跳（{fmt_time(pp1['t_hops'])}）——每个 token 仍要依次走完全部 {MODEL.n_layers} 层，一次只有一段在算"
        f"（每块卡只有 {100 * pp1['busy']:.0f}% 的时间在算，其余是气泡）；张量并行是 {fmt_time(tp['time'])}"
        f"（按环形模型，它的卡有 {100 * (1 - tp['t_work'] / tp['time']):.0f}% 的时间在等 all-reduce）。"
        f"流水线要靠 {n} 个批轮流把气泡填上，换来的是吞吐（每卡 {ppn['tokens_per_s'] / n:.0f} tok/s），不是延迟。",
    ])
    return {"pp1": pp1, "ppn": ppn, "tp": tp}


if __name__ == "__main__":
    demo1_one_allreduce()
    demo2_decode_vs_batch()
    demo3_latency_sweep()
    demo4_prefill()
    demo5_pipeline()
