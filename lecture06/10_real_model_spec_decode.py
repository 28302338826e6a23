"""
=============================================================================
CS349E · 第 6 讲 · 10_real_model_spec_decode.py —— 真实模型上的投机解码：α 不是设计出来的
=============================================================================

【这个脚本要回答的问题】
04–09 的 α 都来自第 3 讲的随机模型（或设计好的隐状态模型）。这里的目标是真正训练过的 SmolLM2-135M-Instruct
（第 2 讲 real_model_lab），草稿也是从它造出来的（或根本不用模型）：
演示 1：各个草稿的 α（T = 0 和 T = 1），和 Leviathan 表 3 的真实模型对、04 的玩具放在一起：温度往哪边推 α，
为什么"只用前 k 层"不行而"跳过中间几层"行。
演示 2：每次目标调用的 token 对照式 (1)：T = 0 按贪心文本精确地数（每个草稿、每个 γ），T = 1 用跳层草稿真跑一格（带标准误）。
演示 3：04 的那句话量一量——「真实文本里难的位置往往成片出现，公式会高估」：β 的相邻相关、每轮起点的 α 和总的 α、
式 (1) 的误差，每个草稿都是 T = 0 的精确值。
演示 4：prompt lookup 在模型照抄的时候：照抄的提示 vs 散文、代码；γ = 4、8 和自适应 γ。
演示 5：T = 0 的 top-k 树（Medusa / EAGLE 那样每层取草稿的前 k 名）对照同样位置数的链。
演示 6：代价：每个草稿每个 token 读多少字节、做多少运算（按一个写明的部署假设），代价系数 c 和定理 3.8 预测的加速比。
演示 7（只在 --time 时）：在这台 CPU 上真的计时：普通 decode vs 跳层草稿 vs prompt lookup，各重复 5 次（TIME_REPEATS）
取中位数和范围，和预测比；调用次数相同的两种做法（散文上的 prompt lookup）给出计时的误差有多大。

【怎么读输出】α = 草稿 token 被接受的概率的平均（推论 3.6）。"T = 0 精确"：T = 0 时投机解码的输出就是目标的贪心
序列，每一轮接受几个只取决于"草稿在贪心文本的每个位置猜对了没有"（teacher forcing 一次前向，greedy_lab）：
没有抽样误差。"每次调用 token" = 每次目标前向平均产出的 token 数（只用 γ + 1 个位置都在文本里的完整的轮）。

【模型的假设（务必看）】
- 目标和所有草稿都按 float32 运行（比 float64 快约一倍、内存减半）。精确的轮次计算只需要 argmax：脚本打印目标自己在
  贪心文本上 teacher forcing 的 argmax 和文本不同的位置个数（应为 0）；"T = 0 的输出 == 贪心"和"精确的轮次 == 真实循环"
  在 float64 下由测试核对（float32 里 γ + 1 行的前向和 1 行的前向在几乎并列的位置上可能取到不同的 argmax）。
  精确的数只取决于文本的 token 在 logits 里排第几：测试核对这几段文本上每个要紧的位置，别的 token 的 logit 离它都远过
  float32 误差的 20 倍（float64 重算），α T = 1 的 3 位小数也留了余量：换一个 CPU / BLAS / numpy 版本，这些数不变。
  演示 2 里 T = 1 真跑的一格是 float32 的抽样：只有某个均匀数正好落在 float32 误差以内时才会变。
- 文本：三个提示（PROMPTS：散文、代码、照抄一段话），聊天格式（bpe_lab.chat，没有系统轮），各最多 N_NEW 个新 token
  的贪心续写（停在 <|im_end|>）。续写用 prompt lookup 的投机解码生成（T = 0 的输出就是贪心序列，照抄时少很多次前向）。
  只有三段、几十个位置（为了运行时间）：换一批文本，各个 α 和式 (1) 的误差都会变（文本的选择本身）。
- 重新量化的草稿：每层 7 个矩阵按 INT8（每通道）/ INT4-g32 就近舍入；共享的 lm_head（= 词嵌入）不重新量化，
  草稿和目标共用它。
- n 元语法草稿：3 元、Witten–Bell 回退（ngram_lab），**留一法**：评估一段文本时只用另外两段的贪心文本拟合
  （每段只有几十个 token，远少于"几千个 token"，所以它的 α 是偏低的一端）。
- 代价（演示 6）：部署假设 = batch 1 的 decode 受带宽限制，一个 token 的时间 ∝ 读的权重字节数；目标按 BF16 部署，
  每个草稿按它自己的格式（INT8 / INT4-g32 含 scale，跳层 / 提前退出是 BF16 的一部分层）；n 元语法和 prompt lookup 的 c = 0
  （查表，不读模型权重）。KV cache、词嵌入的一行、RMSNorm 的权重都不算。这些都是**假设**。

【运行】python3 10_real_model_spec_decode.py （空闲的 2 核机器、一个 BLAS 线程：25 秒，前后背靠背的种子 04
15.8 / 16.7 秒，约 1.5–1.6 倍（另一台快些的 2 核机器上是 18 秒对 4.9 秒：大矩阵和小 numpy 调用各占多少，随机器而变）；
内存峰值约 2 GB；第一次运行先下载模型）
python3 10_real_model_spec_decode.py --time [n] （再加演示 7：计时，每种做法生成 n 个 token，默认 32）

【依赖】numpy；本目录的 decode_lab（模型、生成器、α）、greedy_lab（T = 0 的精确轮次、top-k 树）、ngram_lab（稀疏的
n 元语法草稿）、drafts_lab（真实模型的自草稿、种子 04 的玩具、每 token 的字节数）、lookup_lab（PromptLookup、
自适应 γ）、correlated_lab（β 的相邻相关）、spec_math_lab（式 (1)、定理 3.8）；../lecture02 的 real_model_lab
（装 SmolLM2；第一次运行时下载约 93 MB，见 hub_lab）、transformer_lab、bpe_lab；../lecture03 的 quant_lab
（需要 ../prereq3）；../lecture01 的 console。
【来源】Leviathan et al. 2023（arXiv 2211.17192）表 3（T = 0 / T = 1 的 α）、式 (1)、定理 3.8；
Zhang et al. 2023，Draft & Verify（arXiv 2309.08168，跳过中间层的自草稿，不训练）；Elhoushi et al. 2024，LayerSkip
（arXiv 2404.16710，训练之后才能提前退出）；Saxena 2023，prompt lookup decoding（GitHub apoorvumang/prompt-lookup-decoding）；
Medusa（Cai et al. 2024，arXiv 2401.10774）与 EAGLE（Li et al. 2024，arXiv 2401.15077）的 top-k 候选树。
"""
import os
import sys
import time

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
for sub in ("lecture01", "lecture02", "lecture03", "prereq3"):
    sys.path.insert(0, os.path.join(HERE, "..", sub))

from console import print_header, print_note, print_observations, print_table  # noqa: E402
from console import save_results  # noqa: E402
from correlated_lab import lag1_correlation  # noqa: E402
from decode_lab import (TransformerLM, acceptance_beta, adjust, alphas_on_text, autoregressive_generate,  # noqa: E402
                        speculative_generate)
from drafts_lab import (build_seed04_models, early_exit_draft, layer_skip_draft, matrix_bytes,  # noqa: E402
                        requantized_draft)
from greedy_lab import greedy_rounds, lookup_rounds, round_summary, token_ranks, tree_rounds, tree_size  # noqa: E402
from lookup_lab import PromptLookup, speculative_generate_adaptive  # noqa: E402
from ngram_lab import SparseNGramLM  # noqa: E402
from quant_lab import QCFG, sample_tokens  # noqa: E402
from hub_lab import gguf_path_or_exit  # noqa: E402
from real_model_lab import load_gguf  # noqa: E402
from spec_math_lab import LEVIATHAN_TABLE3, best_gamma, expected_tokens  # noqa: E402

# ---- 实验设置（都是选出来的，不是事实）----
PASSAGE = "The old lighthouse stood on the rocky shore, and every night its keeper lit the lamp for the ships."
PROMPTS = (("散文", "Write a short paragraph about the ocean."),
           ("代码", "Write a Python function that returns the factorial of a number."),
           ("照抄", "Repeat the following text exactly, word for word:\n\n" + PASSAGE))
N_NEW = (26, 26, 40)            # 每个提示的贪心续写最多几个新 token（照抄的那段在 <|im_end|> 处先停）
STOP = 2                        # <|im_end|>
SKIP = (12, 4)                  # 跳层草稿：跳过第 12–15 层（30 层里的 4 层），留 26 层
EXIT_K = 26                     # 提前退出：只用前 26 层（和跳层草稿一样多的层）
NGRAM_ORDER = 3
LOOKUP_N = 2                    # prompt lookup 用最后 2 个 token 去匹配
GAMMAS = (1, 2, 4, 8)
GAMMA_CORR = 4                  # 演示 3 用的 γ
TIME_REPEATS = 5                # 演示 7（--time）：每种做法计时几次，报中位数和范围
N_SHUFFLE, SHUFFLE_SEED = 100, 300   # 演示 3：打乱顺序的次数、种子
ADAPT = (2, 16)                 # 自适应 γ：从 2 开始，最多 16（lookup_lab 的规则）
TREES = ((1, 1, 1, 1), (2, 1), (4,), (1,) * 8, (2, 1, 1, 1), (4, 1), (8,))   # 每层的宽度
T1 = {"prompt": 0, "n_new": 16, "gamma": 2, "seed": 1000}          # T = 1 真跑的一格（跳层草稿，散文）
TOY_TEXT = {"n_seq": 8, "length": 64, "seed": 0}                  # 玩具（种子 04）的 α：同 04 的演示 3 的文本
LEVIATHAN_T3 = tuple(LEVIATHAN_TABLE3)   # Leviathan et al. 2023 表 3 的整张表（spec_math_lab，06 也用它）

_CTX = {}


# -----------------------------------------------------------------------------
def _per_text(model, texts):
    """模型在每段文本（提示 + 新 token）上 teacher forcing -> 每段预测新 token 的那几行 logits 的 list。"""
    out = []
    for prompt, new in texts:
        seq = np.asarray([list(prompt) + list(new)])
        out.append(model.full_logits(seq)[0, len(prompt) - 1:len(prompt) - 1 + len(new)])
    return out


def _measure(name, draft_logits, ctx):
    """一个草稿在三段贪心文本上的 -> {ranks（每段）, beta1（每段，T = 1 的 Σmin）}。"""
    ranks, beta1 = [], []
    for lq, lp, (_, new) in zip(draft_logits, ctx["target_logits"], ctx["texts"]):
        ranks.append(token_ranks(lq, new))
        beta1.append(acceptance_beta(adjust(lp, 1.0), adjust(lq, 1.0)))
    ctx["drafts"][name] = {"ranks": ranks, "beta1": beta1}


def context():
    """装模型、生成贪心文本、逐个造草稿并量好 -> dict（整个脚本只做一次）。"""
    if _CTX:
        return _CTX
    P, cfg, tok = load_gguf(dtype=np.float32)
    target = TransformerLM(P, cfg, "目标")
    prompts = [tok.chat(text) for _, text in PROMPTS]
    news, gen_calls = [], []
    for pr, n_new in zip(prompts, N_NEW):   # 贪心续写：用 prompt lookup 的投机解码生成（T = 0 时输出就是贪心序列，照抄时少很多次前向）
        out, st = speculative_generate_adaptive(target, PromptLookup(LOOKUP_N), pr, n_new, ADAPT[0], 0.0,
                                                np.random.default_rng(0), gamma_max=ADAPT[1], stop=STOP)
        news.append([int(x) for x in out])
        gen_calls.append(st["target_calls"])
    ctx = _CTX
    ctx.update(P=P, cfg=cfg, tok=tok, target=target, prompts=prompts, texts=list(zip(prompts, news)), drafts={},
               gen_calls=gen_calls)
    ctx["target_logits"] = _per_text(target, ctx["texts"])
    ctx["target_mismatch"] = int(sum((token_ranks(lp, new) != 0).sum()
                                     for lp, (_, new) in zip(ctx["target_logits"], ctx["texts"])))
    ctx["costs"] = {"target_bf16": matrix_bytes(P, bits=16.0), "target_file": matrix_bytes(P, bits=5.0, head_bits=8.5)}
    flops_t = matrix_bytes(P, bits=8.0)          # 1 字节 / 参数 = 参数个数（每 token 的运算 ∝ 矩阵参数个数）
    # 量化的草稿：一次造一个，量完就丢（每个都是一份完整的权重）
    ctx["quant_logits"] = {}                     # 量化草稿的 logits（给测试：和 float64 重算的比，见 tests/test_lecture06_10.py）
    for scheme, label in (("int8", "INT8 的自己"), ("int4-g32", "INT4-g32 的自己")):
        draft, report = requantized_draft(P, cfg, scheme)
        ctx["quant_logits"][label] = _per_text(draft, ctx["texts"])
        _measure(label, ctx["quant_logits"][label], ctx)
        ctx["costs"][label] = (matrix_bytes(P, report=report), 1.0, report["bits_per_param"])
        del draft
    skip = layer_skip_draft(target, *SKIP)
    early = early_exit_draft(target, EXIT_K)
    ctx["layer_logits"] = {}                     # 层草稿的 logits（给测试：同上）
    for label, d in ((f"跳过 {SKIP[1]} 层", skip), (f"只用前 {EXIT_K} 层", early)):
        ctx["layer_logits"][label] = _per_text(d, ctx["texts"])
        _measure(label, ctx["layer_logits"][label], ctx)
        ctx["costs"][label] = (matrix_bytes(d.params), matrix_bytes(d.params, bits=8.0) / flops_t, 16.0)
    # n 元语法：留一法（评估第 i 段时用另外两段拟合）
    ng_logits = []
    for i, (pr, new) in enumerate(ctx["texts"]):
        fit = [n for j, (_, n) in enumerate(ctx["texts"]) if j != i]
        ng = SparseNGramLM.fit(fit, cfg.vocab, order=NGRAM_ORDER)
        ng_logits.append(_per_text(ng, [(pr, new)])[0])
    ng_label = f"{NGRAM_ORDER} 元语法（留一法）"
    _measure(ng_label, ng_logits, ctx)
    ctx["costs"][ng_label] = (0.0, 0.0, None)
    ctx["skip"], ctx["skip_label"], ctx["ngram_label"] = skip, f"跳过 {SKIP[1]} 层", ng_label
    return ctx


def _agree(ctx, name):
    return [r == 0 for r in ctx["drafts"][name]["ranks"]]


def _alpha0(ctx, name):
    return float(np.concatenate(_agree(ctx, name)).mean())


def _alpha1(ctx, name):
    return float(np.concatenate(ctx["drafts"][name]["beta1"]).mean())


def _entropy(logits):  # [..., V] -> float
    """温度 1 的平均熵（nats）。"""
    p = adjust(logits, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(-np.where(p > 0, p * np.log(p), 0.0).sum(-1).mean())


def _shuffled_per_call(agree, gamma, n_shuffle, seed):
    """
    每段文本各自把 agree 的顺序随机打乱（α 和长度不变，位置之间的顺序没了）再精确地数 -> 打乱 n_shuffle 次的平均每轮 token。

    打乱用 np.argsort(rng.random(n))（只用均匀数）。和不打乱的比：差别只来自"猜错的位置排在哪里"。
    """
    rng = np.random.default_rng(seed)
    vals = []
    for _ in range(n_shuffle):
        vals.append(round_summary([greedy_rounds(a[np.argsort(rng.random(a.size))], gamma) for a in agree])["per_call"])
    return float(np.mean(vals))


def _lookup_betas(ctx):
    """
    prompt lookup 在每个位置的 β -> (T = 0 的 list, T = 1 的 list)，每段文本一个数组。

    【推导】草稿是确定的（q 是提议的第一个 token x 上的 one-hot）：β = Σ min(p, q) = p(x)。T = 0 时 p 是 one-hot，
    β = [x == 文本的 token]；T = 1 时 β = 目标在这个位置给 x 的概率。没有提议的位置 β = 0（这一轮不草稿）。
    """
    lk = PromptLookup(LOOKUP_N)
    b0, b1 = [], []
    for (prompt, new), lp in zip(ctx["texts"], ctx["target_logits"]):
        seq = list(prompt) + list(new)
        p1 = adjust(lp, 1.0)
        x0, x1 = np.zeros(len(new)), np.zeros(len(new))
        for t in range(len(new)):
            prop = lk.propose(seq[:len(prompt) + t], 1)
            if prop:
                x0[t], x1[t] = float(prop[0] == new[t]), p1[t, prop[0]]
        b0.append(x0)
        b1.append(x1)
    return b0, b1


def leviathan_t3_gaps():
    """
    Leviathan 表 3 的 α（T = 0）− α（T = 1）按模型对分组 -> dict：T5 的几对（范围、是否都是 T = 0 高）、
    其余神经网络模型对（GPT-like、LaMDA）的最大 |差|、二元语法草稿 T = 0 的 α 的范围。
    """
    neural = [r for r in LEVIATHAN_T3 if r[1] != "二元语法"]
    t5 = [a0 - a1 for t, _, a0, a1 in neural if t.startswith("T5")]
    other = [abs(a0 - a1) for t, _, a0, a1 in neural if not t.startswith("T5")]
    bigram = [a0 for _, d, a0, _ in LEVIATHAN_T3 if d == "二元语法"]
    return {"n_neural": len(neural), "n_t5": len(t5), "t5": (min(t5), max(t5)), "t5_all_up": min(t5) > 0,
            "n_other": len(other), "other": max(other), "bigram0": (min(bigram), max(bigram))}


# -----------------------------------------------------------------------------
def demo1_alphas(ctx):
    print_header("演示 1：真实目标（SmolLM2-135M）的草稿和它们的 α（teacher forcing，目标自己的贪心文本）")
    tok = ctx["tok"]
    lens = [len(new) for _, new in ctx["texts"]]
    print_note(f"三段贪心文本的新 token 数：" + "、".join(f"{PROMPTS[i][0]} {n}" for i, n in enumerate(lens))
               + f"；目标自己 teacher forcing 的 argmax 和文本不同的位置：{ctx['target_mismatch']} 个。"
               + f"照抄那段的开头：{tok.decode(ctx['texts'][2][1][:12])!r}")
    names = list(ctx["drafts"])
    alphas = {}
    rows = []
    for name in names:
        a0, a1 = _alpha0(ctx, name), _alpha1(ctx, name)
        per = [float(a.mean()) for a in _agree(ctx, name)]
        alphas[name] = (a0, a1, per)
        rows.append([name, f"{a0:.3f}", f"{a1:.3f}", f"{a0 - a1:+.3f}"] + [f"{x:.2f}" for x in per])
    lk0, lk1 = _lookup_betas(ctx)
    lk_per = [float(a.mean()) for a in lk0]
    la0, la1 = float(np.concatenate(lk0).mean()), float(np.concatenate(lk1).mean())
    alphas["prompt lookup"] = (la0, la1, lk_per)
    rows.append([f"prompt lookup（n = {LOOKUP_N}）", f"{la0:.3f}", f"{la1:.3f}", f"{la0 - la1:+.3f}"]
                + [f"{x:.2f}" for x in lk_per])
    print_table(["草稿", "α T = 0", "α T = 1", "T=0 − T=1"] + [f"T = 0\n{p[0]}" for p in PROMPTS], rows)
    print_note("两个 α 在同一段贪心文本、同样的上下文上算（只差温度）：T = 0 是 argmax 相同的比例，T = 1 是 Σ min(p, q) 的平均。"
               "prompt lookup 的草稿是确定的：β = 目标给提议的第一个 token 的概率（T = 0 时就是\"提议 == 文本的 token\"），"
               "没有提议的位置 β = 0。")

    # 对照：Leviathan 表 3 的真实模型对，和 04 的玩具
    toy_t, toy_d = build_seed04_models()
    toks = sample_tokens(toy_t.params, QCFG, **TOY_TEXT)
    toy = alphas_on_text(toy_t, toy_d, toks, (0.0, 1.0))
    ctx["toy_models"] = (toy_t, toy_d, toks)                    # 演示 3 再用（玩具的 r₁）
    ent_toy = _entropy(toy_t.full_logits(toks))
    ent_real = _entropy(np.concatenate(ctx["target_logits"]))
    rows2 = [[f"Leviathan 表 3：{t} + {d}", f"{a0:.2f}", f"{a1:.2f}", f"{a0 - a1:+.2f}"]
             for t, d, a0, a1 in LEVIATHAN_T3]
    rows2 += [[f"04 的玩具：{n}", f"{v[0]:.3f}", f"{v[1]:.3f}", f"{v[0] - v[1]:+.3f}"] for n, v in toy.items()]
    print_table(["目标 + 草稿", "α T = 0", "α T = 1", "T=0 − T=1"], rows2)

    skip, early = ctx["skip_label"], f"只用前 {EXIT_K} 层"
    neural = [n for n in names if n != ctx["ngram_label"]]
    up = [n for n in neural if alphas[n][0] > alphas[n][1]]
    gap_real = max(abs(alphas[n][0] - alphas[n][1]) for n in neural)
    toy_neural = [n for n in toy if n != "二元语法表"]
    gap_toy = max(toy[n][0] - toy[n][1] for n in toy_neural)     # 降得最少的那个（负数 = T = 0 更低）
    best = max(neural, key=lambda n: alphas[n][0])
    ng = alphas[ctx["ngram_label"]][0]
    t3 = leviathan_t3_gaps()
    obs = [
        f"温度：真实目标的 {len(neural)} 个神经网络草稿里 {len(up)} 个在 T = 0 时 α 更高"
        f"（{'、'.join(up) or '没有'}）" + ("" if len(up) == len(neural) else "，其余的 T = 1 更高")
        + f"；两列最多差 {gap_real:.3f}。Leviathan 表 3 的 {t3['n_neural']} 对神经网络模型差别不小："
        f"{t3['n_t5']} 对 T5（EnDe、CNNDM 各三个草稿）" + ("都是 " if t3["t5_all_up"] else "")
        + f"T = 0 高 {t3['t5'][0]:.2f}–{t3['t5'][1]:.2f}，GPT-like 和 LaMDA 的 {t3['n_other']} 对两列最多差"
        f" {t3['other']:.2f}" + (f"；这里的草稿都比 T5 那几对差得少（{gap_real:.3f} < {t3['t5'][0]:.2f}）。"
                                 if gap_real < t3["t5"][0] else "。")
        + "04 的玩具却是 T = 0 低得多：它的三个神经网络草稿至少低"
        f" {-gap_toy:.3f}——随机模型的分布很平（目标的平均熵 {ent_toy:.2f} nats，真实目标在这段文本上"
        f" {ent_real:.2f} nats），argmax 常常是几乎并列的几个之一，草稿稍有偏差就选了另一个；"
        "训练过的模型多数位置有一个明显的峰，猜中峰就行。"
        f"最准的是 {best}（T = 0 时 {alphas[best][0]:.3f}）。",
        f"跳层 vs 提前退出：同样用 {EXIT_K} 层，跳过中间 {SKIP[1]} 层的 α = {alphas[skip][0]:.3f}，只用前 {EXIT_K} 层的"
        f" α = {alphas[early][0]:.3f}。跳过中间的层，后面的层照样接着加工残差流（Draft & Verify 不训练就这样做）；"
        "只用前面的层时，最后几层对残差流的改写整个丢了，lm_head 读到的是还没写完的隐状态——LayerSkip 要训练"
        "（层 dropout + 每层都接 lm_head 的损失）才能从前面的层退出。04 的玩具里\"只用前 3 层\"（4 层里丢掉最后 1 层）"
        f"的 α 在 T = 1 时有 {toy['只用前 3 层'][1]:.2f}：随机模型的最后一层没有特别的分工。",
        f"{ctx['ngram_label']}：α = {ng:.3f}（T = 0），"
        + ("远低于" if ng < 0.1 else "低于" if ng < t3["bigram0"][0] else "不低于")
        + f" Leviathan 表 3 的两个二元语法草稿（T = 0 时 {t3['bigram0'][0]:.2f}–{t3['bigram0'][1]:.2f}，"
        "在目标生成的 1 万个 token 上量的）："
        "它只从另外两段几十个 token 里学，文本一换题目就几乎猜不中。"
        f"prompt lookup 只在照抄的文本上有用（照抄 {lk_per[2]:.2f}，散文 {lk_per[0]:.2f}）。",
    ]
    print_observations(obs)
    return {"alphas": alphas, "toy": toy, "up": up, "gap_real": gap_real, "gap_toy": gap_toy,
            "ent_toy": ent_toy, "ent_real": ent_real, "t3": t3}


# -----------------------------------------------------------------------------
def _t1_cells(ctx):
    """T = 1 真跑的一格（float32）-> list of dict。"""
    if "t1" in ctx:
        return ctx["t1"]
    target, skip = ctx["target"], ctx["skip"]
    cells = []
    pr = ctx["prompts"][T1["prompt"]]
    out, st = speculative_generate(target, skip, pr, T1["n_new"], T1["gamma"], 1.0,
                                   np.random.default_rng(T1["seed"]), stop=STOP)
    text = [(pr, [int(x) for x in out])]
    lp, lq = _per_text(target, text)[0], _per_text(skip, text)[0]
    alpha = float(acceptance_beta(adjust(lp, 1.0), adjust(lq, 1.0)).mean())
    cells.append({"draft": ctx["skip_label"], "gamma": T1["gamma"], "alpha": alpha, "accepted": st["accepted"],
                  "text": PROMPTS[T1["prompt"]][0]})
    ctx["t1"] = cells
    return cells


def demo2_tokens_per_call(ctx):
    print_header("演示 2：每次目标调用的 token——T = 0 精确地数 vs 式 (1)，T = 1 真跑一格")
    names = [n for n in ctx["drafts"]]
    rows, exact = [], {}
    for name in names:
        a0 = _alpha0(ctx, name)
        cells = [name, f"{a0:.3f}"]
        for g in GAMMAS:
            s = round_summary([greedy_rounds(a, g) for a in _agree(ctx, name)])
            e1 = expected_tokens(a0, g)
            exact[(name, g)] = (s["per_call"], e1, s["n_complete"])
            cells.append(f"{s['per_call']:.2f} / {e1:.2f}")
        rows.append(cells)
    print_table(["草稿", "α T = 0"] + [f"γ = {g}\n精确 / 式 (1)" for g in GAMMAS], rows)
    print_note("每格：精确数出来的每轮 token（三段文本的完整的轮）/ 式 (1) 在同一个 α 上的值。")

    cells = _t1_cells(ctx)
    rows2 = []
    for c in cells:
        acc = np.asarray(c["accepted"]) + 1
        se = float(acc.std(ddof=1) / np.sqrt(acc.size)) if acc.size > 1 else float("nan")
        c.update(per_call=float(acc.mean()), se=se, rounds=int(acc.size))
        if c["alpha"] is not None:
            c["eq1"] = expected_tokens(c["alpha"], c["gamma"])
            c["inside"] = abs(c["per_call"] - c["eq1"]) <= 2 * se
            eq = f"{c['eq1']:.2f}"
        else:
            c["eq1"], c["inside"], eq = None, None, "—"
        rows2.append([f"{c['draft']}（{c['text']}）", c["gamma"], "—" if c["alpha"] is None else f"{c['alpha']:.3f}",
                      c["rounds"], f"{c['per_call']:.2f} ± {se:.2f}", eq])
    print_table(["T = 1 真跑", "γ", "α（它自己的输出上）", "轮数", "每轮 token ± 标准误", "式 (1)"], rows2)
    print_note("T = 1 的 α：目标和草稿在这次输出（目标分布的一个样本）上 teacher forcing 的 Σ min(p, q) 的平均。")
    over = [(n, g) for (n, g), v in exact.items() if v[0] < v[1] - 1e-12]
    c0 = cells[0]
    worst = min(exact, key=lambda k: exact[k][0] / exact[k][1])
    wv = exact[worst]
    obs = [
        f"T = 0 的 {len(exact)} 格里式 (1) 高估了 {len(over)} 格（精确值 < 式 (1)）；差得最多的是 {worst[0]}、γ = {worst[1]}："
        f"{wv[0]:.2f} 对 {wv[1]:.2f}（{wv[0] / wv[1] - 1:+.0%}）。这些是精确值：同样的文本再算一次一模一样，"
        "差别不是循环的抽样误差（文本本身只有三段，换一批文本会不同）；它由什么组成，演示 3 拆开看。",
        f"T = 1 的{c0['draft']}（γ = {c0['gamma']}）：真跑 {c0['rounds']} 轮，每轮 {c0['per_call']:.2f} ± {c0['se']:.2f}，"
        f"式 (1) 在它自己输出上的 α = {c0['alpha']:.3f} 给 {c0['eq1']:.2f}："
        + ("差别在 2 个标准误以内，这么短的一次运行分不出来。" if c0["inside"] else "差别超过 2 个标准误。")
        + "标准误按 √轮数 缩小：要分辨几个百分点的差别得跑上千轮，所以 T = 0 的结论用精确的数。",
    ]
    print_observations(obs)
    return {"exact": exact, "over": over, "t1": cells}


def _toy_lag1(ctx):
    """
    04 的玩具，T = 0：每个草稿"argmax 和目标的 argmax 相同"的指示在玩具文本（演示 1 的 8 × 64 个 token）上的相邻相关
    -> {草稿名: r₁}（每条序列里相邻的两个位置配对，不跨序列；方差为 0 的草稿不列）。
    """
    toy_t, toy_d, toks = ctx["toy_models"]
    top_t = toy_t.full_logits(toks).argmax(-1)
    out = {}
    for name, d in toy_d.items():
        lq = d.table[np.asarray(toks)] if hasattr(d, "table") else d.full_logits(toks)
        try:
            out[name] = lag1_correlation((lq.argmax(-1) == top_t).astype(float))
        except ValueError:
            pass
    return out


# -----------------------------------------------------------------------------
def demo3_seed04_sentence(ctx):
    g = GAMMA_CORR
    print_header(f"演示 3：04 的那句话，在真实文本上量（T = 0，精确；γ = {g}）")
    rows, out = [], {}
    for name in ctx["drafts"]:
        agree = _agree(ctx, name)
        flat = np.concatenate(agree).astype(float)
        pairs = np.stack([np.concatenate([a[:-1] for a in agree]), np.concatenate([a[1:] for a in agree])], 1)
        try:
            r = lag1_correlation(pairs.astype(float))
        except ValueError:
            r = float("nan")
        rs = [greedy_rounds(a, g) for a in agree]
        starts = np.concatenate([a[x["starts"][x["complete"]]] for a, x in zip(agree, rs)]).astype(float)
        s = round_summary(rs)
        a0 = float(flat.mean())
        e1 = expected_tokens(a0, g)
        sh = _shuffled_per_call(agree, g, N_SHUFFLE, SHUFFLE_SEED)
        out[name] = {"lag1": r, "alpha": a0, "alpha_start": float(starts.mean()), "exact": s["per_call"], "eq1": e1,
                     "err": s["per_call"] / e1 - 1, "shuffled": sh, "err_order": s["per_call"] / sh - 1}
        rows.append([name, "—" if np.isnan(r) else f"{r:+.2f}", f"{a0:.3f}", f"{starts.mean():.3f}", f"{s['per_call']:.2f}", f"{e1:.2f}",
                     f"{s['per_call'] / e1 - 1:+.1%}", f"{sh:.2f}", f"{s['per_call'] / sh - 1:+.1%}"])
    print_table(["草稿", "r₁", "α 全部", "α 起点", "每轮 token\n精确", "式 (1)", "差", "打乱后", "差"], rows)
    print_note("β_t ∈ {0, 1}（T = 0）：草稿在第 t 个位置猜对了没有；r₁ = β 的相邻相关（三段文本里相邻的两个位置配对，"
               "不跨段）。\"α 起点\"：只看每一轮第一个要猜的位置（完整的轮）。第一个差 = 精确 / 式 (1) − 1；"
               f"\"打乱后\"：每段的 β 随机打乱顺序（α 不变）再精确地数，{N_SHUFFLE} 次的平均；第二个差 = 精确 / 打乱后 − 1，"
               "只剩\"猜错的位置排在哪里\"的效应（文本有限、末尾不完整的轮这些效应两边一样）。")
    n_pairs = sum(len(a) - 1 for a in _agree(ctx, next(iter(ctx["drafts"]))))
    toy_r = _toy_lag1(ctx)
    n_pos = n_pairs + len(ctx["texts"])
    finite = {n: v["lag1"] for n, v in out.items() if not np.isnan(v["lag1"])}
    pos_r = [n for n, r in finite.items() if r > 0]
    low_start = [n for n, v in out.items() if v["alpha_start"] < v["alpha"]]
    neg = [n for n, v in out.items() if v["err"] < 0]
    neg_order = [n for n, v in out.items() if v["err_order"] < 0]
    obs = [
        f"相邻相关：r₁ 有定义的 {len(finite)} 个草稿里 {len(pos_r)} 个 r₁ > 0（{'、'.join(pos_r) or '没有'}），"
        f"从 {min(finite.values()):+.2f} 到 {max(finite.values()):+.2f}（04 的玩具，T = 0、它自己的文本上："
        f"{len(toy_r)} 个草稿的 |r₁| ≤ {max(abs(r) for r in toy_r.values()):.2f}）。"
        f"{n_pairs} 对相邻位置上，不相关时 r₁ 的抽样误差约 ±{1 / np.sqrt(n_pairs):.2f}：只有明显大于它的才算\"成片\"。",
        f"每轮起点：{len(low_start)} / {len(out)} 个草稿的\"α 起点\"低于总的 α（08 的机制：一轮在猜错处结束，"
        "下一轮就从猜错的附近开始）。",
        f"式 (1)：{len(neg)} / {len(out)} 个草稿的精确值低于式 (1)（γ = {g}）；和同样 α 的打乱顺序比，"
        f"{len(neg_order)} / {len(out)} 个低于打乱后的值。式 (1) 的误差里有一部分不是\"成片\"：打乱以后它还在"
        "（文本有限：完整的轮数少、猜错的位置就那么几个）。",
        "对种子 04 那句话的意思：在这个真实模型上，式 (1) 对这几个草稿"
        + ("多半是高估" if len(neg) > len(out) / 2 else "并不总是高估")
        + ("，而且去掉顺序之后高估变小——顺序（成片）确实贡献了一部分；" if len(neg_order) > len(out) / 2 else
           "，但打乱顺序后大多还在——这几段文本里高估主要不是来自成片；")
        + ("相邻相关有正有负，它说的\"往往\"在这里只对一部分草稿看得到。" if 0 < len(pos_r) < len(finite) else
           "相邻相关都是正的，和它说的\"成片\"一致。" if pos_r else "相邻相关没有一个是正的，看不到\"成片\"。")
        + "要下定论需要长得多的文本（几千个位置），"
        f"这里是三段、{n_pos} 个位置的精确值，不是一条定律。",
    ]
    print_observations(obs)
    return {"per_draft": out, "n_pairs": n_pairs, "pos_r": pos_r, "neg": neg, "neg_order": neg_order, "toy_r": toy_r}


# -----------------------------------------------------------------------------
def _lk0(ctx):
    return [float(b.mean()) for b in _lookup_betas(ctx)[0]]


def demo4_prompt_lookup(ctx):
    print_header("演示 4：prompt lookup——模型照抄的时候（T = 0，精确）")
    lk = PromptLookup(LOOKUP_N)
    rows, out = [], {}
    for (label, _), (prompt, new) in zip(PROMPTS, ctx["texts"]):
        cells = [label, len(new)]
        for key, g, gmax in (("γ = 4", 4, None), ("γ = 8", 8, None), ("自适应", ADAPT[0], ADAPT[1])):
            r = lookup_rounds(prompt, new, lk, g, gmax)
            out[(label, key)] = {"calls": r["calls"], "per_call": len(new) / r["calls"],
                                 "drafted": int(r["drafted"].sum()), "accepted": int(r["accepted"].sum()),
                                 "no_draft": int((r["drafted"] == 0).sum())}
            cells += [r["calls"], f"{len(new) / r['calls']:.2f}"]
        rows.append(cells)
    print_table(["文本", "新 token", "γ=4 调用", "token/调用", "γ=8 调用", "token/调用", "自适应 调用", "token/调用"], rows)
    print_note(f"token/调用 = 新 token 数 / 目标调用次数（包括末尾被截短的一轮）；自适应：从 γ = {ADAPT[0]} 开始，"
               f"全部接受 +2（最多 {ADAPT[1]}），有拒绝 −1。找不到匹配的一轮只让目标前向一次、产出 1 个 token。")
    pmax = [float(adjust(lp, 1.0).max(-1).mean()) for lp in ctx["target_logits"]]
    copy8, prose8 = out[("照抄", "γ = 8")], out[("散文", "γ = 8")]
    la1 = [float(b.mean()) for b in _lookup_betas(ctx)[1]]
    obs = [
        f"照抄的提示：γ = 8 时每次调用 {copy8['per_call']:.2f} 个 token（{len(ctx['texts'][2][1])} 个新 token 只要"
        f" {copy8['calls']} 次目标前向）；散文只有 {prose8['per_call']:.2f}：没有可抄的，{prose8['drafted']} 个草稿"
        f" token 只被接受 {prose8['accepted']} 个，{prose8['no_draft']} / {prose8['calls']} 轮找不到匹配"
        "（那一轮只让目标前向一次）。",
        f"自适应 γ 在照抄的文本上是 {out[('照抄', '自适应')]['per_call']:.2f}：全部接受就加长；"
        f"在散文上是 {out[('散文', '自适应')]['per_call']:.2f}（没有草稿的轮不改 γ）。"
        f"这一段照抄只有 {len(ctx['texts'][2][1])} 个 token，固定的 γ = 8 一轮就抄一大段，"
        "自适应从 γ = 2 慢慢加长反而多用了调用。"
        if out[("照抄", "自适应")]["calls"] > copy8["calls"] else
        f"自适应 γ 在照抄的文本上是 {out[('照抄', '自适应')]['per_call']:.2f}，不比固定的 γ = 8 差。",
        f"照抄时目标的分布几乎是 one-hot（T = 1 时最大的概率平均 {pmax[2]:.2f}，散文 {pmax[0]:.2f}），"
        f"所以 T = 1 时 prompt lookup 在照抄那段的 α（= 目标给提议的概率）仍有 {la1[2]:.2f}（T = 0：{_lk0(ctx)[2]:.2f}）。"
        "它的草稿不花算力，收益只取决于文本里有没有可抄的（Saxena 2023，github.com/apoorvumang/prompt-lookup-decoding："
        "输入里有的文本上 2–4 倍）。",
    ]
    print_observations(obs)
    return {"rounds": out, "pmax": pmax}


# -----------------------------------------------------------------------------
def demo5_trees(ctx):
    print_header("演示 5：T = 0 的 top-k 树 vs 同样位置数的链（精确）")
    names = [n for n in ctx["drafts"]]
    rows, out = [], {}
    for widths in TREES:
        size = tree_size(widths)
        cells = ["链" if max(widths) == 1 else "树", "(" + ", ".join(map(str, widths)) + ")", size]
        for name in names:
            s = round_summary([tree_rounds(rk, widths) for rk in ctx["drafts"][name]["ranks"]])
            out[(widths, name)] = s["per_call"]
            cells.append(f"{s['per_call']:.2f}")
        rows.append(cells)
    short = {n: n.replace("的自己", "").replace("（留一法）", "") for n in names}
    print_table(["", "每层宽度", "位置数"] + [short[n] for n in names], rows)
    print_note("树：第 1 层是草稿在根处的前 k₁ 名（不同的 token），第 i 层每个节点下挂草稿在那里的前 k_i 名；"
               "位置数 = 目标一次前向要打分的草稿 token 数。T = 0 时只有贪心路径能被接受，所以接受到第 i 层 ⇔ 文本在那里的 "
               "token 排在草稿的前 k_i 名（teacher forcing 的排名）——精确，不抽样。")
    wins = {}
    for budget in sorted({tree_size(w) for w in TREES}):
        shapes = [w for w in TREES if tree_size(w) == budget]
        chain = (1,) * budget
        for name in names:
            best = max(shapes, key=lambda w: out[(w, name)])
            wins[(budget, name)] = (best, out[(best, name)], out[(chain, name)])
    tree_names = sorted({n for (b, n), v in wins.items() if max(v[0]) > 1 and v[1] > v[2]},
                        key=names.index)
    chain_names = [n for n in names if n not in tree_names]
    a_tree = [_alpha0(ctx, n) for n in tree_names]
    a_chain = [_alpha0(ctx, n) for n in chain_names]
    margin = {n: max(v[1] / v[2] - 1 for (b, m), v in wins.items() if m == n) for n in tree_names}
    budgets = sorted({tree_size(w) for w in TREES})
    n_pos = sum(len(new) for _, new in ctx["texts"])
    e8 = ctx["drafts"][f"只用前 {EXIT_K} 层"]["ranks"]
    miss = np.concatenate(e8)
    second = float(((miss > 0) & (miss < 4)).sum() / max((miss > 0).sum(), 1))
    obs = [
        "同样的位置数下，树（至少一种位置数）赢链的草稿："
        + ("、".join(f"{n}（最多 {margin[n]:+.0%}）" for n in tree_names) + f"，α ≤ {max(a_tree):.2f}"
           if tree_names else "没有")
        + f"；链始终更好的：{'、'.join(chain_names) or '没有'}" + (f"，α ≥ {min(a_chain):.2f}。" if a_chain else "。")
        + f"\"α 低时树赢、α 高时链好\"只在这里的条件下成立：位置只有 {' 和 '.join(map(str, budgets))} 个、"
        f"{len(TREES)} 种固定的形状（每层宽度不随上下文变）、三段文本的 {n_pos} 个位置。它不是一般规律：09 演示 4 的观察 4 说"
        "取前 k 个不同候选的树 T = 0 时也能赢；EAGLE（arXiv 2401.15077）的草稿 α 高，验证的却是树——EAGLE-2"
        "（arXiv 2406.16858）按草稿的置信度为每个上下文长一棵动态树，每轮验证几十个 token（发布的设置约 60 个）。",
        f"为什么：只用前 {EXIT_K} 层猜错的位置里，{second:.0%} 的目标 token 排在它的第 2–4 名——宽的第一层把它们接住；"
        f"α 高的草稿本来就很少猜错，只有这么几个位置时，花在第二名上不如把链拉长（INT8 8 个位置的链 "
        f"{out[((1,) * 8, names[0])]:.2f}，(2, 1, 1, 1) {out[((2, 1, 1, 1), names[0])]:.2f}）。"
        "候选是不重复的前 k 名（Medusa、EAGLE 的做法），T = 0 时不会浪费在重复的候选上。",
    ]
    print_observations(obs)
    return {"per_call": out, "wins": wins, "tree_names": tree_names, "second": second, "margin": margin,
            "budgets": budgets, "n_pos": n_pos}


# -----------------------------------------------------------------------------
def demo6_cost(ctx):
    print_header("演示 6：代价系数 c 与定理 3.8 的预测（部署假设：batch 1、带宽受限、目标 BF16）")
    bt = ctx["costs"]["target_bf16"]
    rows, out = [], {}
    for name in ctx["drafts"]:
        b, c_flops, bits = ctx["costs"][name]
        c = b / bt
        a0 = _alpha0(ctx, name)
        if c > 0:
            g_star, s_star = best_gamma(a0, c)
        elif a0 > 0:                           # 草稿免费：γ 越大越快，极限 1 / (1 − α)
            g_star, s_star = None, 1.0 / (1.0 - a0)
        else:                                  # 免费、可是从来猜不中：每轮只有 1 个 token，怎么都是 1×
            g_star, s_star = 0, 1.0
        ex = {g: round_summary([greedy_rounds(a, g) for a in _agree(ctx, name)])["per_call"] / (g * c + 1)
              for g in GAMMAS}
        g_ex = max(ex, key=ex.get)
        out[name] = {"bytes": b, "c": c, "c_flops": c_flops, "gamma_star": g_star, "speedup": s_star,
                     "exact_best": (g_ex, ex[g_ex])}
        rows.append([name, "—" if bits is None else f"{bits:.2f}", f"{b / 1e6:.1f}", f"{c:.3f}", f"{c_flops:.2f}",
                     f"{a0:.3f}", "不划算" if g_star == 0 else f"γ={g_star if g_star else '∞'}, {s_star:.2f}×",
                     f"γ={g_ex}, {ex[g_ex]:.2f}×"])
    print_table(["草稿", "层的位数", "MB / token", "c（字节）", "ĉ（运算）", "α T = 0", "定理 3.8 最优",
                 "精确 E 的最好"], rows)
    ft = ctx["costs"]["target_file"]
    i8 = ctx["costs"]["INT8 的自己"][0]
    print_note(f"目标按 BF16：每 token 读 {bt / 1e6:.1f} MB 的矩阵（lm_head 就占 {ctx['P']['lm_head'].size * 2 / bt:.0%}）。"
               f"\"精确 E 的最好\"：在 γ ∈ {{{', '.join(map(str, GAMMAS))}}} 里，用演示 2 精确的每轮 token 代替式 (1) 时"
               "定理 3.8 的加速 E / (γc + 1) 最大的那个。ĉ：每 token 的矩阵乘运算量之比（量化的草稿按反量化的浮点算，运算量不变）。"
               "层的位数：每层 7 个矩阵的平均位数（含 scale）；量化的草稿的 lm_head 和目标共用（BF16，算进 MB / token）。")
    skip, early = out[ctx["skip_label"]], out[f"只用前 {EXIT_K} 层"]
    q4, q8 = "INT4-g32 的自己", "INT8 的自己"
    obs = [
        f"假设很要紧：目标若按文件本身的格式部署（矩阵 Q4_1 5.0 位、共享的 lm_head Q8_0 8.5 位），每 token 只读 "
        f"{ft / 1e6:.1f} MB，INT8 的自草稿（{i8 / 1e6:.1f} MB）比目标还重（c = {i8 / ft:.2f} > 1），怎么都不划算。"
        "自草稿的量化要比目标部署的格式更窄才有意义。",
        f"重新量化的自草稿：{q4} 的 c = {out[q4]['c']:.2f}（层 4.5 位，共用目标 BF16 的 lm_head），定理 3.8 在 α = "
        f"{_alpha0(ctx, q4):.3f} 时最优 γ = {out[q4]['gamma_star']}、{out[q4]['speedup']:.2f}×；用精确的每轮 token"
        f" 最好是 {out[q4]['exact_best'][1]:.2f}×（γ = {out[q4]['exact_best'][0]}）。INT8 更准也更贵"
        f"（c = {out[q8]['c']:.2f}），定理 3.8 给 {out[q8]['speedup']:.2f}×（γ = {out[q8]['gamma_star']}），"
        + ("比 INT4-g32 还快：α 高出的部分抵过了多读的字节。" if out[q8]["speedup"] > out[q4]["speedup"] else
           "不如 INT4-g32：多读的字节抵掉了 α 高出的部分。"),
        f"跳过 {SKIP[1]} 层的草稿 c = {skip['c']:.2f} > α = {_alpha0(ctx, ctx['skip_label']):.3f}：推论 3.9 的条件 α > c "
        "不成立，定理 3.8 说任何 γ 都比普通 decode 慢——30 层里用了 26 层、lm_head 照算，太贵了。"
        "自草稿要便宜得多才划算：跳掉多得多的层（Draft & Verify 用优化挑要跳的层），"
        "或像 EAGLE（arXiv 2401.15077）那样草稿只有一层。"
        f"只用前 {EXIT_K} 层一样贵，α 却更低：" + ("一样不划算。" if early["gamma_star"] == 0 else
                                               f"最多 {early['speedup']:.2f} 倍。"),
    ]
    print_observations(obs)
    return out


# -----------------------------------------------------------------------------
def _timed_runs(ctx, prompt, n_new):
    """三种做法各生成一次 -> list of (名字, 秒, 新 token 数, 目标调用次数（普通 decode 是 None）)。"""
    target, skip = ctx["target"], ctx["skip"]
    out = []
    t0 = time.perf_counter()
    base = autoregressive_generate(target, prompt, n_new, 0.0, np.random.default_rng(0), stop=STOP)
    out.append(("普通 decode", time.perf_counter() - t0, len(base), None))
    t0 = time.perf_counter()
    o, st = speculative_generate(target, skip, prompt, n_new, GAMMA_CORR, 0.0, np.random.default_rng(0), stop=STOP)
    out.append((f"{ctx['skip_label']}（γ = {GAMMA_CORR}）", time.perf_counter() - t0, len(o), st["target_calls"]))
    t0 = time.perf_counter()
    o2, st2 = speculative_generate_adaptive(target, PromptLookup(LOOKUP_N), prompt, n_new, ADAPT[0], 0.0,
                                            np.random.default_rng(0), gamma_max=ADAPT[1], stop=STOP)
    out.append(("prompt lookup（自适应）", time.perf_counter() - t0, len(o2), st2["target_calls"]))
    return out


def demo7_timing(ctx, n_new=32, repeats=TIME_REPEATS):
    if not (isinstance(repeats, int) and not isinstance(repeats, bool) and repeats >= 1):
        raise ValueError(f"重复次数必须是 ≥ 1 的整数（收到 {repeats!r}）")
    print_header(f"演示 7：在这台 CPU 上计时（每种做法生成 {n_new} 个 token，T = 0，float32；重复 {repeats} 次）")
    rows, out = [], {}
    c_skip = ctx["costs"][ctx["skip_label"]][1]          # 这台 CPU 上 numpy 的时间 ∝ 运算量：c ≈ ĉ
    for label, idx in (("散文", 0), ("照抄", 2)):
        pr = ctx["prompts"][idx]
        reps = [_timed_runs(ctx, pr, n_new) for _ in range(repeats)]   # 三种做法交替着跑：负载的起伏三者都碰上
        t_base = np.array([r[0][1] for r in reps])
        for j, (name, _, n, calls) in enumerate(reps[0]):
            t = np.array([r[j][1] for r in reps])
            ratio = t_base / t                                # 同一次重复里的两者之比
            if calls is None:
                pred = 1.0
            elif j == 2:                                      # prompt lookup：草稿免费，每次调用 n / calls 个
                pred = n / calls
            else:                                             # 定理 3.8 的形式：每轮 n / calls 个 token，一轮 1 + γc
                pred = (n / calls) / (GAMMA_CORR * c_skip + 1)
            v = {"times": t, "median": float(np.median(t)), "n": n, "calls": calls, "pred": pred,
                 "ratio": float(np.median(ratio)), "ratio_range": (float(ratio.min()), float(ratio.max()))}
            out[(label, name)] = v
            rows.append([label, name, n, "—" if calls is None else calls, f"{v['median']:.2f} s",
                         f"{t.min():.2f}–{t.max():.2f} s",
                         f"{v['ratio']:.2f}×", "—" if j == 0 else f"{ratio.min():.2f}–{ratio.max():.2f}×", f"{pred:.2f}×"])
    print_table(["文本", "做法", "token", "目标\n调用", "墙钟\n中位数", "最快–最慢", "相对普通\n中位数", "相对普通\n范围",
                 "预测"], rows)
    print_note(f"每次重复里三种做法接着跑一遍，共 {repeats} 遍；\"相对普通\" = 同一遍里普通 decode 的时间 / 这种做法的时间，"
               f"{repeats} 个比值的中位数和最小–最大。预测 = 每次调用的 token / (γc + 1)：跳层草稿 c 取运算量之比"
               f" ĉ = {c_skip:.2f}（numpy 在 CPU 上的时间大致跟着运算量走），prompt lookup c = 0；都把 γ + 1 行的目标前向当成"
               "和 1 行一样贵，也没算第一次前向（整个提示，几种做法一样长，把实测的比值拉向 1）。")
    names = list(dict.fromkeys(name for _, name in out))
    plain, sk_name, lk_name = names
    prose, copy, sk = out[("散文", lk_name)], out[("照抄", lk_name)], out[("照抄", sk_name)]
    prose_plain = out[("散文", plain)]
    same_calls = prose["calls"] == prose_plain["n"]
    lo, hi = prose["ratio_range"]
    obs = [
        "计时只对这一次运行、这台机器有效（别的进程、BLAS 的线程都会改变它），所以默认运行不打印它。",
        (f"误差有多大：散文上 prompt lookup 的目标调用和普通 decode 一样多（{prose['calls']} 次，几乎找不到可抄的），"
         "真实的比值就是 ≈ 1.00×（有草稿的那几轮目标多打分几行，只会慢一点）；"
         if same_calls else
         f"误差有多大：散文上 prompt lookup 调用 {prose['calls']} 次、普通 decode {prose_plain['n']} 次（预测 "
         f"{prose['pred']:.2f}×）；")
        + f"测出来是 {prose['ratio']:.2f}×，{repeats} 次在 {lo:.2f}–{hi:.2f}× 之间"
        + ("：离 1.00× 的距离就是这台机器上计时的误差（负载的起伏、先后次序这类系统差别都在里面），比它小的差别这里分不出来。" if same_calls else "。"),
        f"照抄的提示上 prompt lookup 是 {copy['ratio']:.2f}×（{copy['ratio_range'][0]:.2f}–{copy['ratio_range'][1]:.2f}，"
        f"{copy['n']} 个 token 只调用目标 {copy['calls']} 次，预测 {copy['pred']:.2f}×）"
        + ("：最慢的一次也比散文那行的上限快，真的快了——numpy 里多几行的目标前向比一行贵不了多少（读一遍权重、"
           "固定的调用开销）。" if copy["ratio_range"][0] > hi else
           "：和散文那行的范围重叠，这次分不出是不是真的快了（生成的 token 少时，几种做法一样长的第一次前向——整个提示——占的比重大）。"),
        f"跳层草稿是 {sk['ratio']:.2f}×（{sk['ratio_range'][0]:.2f}–{sk['ratio_range'][1]:.2f}，预测 {sk['pred']:.2f}×）："
        f"每个草稿 token 要跑 {30 - SKIP[1]} 层，一轮的草稿比省下的目标前向还贵。重新量化的草稿在这里也不会更快："
        "numpy 把它反量化成浮点来算，读的字节和运算量都和目标一样。",
    ]
    print_observations(obs)
    return out


def main(argv):
    ctx = context()
    out = {"d1": demo1_alphas(ctx), "d2": demo2_tokens_per_call(ctx), "d3": demo3_seed04_sentence(ctx),
           "d4": demo4_prompt_lookup(ctx), "d5": demo5_trees(ctx), "d6": demo6_cost(ctx)}
    ctx["_cost"] = out["d6"]
    if "--time" in argv:
        i = argv.index("--time")
        n = int(argv[i + 1]) if len(argv) > i + 1 else 32
        demo7_timing(ctx, n)
    # 给测试（console.save_results）：只在设了 CS349E_RESULTS 时存下演示返回的数和 ctx 里模型以外的部分
    save_results({"out": out, "ctx": {k: v for k, v in ctx.items() if k not in ("P", "tok", "target", "skip")}})


if __name__ == "__main__":
    gguf_path_or_exit()          # 拿不到模型文件时只打印两条出路，退出码 1
    main(sys.argv[1:])
