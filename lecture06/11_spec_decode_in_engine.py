"""
=============================================================================
CS349E · 第 6 讲 · 11_spec_decode_in_engine.py —— 投机解码进了引擎：一个批里各自接受、分页的块怎么回滚、负载大了何时该关
=============================================================================

【这个脚本要回答的问题】
演示 1：引擎里的投机解码还精确吗：几个请求在同一步里草稿、一次前向一起验证，T = 0 时每个输出等于贪心，
T = 1 时等于 decode_lab.speculative_generate 单独跑（同一个种子）——再在一个很小的模型上抽几千个请求，
前两个 token 的联合分布和目标模型算出来的精确分布做 χ² 检验（像 03 对一个序列做的那样）。
演示 2：负载下划算吗：SmolLM2-135M 上"照抄"和"改写"一句话的请求按泊松到达，普通 decode、prompt lookup 投机、
投机 + 按批大小关掉的开关，各自的 TTFT、TPOT、吞吐和 SLO 达标率随到达率怎么变；从哪个到达率起投机的吞吐不如普通的，
那时的批多大——旁边是 06/05 的算法（加速比 = 每轮 token 数 × 普通一步 ÷ 验证一步）在这个模型、这台 CPU 上给的批；
按那个批关掉投机的开关找回了什么。
演示 3：分页的回滚：被拒绝的草稿用过的整块还给块池；投机的请求在峰值时占多少块，和普通的比。

【怎么读输出】
- 演示 2、3 的时间是**模型时间**（runner_lab.modelled_step_time：一步的账按标定的 CPU 代价模型算；
  投机的一步 = 目标一次前向，γ + 1 行 logits；prompt lookup 的草稿不计时间）。和 06/05 一样是代价模型；新的是两样：
  每轮接受几个是这些请求**量出来的**（不是假设的 α），请求是排队到达的（批的大小由到达率和各自跑多久定下，
  不是给定的）。`--time` 用真的时钟在这台 CPU 上跑两种到达率（随机器和负载变）。
- TPOT = (最后一个 token − 第一个) / (token 数 − 1)；投机时一轮的几个 token 同一时刻到（同 vLLM 的流式输出）。
- "批"= 按时间加权的平均每步序列数。

【模型的假设（务必看）】
- 演示 1 的模型是随机的玩具（第 3 讲的 QCFG 和种子 04 的 INT4 草稿；χ² 用一个 16 个词的小模型），float64。
- 演示 2、3 的模型是真的（SmolLM2-135M-Instruct，float32），T = 0。prompt lookup 的草稿在这里划算，是因为请求
  是照抄 / 改写一句话（vLLM 的博客在摘要任务上用它）；自己写的文字里它几乎找不到匹配（第 6 讲 10 的演示 4），
  跳层的自草稿在这台 CPU 上一个草稿 token 就要目标的 26/30，批 1 时都不划算（10 的演示 6）。
- 演示 2、3 **重放**：先用引擎把 8 个提示的贪心回答生成
  一次；T = 0 下一轮接受几个只取决于请求自己的 token（prompt lookup 在请求的上下文里找匹配、和贪心的下文比），
  不取决于和谁一批、什么时候到——所以扫到达率时不再跑模型，只跑调度、块和模型时间（测试断言重放和真的投机引擎
  一步一步相同）。请求轮流用这 8 个提示，前缀缓存关着（只看投机）。
- CPU 的代价（runner_lab.CPU_COST）：tests/bench_engine.py --calibrate --write 在一台 2 核 AMD EPYC 上（一个 BLAS 线程）
  量真实的引擎步拟合的常数，存在 ../lecture05/cpu_calibration.json（机器、日期、残差都在那里；演示 2 的观察印出它们）。
- SLO、到达率、γ、请求数都是随意选的例子，不是基准。

【运行】python3 11_spec_decode_in_engine.py [--time]（空闲的 2 核机器、一个 BLAS 线程：5.2 秒，和种子 04（3.8 秒）背靠背
三对，比值中位数 1.37 倍（1.34–1.38）；大部分是装模型、生成 8 个贪心回答和演示 1 的 3000 个小请求；--time 另外真跑几分钟）

【依赖】numpy；../lecture05 的 engine_lab（LLMEngine、run_trace）、spec_engine_lab（accept_counts）、runner_lab
（一步的账、CPU 的代价模型）、metrics_lab（summarize）、workload_lab（poisson_arrivals）；本目录的 decode_lab
（speculative_generate、autoregressive_generate、adjust）、drafts_lab（种子 04 的模型、layer_subset）、stats_lab（χ²）；
../lecture02 的 real_model_lab（load_gguf）、hub_lab、transformer_lab；../lecture01 的 console。
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
for _sub in ("lecture01", "lecture02", "lecture05"):
    sys.path.insert(0, os.path.join(HERE, "..", _sub))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

from console import print_header, print_note, print_observations, print_table, save_results  # noqa: E402
from decode_lab import TransformerLM, adjust, autoregressive_generate, speculative_generate  # noqa: E402
from drafts_lab import build_seed04_models, layer_subset  # noqa: E402
from engine_lab import LLMEngine, run_trace  # noqa: E402
from hub_lab import gguf_path_or_exit  # noqa: E402
from metrics_lab import summarize  # noqa: E402
from real_model_lab import load_gguf  # noqa: E402
from runner_lab import CPU_COST, modelled_step_time, step_counts  # noqa: E402
from spec_engine_lab import accept_counts  # noqa: E402
from stats_lab import chi2_gof  # noqa: E402
from transformer_lab import LMConfig, init_params  # noqa: E402
from workload_lab import poisson_arrivals, uniform_ints  # noqa: E402

# ---- 选的例子（不是事实，也不是基准）----
N_REQ1, N_NEW1, GAMMA1 = 6, 24, 4        # 演示 1：玩具上的请求数、每个生成几个、γ
SMALL = LMConfig(name="tiny16", vocab=16, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=32,
                 max_seq=16)             # 演示 1 的 χ²：16 个词的小模型（联合分布 256 格）
N_CHI, PROMPT_CHI, GAMMA_CHI = 3000, [3, 1, 4], 2
TEXTS = ("The old lighthouse stood on the rocky shore, and every night its keeper lit the lamp for the ships.",
         "Paged attention stores keys and values in fixed-size blocks, so memory is allocated on demand.",
         "A bakery on the corner sells fresh bread every morning before the sun comes up.",
         "The river runs through the valley and past the mill, then turns south toward the sea.")
QUESTIONS = ([f"Repeat this sentence exactly: {s}" for s in TEXTS]
             + [f"Rewrite this sentence in the past tense: {s}" for s in TEXTS])
N_OUT, STOP, BLOCK = 48, 2, 16           # 每个回答最多 48 个 token，<|im_end|> 先到就停；16 个 token 一块
GAMMA, LOOKUP_N = 8, 2                   # prompt lookup：最多抄 8 个，用最后 2 个 token 去匹配
RATES = (0.5, 1.0, 2.0, 4.0, 6.0, 8.0, 12.0)
MAX_SEQS = 32   # 每秒到达的请求数
N_REQ, ARRIVAL_SEED = 32, 7
TTFT_SLO, TPOT_SLO, GOAL = 1.0, 0.08, 0.9      # 秒；达标率 ≥ 90% 的最高到达率 = goodput
RATE3 = 1.0                              # 演示 3 用的到达率
TIME_RATES, TIME_N = (0.25, 3.0), 12     # --time：两种到达率、每种几个请求

_CTX = {}


def load_model():
    if "m" not in _CTX:
        P, cfg, tok = load_gguf(dtype=np.float32)
        _CTX["m"] = (TransformerLM(P, cfg, name=cfg.name), cfg, tok)
    return _CTX["m"]


def lookup_cfg(n_off=None):
    return {"method": "ngram", "num_speculative_tokens": GAMMA, "prompt_lookup_max": LOOKUP_N,
            "disable_by_batch_size": n_off}


# ---------------------------------------------------------------------------
def demo1_exact():
    print_header(f"演示 1：引擎里的投机解码是精确的（玩具模型，float64，γ = {GAMMA1}，{N_REQ1} 个请求一起跑）")
    target, drafts = build_seed04_models()
    draft = drafts["INT4 量化的自己"]
    lens = uniform_ints(4, 20, N_REQ1, 3)
    rng = np.random.default_rng(4)
    prompts = [[int(x) for x in np.floor(rng.random(k) * target.cfg.vocab)] for k in lens]
    sc = {"method": "draft", "draft_model": draft, "num_speculative_tokens": GAMMA1}
    res, rows = {}, []
    for T in (0.0, 1.0):
        eng = LLMEngine(target, target.cfg, 64, block_size=16, speculative_config=sc)
        res[T] = (eng, eng.generate(prompts, N_NEW1, temperature=T, seed=10))
    same0 = same1 = greedy = 0
    for i, p in enumerate(prompts):
        g = [int(t) for t in autoregressive_generate(target, p, N_NEW1, 0.0, np.random.default_rng(0))]
        s0 = [int(t) for t in speculative_generate(target, draft, p, N_NEW1, GAMMA1, 0.0,
                                                   np.random.default_rng(10 + i))[0]]
        s1 = [int(t) for t in speculative_generate(target, draft, p, N_NEW1, GAMMA1, 1.0,
                                                   np.random.default_rng(10 + i))[0]]
        o0, o1 = res[0.0][1][i], res[1.0][1][i]
        r0, r1 = res[0.0][0].requests[i], res[1.0][0].requests[i]
        greedy, same0, same1 = greedy + (o0 == g), same0 + (o0 == s0), same1 + (o1 == s1)
        rows.append([f"r{i}", len(p), "是" if o0 == g else "否", r0.target_calls, "是" if o1 == s1 else "否",
                     r1.target_calls, f"{len(o1) / r1.target_calls:.2f}"])
    print_table(["请求", "提示", "T=0 = 贪心", "T=0 轮", "T=1 = spec_generate", "T=1 轮", "T=1 token/轮"], rows)
    eng1 = res[1.0][0]
    together = max(sum(1 for c in s["chunks"] if c[2]) for s in eng1.steps)
    chi = _chi2_small()
    print_table(["检验（小模型，T = 1）", "抽样次数", "格子", "χ²", "自由度", "p 值"],
                [[name, N_CHI, cells, f"{st:.1f}", dof, f"{p:.2f}"] for name, cells, st, dof, p in chi["tests"]])
    p_min = min(t[4] for t in chi["tests"])
    print_observations([
        f"T = 0：{greedy} / {N_REQ1} 个输出和目标模型自己的贪心逐 token 相同；T = 1：{same1} / {N_REQ1} 个和 "
        f"speculative_generate（同一个种子 seed + i，单独跑、连续的 KV cache）逐 token 相同，每轮接受几个也相同。"
        f"引擎里它们不是单独跑的：同一步里最多 {together} 个请求一起草稿、一次前向一起验证，各自接受不同的个数。",
        "为什么能逐 token 相同：每个请求带着自己的随机数发生器，按 speculative_generate 的顺序用（γ 个草稿各一个，"
        "验证时每检查一个一个，最后一个抽修正或额外的 token），接受 / 拒绝用的是同一个 verify_chain；"
        "和谁一批只改变矩阵乘的形状，float64 下 logits 只差舍入（测试断言 < 1e-12 相对）。",
        f"小模型上 {N_CHI} 个请求（每个 2 个 token，γ = {GAMMA_CHI}）的第 1 个 token 和前两个的联合分布，和目标模型"
        f"精确算出的分布比：最小的 p 值 {p_min:.2f}，"
        + ("在 1% 的水平上看不出差别。" if p_min > 0.01 else "小于 0.01：抽样和精确分布不一致。")
        + "跳过残差（拒绝后从 p 重抽）的引擎在测试里就不等于 speculative_generate（tests/test_spec_engine.py）。",
    ])
    return {"greedy": greedy, "same0": same0, "same1": same1, "n": N_REQ1, "together": together, "chi": chi}


def _chi2_small():
    """小模型上 N_CHI 个请求，各 2 个 token：第 1 个 token 和 (第 1, 第 2) 的计数 vs 精确分布的 χ²。"""
    P = init_params(SMALL, 5)
    target = TransformerLM(P, SMALL)
    draft = layer_subset(target, [0], name="第 1 层")
    sc = {"method": "draft", "draft_model": draft, "num_speculative_tokens": GAMMA_CHI}
    eng = LLMEngine(target, SMALL, 8 * 64, block_size=4, max_num_batched_tokens=1024, max_num_seqs=256,
                    speculative_config=sc)
    outs = eng.generate([PROMPT_CHI] * N_CHI, 2, temperature=1.0, seed=0)
    V = SMALL.vocab
    p1 = adjust(target.full_logits([PROMPT_CHI])[0, -1], 1.0)
    nxt = target.full_logits([PROMPT_CHI + [x] for x in range(V)])[:, -1]        # [V, V]
    joint = p1[:, None] * adjust(nxt, 1.0)
    c1 = np.bincount([o[0] for o in outs], minlength=V)
    c12 = np.bincount([o[0] * V + o[1] for o in outs], minlength=V * V)
    tests = [("第 1 个 token", V) + chi2_gof(c1, p1), ("前两个（联合）", V * V) + chi2_gof(c12, joint.ravel())]
    return {"tests": tests, "counts": c12, "joint": joint}


# ---------------------------------------------------------------------------
def chat_prompts():
    _, _, tok = load_model()
    return [tok.chat(q) for q in QUESTIONS]


def streams():
    """8 个提示的贪心回答（SmolLM2，float32，引擎一起跑一次）-> (提示, 回答)。"""
    if "s" not in _CTX:
        model, cfg, _ = load_model()
        prompts = chat_prompts()
        eng = LLMEngine(model, cfg, -(-cfg.max_seq // BLOCK), block_size=BLOCK)
        _CTX["s"] = (prompts, eng.generate(prompts, N_OUT, stop=STOP))
    return _CTX["s"]


def serve(rate, sc, n_req=N_REQ, clock="model"):
    """一种到达率下跑完 n_req 个请求（重放，或 clock="wall" 时真跑）-> (引擎, 请求)。"""
    prompts, outs = streams() if clock == "model" else (chat_prompts(), None)
    model, cfg, _ = load_model()
    arr = poisson_arrivals(rate, n_req, ARRIVAL_SEED)
    trace = [(float(a), prompts[i % len(prompts)], N_OUT, {"stop": STOP}) for i, a in enumerate(arr)]
    kw = dict(block_size=BLOCK, enable_prefix_caching=False, speculative_config=sc, max_num_seqs=MAX_SEQS)
    if clock == "wall":
        eng = LLMEngine(model, cfg, -(-cfg.max_seq // BLOCK), clock="wall", **kw)
    else:
        eng = LLMEngine.replay({i: outs[i % len(prompts)] for i in range(n_req)}, cfg, -(-cfg.max_seq // BLOCK), **kw)
    ids = run_trace(eng, trace)
    return eng, [eng.requests[i] for i in ids]


def mean_batch(eng):
    dt = np.array([s["dt"] if eng.clock == "model" else s["wall"] for s in eng.steps])
    return float(np.sum(dt * np.array([s["seqs"] for s in eng.steps])) / np.sum(dt))


def analytic_break_even(cfg, tokens_per_call, k, ctx):
    """06/05 的算法，这个模型和 CPU：加速比(B) = 每轮 token 数 × 普通一步(B) ÷ 验证一步(B)（k 个草稿位置 + 1）；
    草稿不要钱（prompt lookup）。-> (第一个 < 1 的批 B, {B: 加速比})。"""
    sp = {}
    k0, phi = int(np.floor(k)), k - np.floor(k)
    for B in range(1, 257):
        plain = modelled_step_time(step_counts(cfg, [(1, ctx, 1)] * B))
        lo, hi = (step_counts(cfg, [(j + 1, ctx, j + 1)] * B) for j in (k0, k0 + 1))
        verify = modelled_step_time({key: (1 - phi) * lo[key] + phi * hi[key] for key in lo})
        sp[B] = tokens_per_call * plain / verify
        if sp[B] < 1.0:
            return B, sp
    return None, sp


def _latency_sentence(res, plain, spec):
    """TPOT 和 TTFT 的 p50 在哪些到达率下投机更小 -> 一句话（按表里的数说）。"""
    tpot = all(res[r, spec]["tpot"] < res[r, plain]["tpot"] for r in RATES)
    ttft = [r for r in RATES if res[r, spec]["ttft"] > res[r, plain]["ttft"]]
    return (f"这 {N_REQ} 个请求的 TPOT p50 在表里" + ("每个到达率下都是投机的小" if tpot else "不是每个到达率下都是投机的小")
            + ("" if not ttft else f"；TTFT p50 从 {ttft[0]:g}/s 起投机的大：验证多占的算力先让排队的请求等得更久")
            + "。")


def demo2_load():
    print_header(f"演示 2：负载下的投机解码（SmolLM2，T = 0，prompt lookup γ ≤ {GAMMA}，{N_REQ} 个请求，模型时间）")
    _, cfg, _ = load_model()
    prompts, outs = streams()
    low_eng, low = serve(RATES[0], lookup_cfg())
    calls = sum(r.target_calls for r in low)
    tpc = sum(len(r.output) for r in low) / calls
    kbar = sum(sum(r.drafted) for r in low) / sum(len(r.drafted) for r in low)
    ctx = int(round(np.mean([len(p) for p in prompts]) + np.mean([len(o) for o in outs]) / 2))
    b_star, sp = analytic_break_even(cfg, tpc, kbar, ctx)
    ridge = CPU_COST["flops_per_s"] / CPU_COST["bytes_per_s"]
    configs = (("普通", None), ("投机", lookup_cfg()), ("加开关", lookup_cfg(b_star)))
    res = {}
    for rate in RATES:
        for name, sc in configs:
            eng, reqs = serve(rate, sc)
            m = summarize(reqs, TTFT_SLO, TPOT_SLO)
            res[rate, name] = {"ttft": m["ttft"][50], "tpot": m["tpot"][50], "att": m["attainment"],
                               "tput": m["throughput"], "batch": mean_batch(eng),
                               "max_batch": max(st["seqs"] for st in eng.steps)}
    names = [c[0] for c in configs]
    print_note("TPOT、TTFT 是 p50（ms）；吞吐 = 输出 token ÷ 第一个到达到最后一个 token（token/s）；"
               f"达标 = TTFT ≤ {TTFT_SLO:g} s 且 TPOT ≤ {TPOT_SLO * 1e3:.0f} ms 的请求占比；批 = 平均每步的序列数。")
    print_table(["到达率/s"] + [f"{n} {k}" if j == 0 else k for n in names for j, k in enumerate(("TPOT", "TTFT"))],
                [[f"{r:g}"] + [f"{res[r, n][k] * 1e3:,.0f}" for n in names for k in ("tpot", "ttft")] for r in RATES])
    print_table(["到达率/s"] + [f"{n} {k}" if j == 0 else k for n in names for j, k in enumerate(("吞吐", "达标", "批"))],
                [[f"{r:g}"] + [x for n in names for x in (f"{res[r, n]['tput']:.1f}", f"{res[r, n]['att']:.0%}",
                                                          f"{res[r, n]['batch']:.1f}")] for r in RATES])
    plain, spec, sw = names
    worse = [r for r in RATES if res[r, spec]["tput"] < res[r, plain]["tput"]]
    be_rate = worse[0] if worse else None
    goodput = {n: max([r for r in RATES if res[r, n]["att"] >= GOAL], default=0.0) for n in names}
    top = RATES[-1]
    out = {"tpc": tpc, "kbar": kbar, "ctx": ctx, "b_star": b_star, "sp": sp, "res": res, "be_rate": be_rate,
           "be_batch": res[be_rate, plain]["batch"] if be_rate else None, "goodput": goodput, "configs": names,
           "switch_idle": b_star is None or max(res[r, sw]["max_batch"] for r in RATES) < b_star}
    lo = res[RATES[0], spec]["tpot"] / res[RATES[0], plain]["tpot"]
    obs = [
        f"量出来的：到达率 {RATES[0]:g}/s 时每轮平均草稿 {kbar:.2f} 个、每次目标前向 {tpc:.2f} 个 token（照抄的那段"
        f"一轮接受好几个，改写的地方和结尾 prompt lookup 找不到匹配、一轮 1 个）；TPOT 的 p50 是普通的 {lo:.2f} 倍。",
        f"06/05 的算法放到这个模型和这台 CPU 上（每轮 {tpc:.2f} 个 token、验证平均 {kbar + 1:.2f} 个位置、上下文 "
        f"{ctx}、草稿不要钱）：批 B 时加速比 = {tpc:.2f} × 普通一步 ÷ 验证一步，B = 1 时 {sp[1]:.2f}，"
        + (f"B = {b_star} 时第一次 < 1。" if b_star else "到 256 都 ≥ 1。")
        + f"这台 CPU 的算力 / 带宽只有 {ridge:.1f} FLOP/字节（标定的 {CPU_COST['flops_per_s'] / 1e9:.0f} GFLOP/s ÷ "
        f"{CPU_COST['bytes_per_s'] / 1e9:.1f} GB/s；float32 的 decode 强度约 B / 2，B ≈ {2 * ridge:.0f} 就越过拐点）："
        "之后验证多出来的位置按 FLOPs 付钱，不再是顺带的"
        + (f"；算和读只重叠 {CPU_COST['overlap']:.0%}，拐点以下它们也要付 {1 - CPU_COST['overlap']:.0%}。"
           if CPU_COST["overlap"] < 1 else "。"),
    ]
    if be_rate is not None:
        obs.append(f"量出来的：到达率 {be_rate:g}/s 起投机的吞吐比普通的低（{res[be_rate, spec]['tput']:.1f} 对 "
                   f"{res[be_rate, plain]['tput']:.1f} token/s），普通 decode 那时的平均批 {out['be_batch']:.1f}，"
                   f"算法说 {b_star}。新在两处：每轮的 token 数是这批请求量出来的，不是一个 α；批是排队排出来的——"
                   f"同样的到达率下投机的批更小（{res[be_rate, spec]['batch']:.1f}），因为它的请求走得早。"
                   + _latency_sentence(res, plain, spec))
    else:
        obs.append(f"到 {top:g}/s 投机的吞吐都不比普通的低：表里的到达率还没到不划算的地方。")
    obs.append(f"开关（这一步的批 ≥ {b_star} 时不投机，vLLM 的 disable_by_batch_size）：{top:g}/s 时吞吐 "
               f"{res[top, sw]['tput']:.1f} token/s，投机一直开着 {res[top, spec]['tput']:.1f}、普通 "
               f"{res[top, plain]['tput']:.1f}；{RATES[0]:g}/s 时它的 TPOT p50 {res[RATES[0], sw]['tpot'] * 1e3:,.0f} ms，"
               f"投机 {res[RATES[0], spec]['tpot'] * 1e3:,.0f} ms。"
               + (f"这些到达率下一步最多 {max(res[r, sw]['max_batch'] for r in RATES)} 个序列，从没到 {b_star}："
                  "开关一次也没关掉投机，它和一直投机的一样（标定的时钟下不划算的批比这里排出来的批大）。"
                  if b_star is None or max(res[r, sw]["max_batch"] for r in RATES) < b_star else "")
               + f"goodput（达标率 ≥ {GOAL:.0%} 的最高到达率，表里的格点）："
               f"普通 {goodput[plain]:g}/s、投机 {goodput[spec]:g}/s、加开关 {goodput[sw]:g}/s。")
    print_observations(obs)
    return out


# ---------------------------------------------------------------------------
def demo3_blocks():
    print_header(f"演示 3：分页的回滚（到达率 {RATE3:g}/s，{BLOCK} 个 token 一块）")
    plain, rp = serve(RATE3, None)
    spec, rs = serve(RATE3, lookup_cfg())
    rows = []
    for name, eng in (("普通", plain), ("投机", spec)):
        st = eng.steps
        dt = np.array([s["dt"] for s in st])
        used = np.array([s["blocks_used"] for s in st])
        rows.append([name, len(st), int(used.max()), f"{np.sum(dt * used) / np.sum(dt):.1f}",
                     sum(s.get("verified", 0) for s in st), sum(s.get("wasted", 0) for s in st),
                     sum(s.get("freed", 0) for s in st)])
    print_table(["", "步数", "峰值块", "平均块", "验证的位置", "作废的位置", "还回的块"], rows)
    hist = sum(accept_counts(r, GAMMA) for r in rs)
    drafted = np.bincount([k for r in rs for k in r.drafted], minlength=GAMMA + 1)
    print_table(["每轮的个数"] + [str(k) for k in range(GAMMA + 1)],
                [["草稿了几个（轮）"] + [int(x) for x in drafted], ["接受了几个（轮）"] + [int(x) for x in hist]])
    out = {"rows": rows, "hist": hist, "drafted": drafted,
           "peak": (rows[0][2], rows[1][2]), "freed": rows[1][6], "wasted": rows[1][5], "verified": rows[1][4]}
    print_observations([
        f"投机的一步给每个请求多留它这一轮的草稿个数（≤ γ = {GAMMA}）那么多个槽；验证完，被拒绝的 {out['wasted']} 个位置"
        f"（共验证 {out['verified']} 个）的 KV 作废：n_computed 只前进到被接受的长度，下一轮覆盖它们；"
        f"作废的槽占满了的整块还给块池：一共 {out['freed']} 块（一块 {BLOCK} 个 token，其余作废的槽在还要用的块里）。",
        f"峰值占的块：普通 {out['peak'][0]}、投机 {out['peak'][1]}。γ = {GAMMA} < {BLOCK}：一个请求为草稿多占的"
        "不到一块，而投机的请求走得早，同时在跑的少（演示 2 的“批”）；前缀缓存只登记确认过的满块，作废的 KV "
        "不会被别的请求命中。",
        f"{int(drafted[0])} 轮 prompt lookup 没找到匹配，这一轮就是普通的一步（草稿 0 个、不多占槽）；"
        f"草稿了 {GAMMA} 个的 {int(drafted[GAMMA])} 轮里 {int(hist[GAMMA])} 轮全部接受。",
    ])
    return out


# ---------------------------------------------------------------------------
def demo4_timing():
    """--time：真跑（墙上时间）-> 表的行。"""
    print_header(f"--time：这台 CPU 上真跑（{TIME_N} 个请求，墙上时间，随机器和负载变）")
    rows = []
    for rate in TIME_RATES:
        for name, sc in (("普通", None), ("投机", lookup_cfg())):
            eng, reqs = serve(rate, sc, TIME_N, clock="wall")
            m = summarize(reqs)
            rows.append([f"{rate:g}", name, f"{m['tpot'][50] * 1e3:,.0f}", f"{m['ttft'][50] * 1e3:,.0f}",
                         f"{mean_batch(eng):.1f}"])
    print_table(["到达率/s", "", "TPOT p50 ms", "TTFT p50 ms", "批"], rows)
    print_note("真的时钟：一步的时间是这台机器此刻跑出来的，数字随机器和负载变，不和上面的模型时间逐格比。")
    return rows


def main(argv):
    d1 = demo1_exact()
    demo2_load()
    demo3_blocks()
    save_results({"d1": d1})        # 给测试（console.save_results）：只在设了 CS349E_RESULTS 时存下演示 1 返回的数
    if "--time" in argv:
        demo4_timing()


if __name__ == "__main__":
    gguf_path_or_exit()
    main(sys.argv[1:])
