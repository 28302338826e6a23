"""
=============================================================================
CS349E · 第 5 讲 · 03_kv_transfer.py —— 解耦要付的运费：把 KV cache 从 prefill 机搬到 decode 机
=============================================================================

【这个脚本要回答的问题】
演示 1：一个请求 prefill 完，要交给 decode 机的 KV cache 有多大：Llama-3.1-8B / 70B、gpt-oss-120b，提示从 2K 到 128K；
gpt-oss 一半的层是 128 个位置的滑动窗口，省了多少。
演示 2：搬这些字节要多久：NVLink / InfiniBand / PCIe / 以太网，和它前面那次 prefill 的时间比；逐层边算边发能藏掉多少。

【怎么读输出】演示 2 的链路表每种部署两列：搬运时间、它占 prefill 时间的百分比（表头 70B = Llama-3.1-70B、
oss = gpt-oss-120b，后面是提示长度）。百分比 < 100% 时，网络跟得上 GPU 产生 KV 的速度，
逐层边算边发几乎可以全部藏在 prefill 后面；> 100% 时网络是瓶颈。

【模型的假设（务必看）】
KV cache 按 BF16（每个数 2 字节）；滑动窗口层只存最近 128 个位置（llm_math.kv_bytes）。prefill 时间是 roofline 下界
（llm_math.prefill_time）：Llama-3.1-70B 在 8 块 H100 上按**理想张量并行**（算力、带宽乘 8，卡间通信不要钱——**假设**），
权重 BF16；gpt-oss-120b 在一块 H100 上，权重按 4.25 位算（MXFP4；非专家部分实际是 BF16，对 prefill 的时间几乎没有影响），
矩阵乘按 BF16 峰值算。搬运时间 = 字节 / 单向带宽，不算延迟、协议开销和内存拷贝（**假设**；几百 MB 时延迟可以忽略）。
链路带宽是 ../lecture01/hw_specs 末尾互联表里的**单向**数字（NVLink 4 每块 GPU 450 GB/s、NDR 一个端口 50 GB/s、
PCIe Gen5 x16 约 64 GB/s、400 GbE 50 GB/s、100 GbE 12.5 GB/s），出处写在表里。其中 NVLink 4 只连同一台机器里的 GPU、
PCIe 只连 GPU 和它自己的主机，都不能把 KV 送到另一台机器（演示 2 观察 5）：表里这两行只作对照。

【运行】python3 03_kv_transfer.py （约 0.3 秒）

【依赖】numpy（iteration_lab 要用）；本目录的 iteration_lab（link_time）；../lecture01 的 console、hw_specs（gang、互联表）、llm_math。
"""
import os
import sys
from dataclasses import replace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))

from console import fmt_bytes, fmt_time, print_header, print_note, print_observations, print_table  # noqa: E402
from hw_specs import ALL_LINKS, ETH_100G, ETH_400G, H100, IB_NDR, NVLINK4, PCIE5_X16  # noqa: E402
from llm_math import GPT_OSS_120B, LLAMA31_70B, LLAMA31_8B, prefill_time  # noqa: E402
from hw_specs import gang  # noqa: E402
from iteration_lab import link_time  # noqa: E402

# ---- 部署（假设，见文件开头）：(模型, 芯片, 权重位数, prefill 机的 GPU 数) ----
DEPLOY = ((LLAMA31_70B, gang(H100, 8), 16.0, 8), (GPT_OSS_120B, H100, 4.25, 1))
PROMPTS = (2048, 32768)
SHORT = {LLAMA31_70B.name: "70B", GPT_OSS_120B.name: "oss"}          # 演示 2 表头里的简称
LINK_SHORT = {NVLINK4.name: "NVLink 4，一块 GPU", IB_NDR.name: "IB NDR，一个端口", ETH_400G.name: "400 GbE",
              ETH_100G.name: "100 GbE", "InfiniBand NDR × 每块 GPU 一个端口": "IB NDR，每块 GPU 一个"}
# 连不了两台机器的链路：NVLink 4 连同一台机器里的 GPU，PCIe 连 GPU 和它自己的主机（演示 2 只拿它们作对照）
INSIDE_ONE_MACHINE = (NVLINK4.name, PCIE5_X16.name)


# ---------------------------------------------------------------------------
# 演示 1：要搬多少字节
# ---------------------------------------------------------------------------
def demo1_kv_bytes():
    print_header("演示 1：一个请求 prefill 完的 KV cache（BF16）")
    lens = (2048, 8192, 32768, 131072)
    no_window = replace(GPT_OSS_120B, name="gpt-oss-120b（假如无窗口）", sliding_window=0)
    rows, out = [], {}
    for m in (LLAMA31_8B, LLAMA31_70B, GPT_OSS_120B, no_window):
        rows.append([m.name, f"{m.n_layers}×{m.n_kv_heads}×{m.head_dim}", fmt_bytes(m.kv_bytes_per_token())]
                    + [fmt_bytes(m.kv_bytes(n)) for n in lens])
        out[m.name] = {n: m.kv_bytes(n) for n in lens}
    print_table(["模型", "层×KV 头×d_head", "每个位置"] + [f"提示 {n}" for n in lens], rows)
    print("（每个位置：所有层都存这个位置时的 K、V 字节；滑动窗口层只存最近 "
          f"{GPT_OSS_120B.sliding_window} 个位置）")
    g, nw = out[GPT_OSS_120B.name], out[no_window.name]
    r = {"kv_70b_32k": out[LLAMA31_70B.name][32768], "kv_oss_32k": g[32768],
         "window_ratio_32k": g[32768] / nw[32768], "window_ratio_2k": g[2048] / nw[2048],
         "ratio_70b_oss_32k": out[LLAMA31_70B.name][32768] / g[32768]}
    print_observations([
        f"KV 和提示长度成正比：Llama-3.1-70B 每个位置 {fmt_bytes(LLAMA31_70B.kv_bytes_per_token())}，32768 个 token 的提示就是 "
        f"{fmt_bytes(r['kv_70b_32k'])}——这就是解耦时每个请求要从 prefill 机搬到 decode 机的\"货\"。",
        f"gpt-oss-120b 小得多：32768 时 {fmt_bytes(r['kv_oss_32k'])}，约为 70B 的 1/{r['ratio_70b_oss_32k']:.0f}。"
        f"KV 头两者都是 {GPT_OSS_120B.n_kv_heads} 个；差别来自层数（{GPT_OSS_120B.n_layers} 层 vs {LLAMA31_70B.n_layers} 层）、"
        f"head_dim（{GPT_OSS_120B.head_dim} vs {LLAMA31_70B.head_dim}），"
        f"以及一半的层是 {GPT_OSS_120B.sliding_window} 个位置的滑动窗口：这些层的 KV 不随提示变长。",
        f"滑动窗口在长提示上几乎省一半：32768 时是\"没有窗口\"的 {r['window_ratio_32k'] * 100:.1f}%，2048 时 "
        f"{r['window_ratio_2k'] * 100:.1f}%（窗口层存的 {GPT_OSS_120B.sliding_window} 个位置在短提示里占的比例更大）。",
    ])
    return r


# ---------------------------------------------------------------------------
# 演示 2：搬多久，和 prefill 比
# ---------------------------------------------------------------------------
def demo2_transfer_vs_prefill():
    print_header("演示 2：搬 KV 的时间 vs 它前面那次 prefill 的时间")
    cols = []
    for model, chip, wb, n_gpu in DEPLOY:
        for n in PROMPTS:
            cols.append((model, chip, n, n_gpu, prefill_time(model, chip, n, w_bits=wb), model.kv_bytes(n)))
    heads = [f"{SHORT[m.name]} {n}" for m, _, n, _, _, _ in cols]
    print_table([""] + heads,
                [["prefill 时间"] + [fmt_time(t) for *_, t, _ in cols],
                 ["KV 字节"] + [fmt_bytes(b) for *_, b in cols]])
    note = "；".join(f"{SHORT[m.name]} = {m.name}，在 {chip.name} 上 prefill" for m, chip, _, _ in DEPLOY)
    print_note(f"（{note}；后面的数是提示长度）", rest_prefix=" ")
    print()
    links = [(lk.name, lk, 1) for lk in ALL_LINKS] + [("InfiniBand NDR × 每块 GPU 一个端口", IB_NDR, None)]
    rows, out = [], {}
    for label, lk, n_links in links:
        cells = [LINK_SHORT.get(label, label), f"{lk.bw / 1e9:.1f}"]
        for m, _, n, n_gpu, t_pre, nb in cols:
            k = n_gpu if n_links is None else n_links
            t = link_time(nb, lk, k)
            out[(label, m.name, n)] = (t, t / t_pre)
            cells += [fmt_time(t), f"{t / t_pre * 100:.1f}%"]
        rows.append(cells)
    print_table(["链路", "GB/s"] + [h for head in heads for h in (head, "占比")], rows)
    print("（GB/s：每条链路的单向带宽；每组两列：搬运时间、占它前面那次 prefill 的百分比；")
    print(f" 前 {len(links) - 1} 行整份 KV 走一条链路，最后一行每块 GPU 用自己的端口送自己那份；")
    inside = "、".join(LINK_SHORT.get(n, n).split("，")[0] for n in INSIDE_ONE_MACHINE)
    across = [lab for lab, _, _ in links if lab not in INSIDE_ONE_MACHINE]
    print(f" {inside} 两行连不了两台机器，只作对照（观察 5））")
    m70, mo = LLAMA31_70B.name, GPT_OSS_120B.name
    ib1, ib8 = IB_NDR.name, links[-1][0]
    t_pre70 = cols[0][4]
    ib_t, ib_ratio = out[(ib1, m70, 2048)]
    eth_t, eth_ratio = out[(ETH_100G.name, m70, 2048)]
    r = {"pre70_2k": t_pre70, "ib_70_2k": ib_t, "ib_ratio_70_2k": ib_ratio, "ib_ratio_70_32k": out[(ib1, m70, 32768)][1],
         "ib8_ratio_70_2k": out[(ib8, m70, 2048)][1], "eth_ratio_70_2k": eth_ratio,
         "ib_ratio_oss_2k": out[(ib1, mo, 2048)][1], "eth_ratio_oss_2k": out[(ETH_100G.name, mo, 2048)][1],
         "exposed_layerwise_70_2k": ib_t / LLAMA31_70B.n_layers,
         "slower_than_prefill": sorted({lab for (lab, _, _), (_, q) in out.items() if q > 1}),
         "kv_ratio_2k": cols[0][5] / cols[2][5], "pre_ratio_2k": cols[0][4] / cols[2][4],
         "across_machines": across}
    slow = "、".join(r["slower_than_prefill"]) or "没有"
    print_observations([
        f"{m70} 提示 2048：{DEPLOY[0][3]} 卡 prefill 约 {fmt_time(t_pre70)}；整份 KV 走一个 NDR 端口要 {fmt_time(ib_t)}"
        f"（{ib_ratio * 100:.0f}%），{DEPLOY[0][3]} 块 GPU 各用自己的网卡送自己那份（张量并行下每块卡本来就只存 "
        f"1/{DEPLOY[0][3]} 的 KV 头）只要 "
        f"{r['ib8_ratio_70_2k'] * 100:.1f}%。只有一个 100 GbE 口就慢了：{fmt_time(eth_t)}，是 prefill 的 {eth_ratio:.2f} 倍。"
        f"比 prefill 还慢的组合：{slow}。",
        f"提示变长，比例反而下降（NDR：2048 时 {ib_ratio * 100:.0f}%，32768 时 {r['ib_ratio_70_32k'] * 100:.0f}%）："
        "KV 和提示长度成正比，prefill 里注意力的运算却按长度的平方涨。",
        f"{mo} 的 KV 很省（演示 1），同样一个 NDR 端口只占 prefill 的 {r['ib_ratio_oss_2k'] * 100:.1f}%，"
        f"连 100 GbE 也只占 {r['eth_ratio_oss_2k'] * 100:.0f}%：提示 2048 时它的 KV 只有 70B 的 1/{r['kv_ratio_2k']:.1f}"
        f"（层数少、head_dim 小、滑动窗口），prefill 时间却是 70B 的 1/{r['pre_ratio_2k']:.1f}"
        f"（一块卡 vs {DEPLOY[0][3]} 块卡），比例自然小得多。",
        f"比例小于 100% 时，不必等 prefill 全部算完再发：每算完一层就把这一层的 KV 发出去（Splitwise 的做法，Patel et al., ISCA 2024, arXiv 2311.18677），"
        f"搬运和后面的层重叠，露在外面的只剩最后一层的那份：{m70} 走一个 NDR 端口约 {fmt_time(r['exposed_layerwise_70_2k'])}"
        f"（{fmt_time(ib_t)} / {LLAMA31_70B.n_layers} 层）。比例大于 100% 时藏不住，网络决定了解耦值不值。",
        "哪几行能真的把 KV 从 prefill 机送到另一台 decode 机：只有"
        + "".join(f"「{LINK_SHORT.get(lab, lab)}」" for lab in across) + "这几行（网卡和交换机）。"
        f"{inside} 不行：NVLink 连的是同一台机器里的 GPU（要机柜级的 NVLink 域，如 GB200 NVL72，才跨出一台机器），"
        "所以 NVLink 那一行只在 prefill 和 decode 放在同一台机器的不同 GPU 上时才用得上；PCIe 连的是 GPU 和它自己的主机，"
        "KV 经主机内存再上网卡时它是串在网卡前面多走的一段，不能代替网卡。",
    ])
    return r


if __name__ == "__main__":
    demo1_kv_bytes()
    demo2_transfer_vs_prefill()
