"""
=============================================================================
CS349E · 第 6 讲 · 13_trained_drafts.py —— 训练出来的草稿：Medusa 头和 EAGLE 式的特征草稿
=============================================================================

【这个脚本要回答的问题】
01–12 的草稿都不用训练（种子 04 的小模型、n 元语法、prompt lookup、跳层、重新量化的自己）。真实系统用的是训练出来的：
Medusa 头、EAGLE 的特征草稿。这里用 train_draft_heads.py 在 SmolLM2-135M 自己的文本上（numpy、手写反向）训练好的两个，
在**留出的**提示上和不用训练的草稿比：
演示 1：α（T = 0 和 T = 1）和每次目标调用的 token（T = 0，按贪心文本精确地数），Medusa 的头 1..k、Medusa 的树、
EAGLE 式草稿、prompt lookup、n 元语法、跳层草稿放在一起。
演示 2：草稿每个 token 的代价（字节、FLOPs）：一层的草稿在 135M 的模型上主要是 lm_head 的钱——改正种子 04 演示 4
观察 3 的"要么像 EAGLE 那样只有一层"（这句话的改正只在这里）。
演示 3：式 (1) 用量到的 α 和 c 预测的加速比，对照链和 Medusa 的树在 runner_lab 的模型时钟上真的得到的。
演示 4：论文报的接受长度放在我们的旁边（模型大小差五十倍以上，只并列、不比较）。

【怎么读输出】α = 一个草稿 token 被接受的概率的平均（推论 3.6）：链用 Σmin(p, q)（T = 0 时是"草稿的 argmax ==
文本的 token"的比例）；Medusa 的候选是确定的前 k 名，验证用点质量规则，所以它的 T = 1 列是 p(头的第一名)
（distinct_lab.topk_acceptance）。"每次调用 token" = T = 0 时每次目标前向平均产出几个 token，只用草稿的位置都在
文本里的完整的轮（greedy_lab.round_summary）；T = 0 的投机解码输出就是贪心文本，所以它是精确数出来的，没有抽样误差。

【模型的假设（务必看）】
- 草稿：trained_drafts/smollm2_drafts.npz（float16；命令、模型文件的 sha256、数据量、每个 epoch 的损失在旁边的
  smollm2_drafts.json）。模型文件不是训练时那一个：脚本退出，告诉你重新训练的命令。
- 文本：6 个留出的提示（训练从没见过，题目和句式都不在训练的里面）的贪心续写，各 64 个新 token，token id 随仓库发布
  （文件里），所以脚本不再生成。目标和草稿都按 float32 运行；脚本打印目标在这些文本上 teacher forcing 的 argmax
  和文本不同的位置个数（应为 0）。只有 6 段、384 个位置：换一批文本，每个数都会变。
- n 元语法：3 元、Witten–Bell，在和草稿**同样的**训练文本（36k 个 token 的自蒸馏文本）上拟合。
- 跳层：跳过第 12–15 层（同 10）。prompt lookup：最后 2 个 token 去匹配（同 10）。链的 γ 都是 GAMMA。
- 代价（演示 2、3）：batch 1 的 decode；字节按 BF16（演示 2）或 float32（演示 3：这台 CPU 上 numpy 的引擎用 float32），
  草稿的 FLOPs = 2 × 读的参数。演示 3 的时钟：目标每次前向 = runner_lab.modelled_step_time（roofline + 每步、每序列的
  固定开销，CPU_COST 是假设）；训练出来的草稿只算 roofline、不加固定开销（它一步只有十几次 numpy 调用：这是下界）；
  跳层草稿一步 = 26 层的模型走同一个模型时钟；n 元语法、prompt lookup 不计时（查表）。

【运行】python3 13_trained_drafts.py （2 核机器、一个 BLAS 线程，别的进程也在跑（uptime 的负载 2.6–3.3）：9.5 和 9.7 秒，
和种子 04 背靠背交替跑两次，种子 04 是 4.07 和 3.98 秒：约 2.4 倍；内存约 1 GB；第一次运行先下载模型）
【依赖】numpy；本目录的 trained_draft_lab（草稿、每个 token 的账）、feature_decode_lab（T = 0 的精确轮次）、greedy_lab、ngram_lab、lookup_lab、drafts_lab、distinct_lab、
decode_lab、spec_math_lab；../lecture05 的 runner_lab（一步的账、CPU 的模型时钟）；../lecture02 的 real_model_lab、hub_lab；
../lecture01 的 console、llm_math。训练：python3 lecture06/train_draft_heads.py。
【来源】Cai et al. 2024，Medusa（arXiv 2401.10774）；Li et al. 2024，EAGLE（arXiv 2401.15077）；Zhao et al. 2025，
FR-Spec（arXiv 2502.14856，草稿词表）；Leviathan et al. 2023（arXiv 2211.17192）式 (1)、定理 3.8。
"""
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
for sub in ("lecture01", "lecture02", "lecture03", "lecture05", "prereq3"):
    sys.path.insert(0, os.path.join(HERE, "..", sub))

from console import print_header, print_observations, print_table  # noqa: E402
from decode_lab import TransformerLM, acceptance_beta, adjust  # noqa: E402
from distinct_lab import topk_acceptance  # noqa: E402
from drafts_lab import layer_skip_draft  # noqa: E402
from greedy_lab import greedy_rounds, lookup_rounds, round_summary, tree_size  # noqa: E402
from hub_lab import gguf_path_or_exit, sha256_file  # noqa: E402
from llm_math import LLAMA2_7B, SMOLLM2_135M  # noqa: E402
from lookup_lab import PromptLookup  # noqa: E402
from ngram_lab import SparseNGramLM  # noqa: E402
from real_model_lab import load_gguf  # noqa: E402
from runner_lab import CPU_COST, modelled_step_time, step_counts  # noqa: E402
from spec_math_lab import walltime_speedup  # noqa: E402
from feature_decode_lab import eagle_rounds, medusa_ranks, medusa_rounds  # noqa: E402
from trained_draft_lab import DraftHead, draft_cost, draft_params, target_features  # noqa: E402
from transformer_lab import config_like  # noqa: E402

# ---- 设置（选出来的）----
WEIGHTS = os.path.join(HERE, "trained_drafts")
GAMMA = 3                       # 链的草稿长度（= Medusa 头的个数）
MEDUSA_TREE = (4, 2, 1)         # Medusa 的固定树：每层几个候选（4 + 8 + 8 = 20 个节点）
SKIP = (12, 4)                  # 跳层草稿：跳过第 12–15 层（同 10）
NGRAM_ORDER, LOOKUP_N = 3, 2
# 论文报的数（演示 4）。EAGLE：arXiv 2401.15077 的 MT-bench 表（加速比和平均接受长度 τ；τ = 每次目标前向的 token）；
# Medusa：arXiv 2401.10774 的摘要（只报墙钟加速比，这里没有查到能核对的 τ）。
PAPERS = (("EAGLE（2401.15077）", "Vicuna 7B", "MT-bench", "T = 0", "τ = 3.94"),
          ("EAGLE（2401.15077）", "Vicuna 7B", "MT-bench", "T = 1", "τ = 3.17"),
          ("Medusa（2401.10774）", "Vicuna 7B–33B、Zephyr 7B", "MT-bench", "—", "加速 2.2–3.6×（墙钟）"))
_CTX = {}


# -----------------------------------------------------------------------------
def _split(a, lengths):
    return np.split(np.asarray(a), np.cumsum(lengths)[:-1])


def context():
    """装模型和草稿、在留出文本上 teacher forcing 一次 -> dict（整个脚本只做一次）。"""
    if _CTX:
        return _CTX
    with open(os.path.join(WEIGHTS, "smollm2_drafts.json"), encoding="utf-8") as f:
        meta = json.load(f)
    path = gguf_path_or_exit()
    if sha256_file(path) != meta["gguf_sha256"]:
        sys.exit(f"{path} 不是训练这些草稿时的模型文件（sha256 不同）：先重新训练 {meta['command']}")
    P, cfg, tok = load_gguf(path, dtype=np.float32)
    target = TransformerLM(P, cfg, "目标")
    z = dict(np.load(os.path.join(WEIGHTS, "smollm2_drafts.npz")))
    ids = z["vocab_ids"]
    medusa = DraftHead("medusa", target, {"w": z["medusa_w"], "b": z["medusa_b"]}, ids)
    eagle = DraftHead("eagle", target, {k[6:]: z[k] for k in z if k.startswith("eagle_")}, ids)
    prompts = [list(map(int, p)) for p in _split(z["heldout_prompts"], z["heldout_prompt_lengths"])]
    texts = [list(map(int, t)) for t in _split(z["heldout_tokens"], z["heldout_lengths"])]
    train = [list(map(int, t)) for t in _split(z["train_tokens"], z["train_lengths"])]
    rows = []
    for p, t in zip(prompts, texts):
        lg, f = target_features(target, p + t)
        sl = slice(len(p) - 1, len(p) - 1 + len(t))
        rows.append((lg[sl], f[sl]))
    _CTX.update(meta=meta, cfg=cfg, target=target, medusa=medusa, eagle=eagle, ids=ids, prompts=prompts, texts=texts,
                train=train, target_logits=[r[0] for r in rows], feats=[r[1] for r in rows])
    return _CTX


def _chain_stats(lq_list, ctx):
    """一个 token 级的链草稿（每个位置一行 logits）-> (α T = 0, α T = 1, 每段的 agree)。"""
    b0, b1, agree = [], [], []
    for lq, lp, t in zip(lq_list, ctx["target_logits"], ctx["texts"]):
        a = np.asarray(lq).argmax(-1) == np.asarray(t)
        agree.append(a)
        b0.append(a)
        b1.append(acceptance_beta(adjust(lp, 1.0), adjust(lq, 1.0)))
    return float(np.concatenate(b0).mean()), float(np.concatenate(b1).mean()), agree


# -----------------------------------------------------------------------------
def demo1_alpha_table():
    """α 和每次调用的 token（T = 0 精确）-> dict（观察引用的数）。"""
    ctx = context()
    print_header(f"演示 1：留出的 {len(ctx['texts'])} 个提示上的 α 和每次目标调用的 token（γ = {GAMMA}）")
    target, texts = ctx["target"], ctx["texts"]
    mism = sum(int(np.sum(lp.argmax(-1) != np.asarray(t))) for lp, t in zip(ctx["target_logits"], texts))
    out, rows = {"mismatch": mism, "n_tokens": sum(len(t) for t in texts)}, []
    # Medusa：头 i 在 f_t 上预测第 t + i 个 token
    ranks = [medusa_ranks(ctx["medusa"], f, t) for f, t in zip(ctx["feats"], texts)]
    k = ctx["medusa"].k
    for i in range(k):
        a0, a1 = [], []
        for r, f, lp, t in zip(ranks, ctx["feats"], ctx["target_logits"], texts):
            n = len(t) - i - 1
            a0.append(r[i, :n] == 0)
            q = np.stack([ctx["medusa"].medusa_logits(f[j])[i] for j in range(n)])
            a1.append(topk_acceptance(adjust(lp[i + 1:], 1.0), adjust(q, 1.0), 1))
        per = round_summary([medusa_rounds(r, (1,) * (i + 1)) for r in ranks])["per_call"]
        out[f"medusa{i + 1}"] = (float(np.concatenate(a0).mean()), float(np.concatenate(a1).mean()), per)
        rows.append((f"Medusa 头 {i + 1}（链用头 1..{i + 1}）", out[f"medusa{i + 1}"][0], out[f"medusa{i + 1}"][1],
                     per, i + 1))
    per = round_summary([medusa_rounds(r, MEDUSA_TREE) for r in ranks])["per_call"]
    out["medusa_tree"] = per
    rows.append((f"Medusa 树 {MEDUSA_TREE}", "", "", per, tree_size(MEDUSA_TREE)))
    # EAGLE 式：第一步（用目标的特征）的 α；轮次按草稿自己的特征往下走
    a0, a1 = [], []
    for f, lp, t in zip(ctx["feats"], ctx["target_logits"], texts):
        q = np.stack([ctx["eagle"].eagle_step(f[j], t[j])[1] for j in range(len(t) - 1)])
        a0.append(q.argmax(-1) == np.asarray(t[1:]))
        a1.append(acceptance_beta(adjust(lp[1:], 1.0), adjust(q, 1.0)))
    per = round_summary([eagle_rounds(ctx["eagle"], f, t, GAMMA) for f, t in zip(ctx["feats"], texts)])["per_call"]
    out["eagle"] = (float(np.concatenate(a0).mean()), float(np.concatenate(a1).mean()), per)
    rows.append(("EAGLE 式（特征草稿）", out["eagle"][0], out["eagle"][1], per, GAMMA))
    # 第二步：输入是草稿自己预测的特征（和文本的 token），看它在文本的下一个 token 上猜对没有
    a2 = []
    for f, t in zip(ctx["feats"], texts):
        for j in range(len(t) - 2):
            u, _ = ctx["eagle"].eagle_step(f[j], t[j])
            a2.append(int(np.argmax(ctx["eagle"].eagle_step(u, t[j + 1])[1])) == t[j + 2])
    out["eagle2"] = float(np.mean(a2))
    rows.append(("EAGLE 式第 2 步（自己的特征）", out["eagle2"], "", "", ""))
    # 不用训练的
    skip = layer_skip_draft(target, *SKIP)
    lq = [skip.full_logits([p + t])[0, len(p) - 1:len(p) - 1 + len(t)] for p, t in zip(ctx["prompts"], texts)]
    s0, s1, agree = _chain_stats(lq, ctx)
    out["skip"] = (s0, s1, round_summary([greedy_rounds(a, GAMMA) for a in agree])["per_call"])
    ng = SparseNGramLM.fit(ctx["train"], ctx["cfg"].vocab, order=NGRAM_ORDER)
    lq = [ng.full_logits([p + t])[0, len(p) - 1:len(p) - 1 + len(t)] for p, t in zip(ctx["prompts"], texts)]
    n0, n1, agree = _chain_stats(lq, ctx)
    out["ngram"] = (n0, n1, round_summary([greedy_rounds(a, GAMMA) for a in agree])["per_call"])
    lk = round_summary([lookup_rounds(p, t, PromptLookup(LOOKUP_N), GAMMA)
                        for p, t in zip(ctx["prompts"], texts)])
    out["lookup"] = lk["per_call"]
    rows += [(f"跳层（第 {SKIP[0]}–{SKIP[0] + SKIP[1] - 1} 层）", s0, s1, out["skip"][2], GAMMA),
             (f"{NGRAM_ORDER} 元语法（同一份训练文本）", n0, n1, out["ngram"][2], GAMMA),
             (f"prompt lookup（n = {LOOKUP_N}）", "", "", lk["per_call"], GAMMA)]
    print_table(["草稿", "α T = 0", "α T = 1", "每次调用\ntoken", "草稿\n位置"],
                [(r[0], f"{r[1]:.3f}" if r[1] != "" else "—", f"{r[2]:.3f}" if r[2] != "" else "—",
                  f"{r[3]:.2f}" if r[3] != "" else "", r[4]) for r in rows])
    m1, e, lk_ = out["medusa1"], out["eagle"], out["lookup"]
    print_observations([
        f"目标在这 {out['n_tokens']} 个位置上 teacher forcing 的 argmax 和文本不同的有 {mism} 个：文本就是它的贪心续写。",
        f"EAGLE 式草稿第一步（用目标的特征）α（T = 0）{e[0]:.3f}，第二步（用它自己预测的特征）{out['eagle2']:.3f}；"
        f"Medusa 头 1 {m1[0]:.3f}，跳层草稿 {s0:.3f}："
        f"它们看的东西不同——跳层草稿用目标自己的 26 层和整段上下文，EAGLE 式只看 (f_t, x_(t+1)) 这一对、"
        f"Medusa 头只看 f_t。",
        f"每次调用的 token：EAGLE 式 {e[2]:.2f}、Medusa 链 {out[f'medusa{k}'][2]:.2f}、Medusa 树 {out['medusa_tree']:.2f}"
        f"（{tree_size(MEDUSA_TREE)} 个位置），prompt lookup {lk_:.2f}、跳层 {out['skip'][2]:.2f}、"
        f"{NGRAM_ORDER} 元语法 {out['ngram'][2]:.2f}。",
    ])
    return out


# -----------------------------------------------------------------------------
def demo2_draft_cost():
    """草稿每个 token 的代价 -> dict。"""
    ctx = context()
    cfg = ctx["cfg"]
    d, V, Vs, k = cfg.d_model, cfg.vocab, int(ctx["ids"].size), ctx["medusa"].k
    print_header("演示 2：草稿产出一个 token 要读多少参数：一层的草稿在 135M 的模型上是 lm_head 的钱")
    tgt = SMOLLM2_135M.matmul_params()                    # 目标每个 token 读的矩阵参数（含 lm_head）
    head = d * V
    layer = SMOLLM2_135M.layer_params()
    cases = [("EAGLE 式，整个词表", draft_cost("eagle", d, V)), (f"EAGLE 式，草稿词表 {Vs}", draft_cost("eagle", d, Vs)),
             ("Medusa 一个头，整个词表", draft_cost("medusa", d, V)),
             (f"Medusa 一个头，草稿词表 {Vs}", draft_cost("medusa", d, Vs)),
             ("EAGLE 原样：FC + 一个解码层 + lm_head", {"params": 2 * d * d + layer + head})]
    rows, out = [], {"target": tgt, "head": head}
    for name, c in cases:
        p = c["params"]
        hs = (d * Vs if "草稿词表" in name else head) / p
        rows.append((name, f"{p / 1e6:.2f}", f"{2 * p / 1e6:.1f}", f"{2 * p / 1e6:.1f}", f"{p / tgt:.3f}",
                     f"{hs:.0%}"))
        out[name] = p / tgt
    rows.append(("目标 SmolLM2-135M（一步）", f"{tgt / 1e6:.2f}", f"{2 * tgt / 1e6:.1f}", f"{2 * tgt / 1e6:.1f}", "1",
                 f"{head / tgt:.0%}"))
    print_table(["每个草稿 token", "参数 M", "BF16 MB", "MFLOPs", "c（字节比）", "lm_head 占"], rows)
    # 同样"一层"放在 7B 上（Vicuna-7B 和 Llama-2-7B 同形状）
    L7, t7 = LLAMA2_7B, LLAMA2_7B.matmul_params()
    one7 = 2 * L7.d_model ** 2 + L7.layer_params() + L7.d_model * L7.vocab
    out.update(one_layer_7b=one7 / t7, head_share_7b=L7.d_model * L7.vocab / one7, own=draft_params("eagle", d))
    e_full, e_one = out["EAGLE 式，整个词表"], out["EAGLE 原样：FC + 一个解码层 + lm_head"]
    print_observations([
        f"改正种子 04 演示 4 观察 3 的\"要么像 EAGLE 那样只有一层\"：它没说那一层多贵。EAGLE 的草稿 = FC + 一个解码层 + "
        f"目标的 lm_head：在 SmolLM2 上它每个 token 读 {e_one:.3f} 个目标的量（c），其中 lm_head（{head / 1e6:.1f}M 参数）"
        f"占 {head / (2 * d * d + layer + head):.0%}；同样的结构放在 7B（Llama-2-7B 的形状）上 c = {out['one_layer_7b']:.3f}、"
        f"lm_head 只占 {out['head_share_7b']:.0%}。\"只有一层\"便宜，是因为目标大、词表相对小；135M 的模型配 49152 的词表时，"
        f"一层的草稿读的差不多是一个小模型。",
        f"我们的 EAGLE 式草稿自己只有 {out['own'] / 1e6:.2f}M 参数，整个词表时 c = {e_full:.3f}，几乎全是 lm_head；"
        f"草稿词表取 {Vs} 个 token（FR-Spec 的做法）时 c = {out[f'EAGLE 式，草稿词表 {Vs}']:.3f}。",
    ])
    return out


# -----------------------------------------------------------------------------
def _clock(ctx, rounds_list, n_verify, draft_s, draft_steps):
    """模型时钟：每轮目标验证一次（n_verify 个位置）+ draft_steps 步草稿 -> (投机的总时间, 普通 decode 的总时间, token 数)。"""
    cfg = ctx["cfg"]
    spec = plain = 0.0
    toks = 0
    for rd, p, t in zip(rounds_list, ctx["prompts"], ctx["texts"]):
        L = len(p)
        for s in rd["starts"]:
            spec += modelled_step_time(step_counts(cfg, [(n_verify, L + int(s), n_verify)])) + draft_steps * draft_s(L + s)
        plain += sum(modelled_step_time(step_counts(cfg, [(1, L + j, 1)])) for j in range(len(t)))
        toks += len(t)
    return spec, plain, toks


def demo3_predicted_vs_clock(alphas):
    """式 (1) 的预测 vs 模型时钟 -> dict。"""
    ctx = context()
    cfg = ctx["cfg"]
    d, Vs, k = cfg.d_model, int(ctx["ids"].size), ctx["medusa"].k
    print_header(f"演示 3：式 (1) 用量到的 α、c 预测的加速 vs runner_lab 的模型时钟（float32，γ = {GAMMA}）")
    bytes_el = np.dtype(cfg.dtype).itemsize

    def roofline(c):
        return lambda pos: max(c["flops"] / CPU_COST["flops_per_s"], c["params"] * bytes_el / CPU_COST["bytes_per_s"])

    t_step = modelled_step_time(step_counts(cfg, [(1, 100, 1)]))      # 目标 decode 一步（位置 100 附近）
    skip_cfg = config_like(cfg, n_layers=cfg.n_layers - SKIP[1])
    skip_s = lambda pos: modelled_step_time(step_counts(skip_cfg, [(1, pos, 1)]))  # noqa: E731
    eag = roofline(draft_cost("eagle", d, Vs))
    med = roofline({"flops": k * draft_cost("medusa", d, Vs)["flops"], "params": k * draft_cost("medusa", d, Vs)["params"]})
    texts, feats = ctx["texts"], ctx["feats"]
    ranks = [medusa_ranks(ctx["medusa"], f, t) for f, t in zip(feats, texts)]
    skip_agree = alphas["skip_agree"]
    cases = [("EAGLE 式", alphas["eagle"][0], eag(100) / t_step,
              [eagle_rounds(ctx["eagle"], f, t, GAMMA) for f, t in zip(feats, texts)], GAMMA + 1, eag, GAMMA),
             ("跳层", alphas["skip"][0], skip_s(100) / t_step, [greedy_rounds(a, GAMMA) for a in skip_agree],
              GAMMA + 1, skip_s, GAMMA),
             (f"Medusa 链（{k} 个头）", None, med(100) / t_step, [medusa_rounds(r, (1,) * k) for r in ranks], k + 1, med, 1),
             (f"Medusa 树 {MEDUSA_TREE}", None, med(100) / t_step, [medusa_rounds(r, MEDUSA_TREE) for r in ranks],
              tree_size(MEDUSA_TREE) + 1, med, 1),
             (f"prompt lookup（n = {LOOKUP_N}）", None, 0.0,
              [lookup_rounds(p, t, PromptLookup(LOOKUP_N), GAMMA) for p, t in zip(ctx["prompts"], texts)],
              GAMMA + 1, lambda pos: 0.0, 0)]
    rows, out = [], {}
    for name, a, c, rds, nv, ds, steps in cases:
        spec, plain, toks = _clock(ctx, rds, nv, ds, steps)
        pred = walltime_speedup(a, GAMMA, c) if a is not None else None
        out[name] = {"alpha": a, "c": c, "pred": pred, "clock": plain / spec}
        rows.append((name, "—" if a is None else f"{a:.3f}", f"{c:.3f}", "—" if pred is None else f"{pred:.2f}",
                     f"{plain / spec:.2f}", nv))
    print_table(["草稿", "α T = 0", "c", "式 (1)\n预测", "模型时钟\n加速", "验证\n位置"], rows)
    e, lk = out["EAGLE 式"], out[f"prompt lookup（n = {LOOKUP_N}）"]
    nv = tree_size(MEDUSA_TREE) + 1
    cnt = step_counts(cfg, [(nv, 100, nv)])
    tc, tb = cnt["flops"] / CPU_COST["flops_per_s"], cnt["bytes"] / CPU_COST["bytes_per_s"]
    out["tree_compute_s"], out["tree_bytes_s"] = tc, tb
    tree = out[f"Medusa 树 {MEDUSA_TREE}"]
    print_observations([
        f"EAGLE 式：式 (1) 用第一步的 α = {e['alpha']:.3f}、c = {e['c']:.3f} 预测 {e['pred']:.2f}×，模型时钟上 "
        f"{e['clock']:.2f}×（演示 1：第二步起草稿用自己预测的特征，α 只有 {alphas['eagle2']:.3f}，式 (1) 假设每步一样）。",
        f"跳层草稿的 α 高（{out['跳层']['alpha']:.3f}），但它一步要 c = {out['跳层']['c']:.3f} 个目标的时间：{out['跳层']['clock']:.2f}×。",
        f"Medusa 的树用 {nv} 个位置验证一次：这台 CPU 的模型上算力要 {tc * 1e3:.0f} ms、读权重只要 {tb * 1e3:.0f} ms"
        f"（位置 100 附近），验证变成受算力限制，模型时钟 {tree['clock']:.2f}×；同样的头排成链 "
        f"{out[f'Medusa 链（{k} 个头）']['clock']:.2f}×。",
        f"训练出来的草稿在这台 CPU 上买到的：EAGLE 式 {e['clock']:.2f}×、Medusa 链 "
        f"{out[f'Medusa 链（{k} 个头）']['clock']:.2f}×，不用训练、不读权重的 prompt lookup {lk['clock']:.2f}×。",
    ])
    return out


# -----------------------------------------------------------------------------
def demo4_papers(alphas):
    """论文报的接受长度 vs 我们的 -> None。"""
    ctx = context()
    print_header("演示 4：论文报的接受长度和我们的放在一起（模型差五十倍以上：只并列，不比较）")
    rows = [(a, b, c, t, v) for a, b, c, t, v in PAPERS]
    rows += [("这里：EAGLE 式", "SmolLM2-135M", "6 个留出提示", "T = 0", f"每次调用 {alphas['eagle'][2]:.2f}"),
             ("这里：Medusa 树", "SmolLM2-135M", "6 个留出提示", "T = 0", f"每次调用 {alphas['medusa_tree']:.2f}")]
    print_table(["方法", "目标模型", "文本", "温度", "报的数"], rows)
    m = ctx["meta"]
    print_observations([
        f"论文的草稿在 7B–33B 的目标上训练（EAGLE：ShareGPT 的 68k 段对话；Medusa-2：自蒸馏），我们的在 135M 的目标上、"
        f"用 {m['train_tokens']} 个自蒸馏 token 训练了 {m['epochs']} 个 epoch，草稿词表 {m['vocab_n']} 个 token："
        f"模型、数据量、文本都不同，数字不能拿来说谁好。",
    ])


# -----------------------------------------------------------------------------
if __name__ == "__main__":
    a = demo1_alpha_table()
    demo2_draft_cost()
    ctx = context()
    skip = layer_skip_draft(ctx["target"], *SKIP)
    a["skip_agree"] = [skip.full_logits([p + t])[0, len(p) - 1:len(p) - 1 + len(t)].argmax(-1) == np.asarray(t)
                       for p, t in zip(ctx["prompts"], ctx["texts"])]
    demo3_predicted_vs_clock(a)
    demo4_papers(a)
