"""
=============================================================================
CS349E · 第 2 讲 · 04_kv_cache.py —— KV cache：有多大、GQA 省了多少、不用它要多算多少
=============================================================================

【这个脚本要回答的问题】
演示 1：Llama 3.1 8B / 70B / 405B 的 KV cache 随上下文和批大小有多大，和权重比、和一块 H100 的 80 GB 比。
演示 2：多头（MHA）、分组（GQA，Llama 3.1 的做法）、多查询（MQA）注意力：把 Llama-3.1-70B 的 KV 头数换成 64 / 8 / 1，
KV cache、注意力的算术强度、H100 上读 KV 的时间各变成多少；再画出三者的 KV cache 随上下文的增长，和权重比。
演示 3：缓存 vs 重算：在 numpy 小模型上贪心生成 n 个 token，带缓存（每步只喂 1 个 token）和不带缓存（每步把整个前缀重算一遍）
的账本 FLOPs，和闭式公式逐个核对；再用公式看 Llama-3.1-70B 上差多少。

【怎么读输出】KV 字节按 BF16（每个数 2 字节）：每个 token 存 2（K 和 V）× 层数 × KV 头数 × head_dim × 2 字节。
"有用 FLOPs" 是账本的 "useful" 字段（矩阵乘，因果遮罩挡住的不算）。字节用十进制单位（1 GB = 10⁹ 字节）。

【模型的假设（务必看）】模型结构来自 Llama 3.1 的 config.json（llm_math）；MHA / MQA 是把 Llama-3.1-70B 的 n_kv_heads 改掉得到的
**假想变体**（dataclasses.replace），不是真实的模型，只比较结构带来的账，不涉及它们的质量。时间是 H100 SXM5 上的 roofline 下界
（3.35 TB/s、BF16 989.4 TFLOP/s，数据手册），不算逐元素运算和开销，也**不管放不放得下**。演示 3 的小模型是 transformer_lab.LEC2_CFG（同 01 脚本，
随机初始化，float64），提示用 transformer_lab.random_tokens 生成。lm_head 的口径：小模型（NumpyTransformer）在每个算过的位置上
都算 lm_head，和它的账本核对的闭式公式也按这个口径；Llama-3.1-70B 那张表按真实引擎的口径——每次前向（不管带不带缓存）
只在最后一个位置算 lm_head（生成下一个 token 只需要它），和 llm_math 的 prefill_step / decode_step 一致。
MQA 的出处：Shazeer 2019（arXiv 1911.02150）；GQA：Ainslie 等 2023（arXiv 2305.13245）。

【运行】python3 04_kv_cache.py （约 0.4 秒）

【依赖】numpy；本目录的 transformer_lab（NumpyTransformer、LEC2_CFG、random_tokens）、ledger_lab（Counter、analytic_ops、sum_rows）；
../lecture01 的 console、hw_specs、llm_math（decode_step、prefill_step）。
"""
import math
import os
import sys
from dataclasses import replace

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
for sub in ("lecture01", "lecture02"):
    sys.path.insert(0, os.path.join(HERE, "..", sub))

from console import (fmt_bytes, fmt_num, fmt_time, print_header, print_observations, print_plot,  # noqa: E402
                     print_table)
from hw_specs import H100, roofline_time  # noqa: E402
from llm_math import LLAMA31_8B, LLAMA31_70B, LLAMA31_405B, decode_step, prefill_step  # noqa: E402
from transformer_lab import LEC2_CFG, NumpyTransformer, init_params, random_tokens  # noqa: E402
from ledger_lab import ATTN_CORE_OPS, Counter, MATMUL_OPS, analytic_ops, sum_rows  # noqa: E402

# ---- 演示 3 的小模型（transformer_lab.LEC2_CFG，同 01 脚本）----
CFG = LEC2_CFG
SEED, PROMPT_SEED = 0, 1
N_PROMPT = 32                   # 演示 3 的提示长度
SNAPSHOTS = (1, 8, 32, 64)      # 生成到第几个 token 时记一次账（32 + 64 − 1 = 95 ≤ max_seq）
BOUND_CN = {"compute": "算力", "memory": "带宽"}


# ---------------------------------------------------------------------------
# 演示 1：KV cache 有多大
# ---------------------------------------------------------------------------
def demo1_cache_size():
    print_header("演示 1：Llama 3.1 的 KV cache 有多大（BF16）")
    ctxs = (8192, 32768, 131072)
    rows, res = [], {}
    for m in (LLAMA31_8B, LLAMA31_70B, LLAMA31_405B):
        per_tok = int(m.kv_bytes_per_token())
        w = 2 * m.params()
        res[m.name] = {"per_token": per_tok, "weights": w, "break_even_ctx": w / per_tok,
                       "per_seq": {c: m.kv_bytes(c) for c in ctxs}}
        rows.append([m.name, m.n_layers, f"{m.n_kv_heads} × {m.head_dim}", f"{per_tok:,} B"]
                    + [fmt_bytes(m.kv_bytes(c)) for c in ctxs] + [fmt_bytes(w), f"{w / per_tok:,.0f}"])
    print_table(["模型", "层", "KV 头\n× head_dim", "每个 token\n的 KV"] + [f"一个序列\n@ {c}" for c in ctxs]
                + ["权重\n（BF16）", "KV = 权重时\n的 token 数"], rows)

    m = LLAMA31_70B
    batches, ctxs2 = (1, 8, 32, 128), (4096, 32768, 131072)
    print(f"\n{m.name}：批大小 × 上下文 → KV cache 总量")
    print(f"（括号里：只放 KV 就要几块 80 GB 的 H100；权重另需 {fmt_bytes(2 * m.params())}）")
    grid, rows2 = {}, []
    for B in batches:
        cells = [B]
        for c in ctxs2:
            kv = B * m.kv_bytes(c)
            grid[(B, c)] = kv
            cells.append(f"{fmt_bytes(kv)}（{math.ceil(kv / H100.mem_bytes)} 块）")
        rows2.append(cells)
    print_table(["批大小 B"] + [f"上下文 {c}" for c in ctxs2], rows2)

    # 账本核对：decode 一步，注意力读的 KV 字节 = 整个缓存
    ledger_kv = sum_rows(analytic_ops(m, 1, 1, 8191, last_only=True), "kv", ATTN_CORE_OPS)
    r70 = res[m.name]
    print_observations([
        f"每个 token 的 KV = 2 × 层数 × KV 头 × head_dim × 2 字节：{m.name} 是 2 × {m.n_layers} × {m.n_kv_heads} × "
        f"{m.head_dim} × 2 = {r70['per_token']:,} 字节。一个 131072 长的序列就有 {fmt_bytes(r70['per_seq'][131072])}，"
        f"占一块 H100（{fmt_bytes(H100.mem_bytes)}）的 {100 * r70['per_seq'][131072] / H100.mem_bytes:.0f}%。",
        f"KV cache 和批大小、上下文都成正比：B × 上下文 超过约 {r70['break_even_ctx']:,.0f} 个 token，{m.name} 的 KV 就比权重"
        f"（{fmt_bytes(r70['weights'])}）还大。B = 32、上下文 32768 时 KV 有 {fmt_bytes(grid[(32, 32768)])}。"
        "服务时能开多大的批，常常受 KV cache 的显存限制（vLLM 论文，Kwon 等 2023，arXiv 2309.06180；第 5 讲 07）。",
        f"decode 每一步都要把整个缓存读一遍：公式记的账（analytic_ops）里上下文 8192 时一步读的 KV = {ledger_kv:,} 字节，"
        f"正好等于缓存的大小 {int(m.kv_bytes(8192)):,} 字节——" + ("一致" if ledger_kv == m.kv_bytes(8192) else "不一致！") + "。",
        f"三个模型的 KV 头都是 8 个、head_dim 都是 128，每 token 的 KV 只和层数成正比；405B 的参数是 8B 的 "
        f"{LLAMA31_405B.params() / LLAMA31_8B.params():.0f} 倍，每 token 的 KV 只是 "
        f"{res[LLAMA31_405B.name]['per_token'] / res[LLAMA31_8B.name]['per_token']:.2f} 倍。",
    ])
    return {"models": res, "grid_70b": grid, "ledger_kv_8192": ledger_kv, "kv_70b_8192": m.kv_bytes(8192)}


# ---------------------------------------------------------------------------
# 演示 2：MHA vs GQA vs MQA
# ---------------------------------------------------------------------------
def demo2_mha_gqa_mqa():
    B, ctx = 32, 8192
    print_header(f"演示 2：MHA vs GQA vs MQA——Llama-3.1-70B 的三个变体（decode，B = {B}，上下文 {ctx}，{H100.name}）")
    variants = [("MHA（假想）", replace(LLAMA31_70B, name="70B-MHA", n_kv_heads=64)),
                ("GQA（真实）", LLAMA31_70B),
                ("MQA（假想）", replace(LLAMA31_70B, name="70B-MQA", n_kv_heads=1))]
    rows, res = [], {}
    for label, m in variants:
        rr = analytic_ops(m, B, 1, ctx - 1, last_only=True)
        fa, ka = sum_rows(rr, "useful", ATTN_CORE_OPS), sum_rows(rr, "kv", ATTN_CORE_OPS)
        fp, wp = sum_rows(rr, "useful", MATMUL_OPS), sum_rows(rr, "w", MATMUL_OPS)
        ta, tp = roofline_time(fa, ka, H100), roofline_time(fp, wp, H100)
        res[label] = {"n_kv_heads": m.n_kv_heads, "group": m.group, "params": m.params(),
                      "per_token": int(m.kv_bytes_per_token()), "kv_total": ka, "attn_intensity": fa / ka,
                      "t_attn": ta, "t_proj": tp}
        rows.append([label, m.n_kv_heads, m.group, f"{m.params() / 1e9:.2f} B", fmt_bytes(m.kv_bytes_per_token()),
                     fmt_bytes(ka), f"{fa / ka:g}", fmt_time(ta), fmt_time(tp), f"{100 * ta / (ta + tp):.0f}%"])
    print("时间 = H100 上的 roofline 下界；注意力占 = 读 KV 的时间 ÷（读 KV + 投影 + FFN）")
    print_table(["变体", "KV 头", "组大小 G", "参数量", "KV/token", "KV 总量", "注意力强度", "读 KV", "投影+FFN",
                 "注意力占"], rows)
    mha, gqa, mqa = (res[v[0]] for v in variants)
    # 图：批 B 个序列的 KV 总量随上下文增长，旁边是（GQA 的）BF16 权重
    ctxs = [1024 * 2 ** (k / 4) for k in range(29)]                  # 1024 … 131072，对数均匀
    w_gqa = 2 * LLAMA31_70B.params()
    series = {label.split("（")[0]: (ctxs, [B * m.kv_bytes(c) / 1e9 for c in ctxs], mark)
              for (label, m), mark in zip(variants, "*o+")}
    series["权重（GQA，BF16）"] = (ctxs, [w_gqa / 1e9] * len(ctxs), "-")
    print(f"\n批 {B} 个序列的 KV cache 总量 vs 上下文：")
    print_plot(series, "上下文（token，对数轴）", "KV cache 总量（GB，对数轴）", logx=True, logy=True,
               xlim=(1000, 1.5 * ctxs[-1]))
    cross = {label: w_gqa / (B * m.kv_bytes_per_token()) for label, m in variants}   # KV 总量 = 权重 时的上下文
    print_observations([
        f"KV cache 和 KV 头数成正比：MHA 的 KV 是 GQA 的 {mha['kv_total'] / gqa['kv_total']:g} 倍"
        f"（{fmt_bytes(mha['kv_total'])} vs {fmt_bytes(gqa['kv_total'])}），MQA 是 GQA 的 1/{gqa['kv_total'] / mqa['kv_total']:g}。",
        f"注意力核心的强度 = 组大小 G：MHA {mha['attn_intensity']:g}、GQA {gqa['attn_intensity']:g}、MQA "
        f"{mqa['attn_intensity']:g}（03 脚本）。注意力的有用 FLOPs 三者一样（query 头数没变），只是读的 KV 少了。",
        f"这个批和上下文下，MHA 读 KV 要 {fmt_time(mha['t_attn'])}，是投影 + FFN（{fmt_time(mha['t_proj'])}）的 "
        f"{mha['t_attn'] / mha['t_proj']:.1f} 倍；GQA 降到 {fmt_time(gqa['t_attn'])}，MQA {fmt_time(mqa['t_attn'])}。",
        f"参数量变化不大：只有 k/v 投影跟着 KV 头数变（MHA {mha['params'] / 1e9:.2f} B，比 GQA 多 "
        f"{100 * (mha['params'] / gqa['params'] - 1):.0f}%；MQA {mqa['params'] / 1e9:.2f} B，少 "
        f"{100 * (1 - mqa['params'] / gqa['params']):.1f}%），KV cache 却差 "
        f"{mha['kv_total'] / mqa['kv_total']:g} 倍（MHA vs MQA）。代价在质量上，这个脚本只算账、量不出来："
        "MQA 出自 Shazeer 2019（arXiv 1911.02150）；Ainslie 等 2023（arXiv 2305.13245）报告 MQA 比 MHA 质量有所下降，"
        "GQA 的质量接近 MHA、速度接近 MQA。",
        f"图里三条线平行（KV 都和上下文成正比），相邻两条差 {mha['kv_total'] / gqa['kv_total']:g} 倍（KV 头数之比）。"
        f"批 {B} 时 KV 总量追上权重（"
        f"{fmt_bytes(w_gqa)}）的上下文：MHA {cross[variants[0][0]]:,.0f}、GQA {cross[variants[1][0]]:,.0f}、"
        f"MQA {cross[variants[2][0]]:,.0f} 个 token。",
    ])
    res["crossover_ctx"] = cross
    return res


# ---------------------------------------------------------------------------
# 演示 3：缓存 vs 重算
# ---------------------------------------------------------------------------
def tri(k):
    """1 + 2 + … + k：一次因果前向（k 个位置）里 (query, key) 的对数。"""
    return k * (k + 1) // 2


def tet(k):
    """tri(1) + tri(2) + … + tri(k) = k(k+1)(k+2)/6。"""
    return k * (k + 1) * (k + 2) // 6


def closed_form_useful(mc, p, n, last_only):
    """
    生成 n 个 token（提示 p 个）的有用 FLOPs -> (带缓存, 每步重算)。
    last_only=False：lm_head 在每个算过的位置上都算（numpy 模型的口径）；True：每次前向只在最后一个位置算（真实引擎的口径）。

    【推导】M = matmul_params，h = vocab × d_model（lm_head 的权重个数），A = 4 × 层数 × 头数 × head_dim
    （每个 (query, key) 对：打分 2·hd + 加权和 2·hd，每头）。两种做法都是 n 次前向。
    带缓存：第一次前向 p 个位置，之后每步 1 个，共算 P = p + n − 1 个位置；因果的 (query, key) 对合起来正好是一次 P 长
    的前向：2(M − h)·P + 2h·R + A·tri(P)，R = lm_head 算的行数 = P（每个位置）或 n（每次前向一行）。
    重算：第 i 步（i = 0..n−1）从头算 p + i 个位置，共 np + n(n − 1)/2 个位置：
    2(M − h)(np + n(n − 1)/2) + 2h·R + A·(tet(P) − tet(p − 1))，R = np + n(n − 1)/2（每个位置）或 n。
    """
    M = mc.matmul_params()
    h = mc.vocab * mc.d_model
    A = 4 * mc.n_layers * mc.n_heads * mc.head_dim
    L = p + n - 1
    pos_re = n * p + n * (n - 1) // 2
    cached = 2 * (M - h) * L + 2 * h * (n if last_only else L) + A * tri(L)
    recompute = 2 * (M - h) * pos_re + 2 * h * (n if last_only else pos_re) + A * (tet(L) - tet(p - 1))
    return cached, recompute


def snapshot(counter):
    """账本此刻的总量：有用 / 执行 FLOPs、权重矩阵字节（MATMUL_OPS；不含词嵌入查表）、KV 字节。"""
    return {"useful": counter.total("useful"), "flops": counter.total("flops"),
            "w": counter.total("w", MATMUL_OPS), "kv": counter.total("kv")}


def demo3_cache_vs_recompute():
    print_header(f"演示 3：缓存 vs 重算——numpy 小模型，提示 {N_PROMPT} 个 token，贪心生成 n 个（B = 1）")
    mc = CFG.to_model_config()
    model = NumpyTransformer(init_params(CFG, SEED), CFG)
    prompt = random_tokens(CFG, 1, N_PROMPT, PROMPT_SEED)
    n_max = max(SNAPSHOTS)

    c_cache, snaps_cache, cache = Counter(), {}, model.new_cache(1)
    seq = prompt
    logits = model.forward(prompt, cache, counter=c_cache)[:, -1]
    for i in range(1, n_max + 1):                     # 第 i 个新 token 已由 logits 决定
        if i in SNAPSHOTS:
            snaps_cache[i] = snapshot(c_cache)
        nxt = logits.argmax(-1)[:, None]
        seq = np.concatenate([seq, nxt], axis=1)
        if i < n_max:
            logits = model.forward(nxt, cache, counter=c_cache)[:, -1]
    tokens_cache = seq[0, N_PROMPT:]

    c_re, snaps_re = Counter(), {}
    seq = prompt
    for i in range(1, n_max + 1):
        lg = model.forward(seq, counter=c_re)[:, -1]   # 不用缓存：整个前缀从头算
        seq = np.concatenate([seq, lg.argmax(-1)[:, None]], axis=1)
        if i in SNAPSHOTS:
            snaps_re[i] = snapshot(c_re)
    tokens_re = seq[0, N_PROMPT:]

    rows, res = [], {}
    for n in SNAPSHOTS:
        a, b = snaps_cache[n], snaps_re[n]
        cf_a, cf_b = closed_form_useful(mc, N_PROMPT, n, last_only=False)
        ok = a["useful"] == cf_a and b["useful"] == cf_b
        res[n] = {"cached": a, "recompute": b, "closed_cached": cf_a, "closed_recompute": cf_b, "closed_ok": ok}
        rows.append([n, f"{a['useful']:,}", f"{b['useful']:,}", f"{b['useful'] / a['useful']:.1f}×",
                     f"{cf_a:,}", f"{cf_b:,}", "✓" if ok else "✗", f"{b['flops'] / a['flops']:.1f}×",
                     f"{b['w'] / a['w']:.2f}×", f"{b['kv'] / a['kv']:.2f}×"])
    print("有用 FLOPs（账本 = 运行时按数组形状记的账；公式 = 闭式）：")
    print_table(["生成 n 个", "账本：带缓存", "重算", "公式：带缓存", "重算", "账 = 公式"],
                [[r[0], r[1], r[2], r[4], r[5], r[6]] for r in rows])
    print("\n重算 ÷ 带缓存（账本）：")
    print_table(["生成 n 个", "有用 FLOPs", "执行 FLOPs", "读权重矩阵", "读 KV"], [[r[0], r[3], r[7], r[8], r[9]] for r in rows])
    same_tokens = bool((tokens_cache == tokens_re).all())

    # Llama-3.1-70B：只用公式，按真实引擎的口径（每次前向只在最后一个位置算 lm_head）
    m, p = LLAMA31_70B, 2048
    rows2, big = [], {}
    for n in (128, 1024, 8192):
        cf_a, cf_b = closed_form_useful(m, p, n, last_only=True)
        ctx = p + n - 1                                  # 生成第 n 个 token 的那次前向看 ctx 个位置
        step = decode_step(m, H100, 1, ctx)              # 带缓存：喂 1 个位置，看 ctx 个（含它自己）
        re = prefill_step(m, H100, ctx)                  # 重算：一次 ctx 个位置的 prefill，lm_head 只算最后一个
        big[n] = {"cached": cf_a, "recompute": cf_b, "t_cached_step": step["time"], "t_recompute_step": re["time"],
                  "cached_step_flops": step["flops"], "recompute_step_flops": re["flops"],
                  "cached_bound": step["bound"], "recompute_bound": re["bound"], "kv": m.kv_bytes(ctx)}
        t_cached, t_re = step["time"], re["time"]
        rows2.append([n, fmt_num(cf_a), fmt_num(cf_b), f"{cf_b / cf_a:.0f}×", fmt_time(t_cached), fmt_time(t_re),
                      fmt_bytes(m.kv_bytes(ctx))])
    print(f"\n{m.name}（公式；每次前向只在最后一个位置算 lm_head），提示 {p} 个 token；")
    print("最后一步的时间是 H100 上的 roofline 下界：")
    print_table(["生成 n 个", "有用：带缓存", "重算", "重算 ÷ 缓存", "最后一步：带缓存", "重算", "缓存的 KV"], rows2)
    r96 = res[n_max]
    pos_cached, pos_re = N_PROMPT + n_max - 1, n_max * N_PROMPT + n_max * (n_max - 1) // 2
    attn_cached, attn_re = tri(pos_cached), tet(pos_cached) - tet(N_PROMPT - 1)   # 因果的 (query, key) 对数
    print_observations([
        f"账本和闭式公式逐格相等（{sum(v['closed_ok'] for v in res.values())}/{len(res)} 行 × 两种做法）；两种做法贪心生成的 "
        f"{n_max} 个 token " + ("完全相同" if same_tokens else "不同！") + "（01 脚本演示 2）。",
        f"生成 {n_max} 个 token，重算的有用 FLOPs 是带缓存的 {r96['recompute']['useful'] / r96['cached']['useful']:.1f} 倍："
        f"带缓存总共只算 {N_PROMPT} + {n_max} − 1 = {pos_cached} 个位置，重算每一步都把前缀从头再算一遍，共 "
        f"n·p + n(n − 1)/2 = {pos_re:,} 个位置（{pos_re / pos_cached:.1f} 倍）；FLOPs 之比小一些，"
        f"因为注意力那部分之比只有 {attn_re / attn_cached:.1f}（因果的 (query, key) 对：{attn_re:,} vs {attn_cached:,}）。",
        f"按账本的口径，两种做法读的权重矩阵和 KV 字节一样多（之比 {r96['recompute']['w'] / r96['cached']['w']:.2f}× 和 "
        f"{r96['recompute']['kv'] / r96['cached']['kv']:.2f}×）：每步一次前向、读一遍权重；重算的那次前向自己算出 K、V 再用。"
        "缓存省的是 FLOPs，花的是存 KV 的显存（演示 1）。",
        f"{m.name}、提示 {p}、生成 1024 个时，重算要多做 {big[1024]['recompute'] / big[1024]['cached']:.0f} 倍的运算；"
        f"最后一步带缓存的下界 {fmt_time(big[1024]['t_cached_step'])}（受{BOUND_CN[big[1024]['cached_bound']]}限制），"
        f"重算则相当于一次 {p + 1023} 个 token 的 prefill，{fmt_time(big[1024]['t_recompute_step'])}"
        f"（受{BOUND_CN[big[1024]['recompute_bound']]}限制）。换来这一点的代价是每个序列 {fmt_bytes(big[1024]['kv'])} 的 KV cache。",
    ])
    return {"by_n": res, "tokens_agree": same_tokens, "llama70b": big, "positions": (pos_cached, pos_re),
            "attn_pairs": (attn_cached, attn_re)}


if __name__ == "__main__":
    demo1_cache_size()
    demo2_mha_gqa_mqa()
    demo3_cache_vs_recompute()
