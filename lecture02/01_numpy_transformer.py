"""
=============================================================================
CS349E · 第 2 讲 · 01_numpy_transformer.py —— 一个 Llama 形状的 numpy transformer：一次前向逐个算子走一遍
=============================================================================

【这个脚本要回答的问题】
演示 1：一次前向到底做了哪些运算？把第 0 层逐个算子手写一遍（RMSNorm → q/k/v 投影 → RoPE → GQA 注意力 → o 投影 →
残差 → RMSNorm → SwiGLU FFN → 残差），打印每一步的输入、权重、输出形状；手写版和 transformer_lab 的模型输出一样。
演示 2：带 KV cache 的增量 decode 和"每一步把整个前缀重算一遍"给出同样的 logits 吗？打印最大绝对差 max |Δ| 是否小于界 DELTA_BOUND，
以及两种做法贪心选出的 token 是否处处相同。

【怎么读输出】形状写成 [批 B, 位置数 n, …]；"账本里的名字"是 transformer_lab 的 Counter / analytic_ops 里这个算子的行名
（02 脚本逐行核对它们的 FLOPs 和字节）。两种算法的差 max |Δ| 只是 float64 的舍入（机器精度 ε ≈ 2.2e-16），它的具体数字
随 numpy 链接的 BLAS 和 CPU 而变（加法顺序不同），所以只打印它是否小于一个留足余量的界 DELTA_BOUND = 1e-13。

【模型的假设（务必看）】一个随机初始化的小模型（配置是 transformer_lab.LEC2_CFG：8 个 query 头、2 个 KV 头，GQA 组大小 4），不是训练过的模型；
它只用来看形状和核对"缓存 == 重算"，输出的 token 没有语言上的意义。全部用 **float64** 计算（dtype 会打印出来）。
提示的 token 用 rng.random() 的均匀数乘词表大小取整得到（固定种子）。

【运行】python3 01_numpy_transformer.py （约 0.3 秒）

【依赖】numpy；本目录的 transformer_lab（NumpyTransformer、init_params、LEC2_CFG、random_tokens）、ledger_lab（MATMUL_OPS）；
../lecture01 的 console。
"""
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
for sub in ("lecture01", "lecture02"):
    sys.path.insert(0, os.path.join(HERE, "..", sub))

from console import print_header, print_observations, print_table  # noqa: E402
from transformer_lab import LEC2_CFG, NumpyTransformer, init_params, random_tokens, softmax  # noqa: E402
from ledger_lab import MATMUL_OPS  # noqa: E402

# ---- 这一讲的小模型：transformer_lab.LEC2_CFG（Llama 的形状，尺寸是随意选的小数字；02、04 脚本用同一个）----
CFG = LEC2_CFG
SEED = 0             # 参数的随机种子
PROMPT_SEED = 1      # 提示 token 的随机种子
B, N_PROMPT = 2, 16  # 演示用的批大小、提示长度
N_DECODE = 32        # 演示 2 贪心生成的 token 数
# 两种算法之差的界（约定）：float64 的舍入差实测在 1e-15 量级，具体数字随 BLAS / CPU 变；界留了一个多数量级的余量
DELTA_BOUND = 1e-13


def shp(a):
    return "[" + ", ".join(str(s) for s in a.shape) + "]"


def forward_by_hand(P, cfg, toks, log=None):  # [B, n] -> [B, n, V]
    """
    不用缓存、逐个算子手写一次前向（picoGPT 的写法），返回 logits。log 不为 None 时，把第 0 层和层外的每一步记成
    (步骤, 账本里的名字, 输入形状, 权重形状, 输出形状, 说明)。

    这是本脚本要讲的东西本身，所以写在脚本里；和 transformer_lab 的写法有意不同（不把 q/k/v 拼成一个矩阵；
    GQA 把每个 KV 头复制 G 份再按普通多头注意力算），用来独立核对 NumpyTransformer.forward。
    RoPE 的约定和 transformer_lab 一样：把 head_dim 分成前后两半 (x1, x2)，旋转成 (x1·cos − x2·sin, x2·cos + x1·sin)。
    """
    Bn, n = toks.shape
    H, Hkv, hd, G = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.n_heads // cfg.n_kv_heads
    rec = log.append if log is not None else (lambda row: None)

    def rmsnorm(x, g):  # [..., d] -> [..., d]
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.norm_eps) * g

    half = hd // 2
    ang = np.arange(n)[:, None] * cfg.rope_theta ** (-np.arange(half) / half)[None, :]   # [n, hd/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]                         # [n, 1, hd/2]

    def rope(x):  # [B, n, h, hd] -> [B, n, h, hd]
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    mask = np.triu(np.full((n, n), -np.inf), k=1)                                       # [n, n]，上三角 −∞
    x = P["embed"][toks]                                                                 # [B, n, d]
    rec(("词嵌入查表", "embed", shp(toks), shp(P["embed"]), shp(x), "每个 token 取词嵌入的一行"))
    for li, L in enumerate(P["layers"]):
        r = rec if li == 0 else (lambda row: None)
        h = rmsnorm(x, L["attn_norm"])
        r(("RMSNorm", "attn_norm", shp(x), shp(L["attn_norm"]), shp(h), "x / rms(x) · g"))
        q = (h @ L["wq"]).reshape(Bn, n, H, hd)
        r(("q 投影", "q_proj", shp(h), shp(L["wq"]), shp(q), f"拆成 {H} 个头 × {hd}"))
        k = (h @ L["wk"]).reshape(Bn, n, Hkv, hd)
        r(("k 投影", "k_proj", shp(h), shp(L["wk"]), shp(k), f"只有 {Hkv} 个 KV 头（GQA）"))
        v = (h @ L["wv"]).reshape(Bn, n, Hkv, hd)
        r(("v 投影", "v_proj", shp(h), shp(L["wv"]), shp(v), "同上"))
        q, k = rope(q), rope(k)
        r(("RoPE（q 和 k）", "rope", shp(q) + " " + shp(k), "-", "形状不变", "按位置旋转，v 不转"))
        kr = np.repeat(k, G, axis=2).transpose(0, 2, 1, 3)                               # [B, H, n, hd]
        vr = np.repeat(v, G, axis=2).transpose(0, 2, 1, 3)
        qt = q.transpose(0, 2, 1, 3)                                                     # [B, H, n, hd]
        s = qt @ kr.transpose(0, 1, 3, 2) / math.sqrt(hd) + mask                         # [B, H, n, n]
        r(("打分 QKᵀ/√hd", "attn_scores", shp(qt) + "·" + shp(kr), "-", shp(s),
           f"每个 KV 头给 {G} 个 query 头共用；加因果遮罩"))
        a = softmax(s)
        r(("softmax", "attn_softmax", shp(s), "-", shp(a), "沿最后一维（被看的位置）"))
        o = a @ vr                                                                       # [B, H, n, hd]
        r(("加权和 A·V", "attn_av", shp(a) + "·" + shp(vr), "-", shp(o), "每个头得到 hd 维"))
        o = o.transpose(0, 2, 1, 3).reshape(Bn, n, H * hd)
        y = o @ L["wo"]
        r(("o 投影", "o_proj", shp(o), shp(L["wo"]), shp(y), "各头拼起来再投影回 d"))
        x = x + y
        r(("残差", "attn_residual", shp(y), "-", shp(x), "x ← x + 注意力输出"))
        h = rmsnorm(x, L["mlp_norm"])
        r(("RMSNorm", "mlp_norm", shp(x), shp(L["mlp_norm"]), shp(h), ""))
        gate = h @ L["w_gate"]
        r(("gate 投影", "mlp_gate", shp(h), shp(L["w_gate"]), shp(gate), ""))
        up = h @ L["w_up"]
        r(("up 投影", "mlp_up", shp(h), shp(L["w_up"]), shp(up), ""))
        act = gate / (1.0 + np.exp(-gate)) * up
        r(("SwiGLU 激活", "mlp_act", shp(gate) + "·" + shp(up), "-", shp(act), "SiLU(gate) · up"))
        y = act @ L["w_down"]
        r(("down 投影", "mlp_down", shp(act), shp(L["w_down"]), shp(y), ""))
        x = x + y
        r(("残差", "mlp_residual", shp(y), "-", shp(x), "x ← x + FFN 输出"))
    h = rmsnorm(x, P["final_norm"])
    n_layer_steps = len(log) - 1 if log is not None else 0
    rec(("最后的 RMSNorm", "final_norm", shp(x), shp(P["final_norm"]), shp(h),
         f"（此前 {cfg.n_layers} 层各重复上面 {n_layer_steps} 步）"))
    logits = h @ P["lm_head"]
    rec(("lm_head", "lm_head", shp(h), shp(P["lm_head"]), shp(logits), "每个位置对词表的打分（不和词嵌入共享）"))
    return logits


# ---------------------------------------------------------------------------
# 演示 1：一次前向，逐个算子
# ---------------------------------------------------------------------------
def demo1_one_forward_pass():
    print_header(f"演示 1：一次前向逐个算子（B = {B} 个序列 × n = {N_PROMPT} 个位置，只列第 0 层和层外的步骤）")
    mc = CFG.to_model_config()
    P = init_params(CFG, SEED)
    toks = random_tokens(CFG, B, N_PROMPT, PROMPT_SEED)
    log = []
    by_hand = forward_by_hand(P, CFG, toks, log)
    lab = NumpyTransformer(P, CFG).forward(toks)
    delta = float(np.abs(by_hand - lab).max())
    n_param_arrays = (P["embed"].size + P["final_norm"].size + P["lm_head"].size
                      + sum(w.size for L in P["layers"] for w in L.values()))
    print(f"配置：词表 {CFG.vocab}、d = {CFG.d_model}、{CFG.n_layers} 层、{CFG.n_heads} 个 query 头 / {CFG.n_kv_heads} 个 KV 头"
          f"（组大小 G = {CFG.group}）、head_dim = {CFG.head_dim}、")
    print(f"FFN 中间维 {CFG.d_ff}；参数 {n_param_arrays:,} 个；数据类型 {lab.dtype}")
    print_table(["步骤", "账本里的名字", "输入形状", "权重形状", "输出形状"], [list(r[:5]) for r in log])
    print("\n各步在做什么：")
    print_table(["账本里的名字", "说明"], [[r[1], r[5]] for r in log if r[5]])
    n_layer_matmuls = sum(1 for r in log if r[1] in MATMUL_OPS and r[1] != "lm_head")
    print_observations([
        f"一层里有 {len(log) - 3} 步；其中只有 {n_layer_matmuls} 个带权重的矩阵乘（q/k/v/o 投影、gate/up/down），加上层外的 lm_head，"
        f"就是账本里的 MATMUL_OPS。注意力的打分和加权和也是矩阵乘，但乘的是激活和 KV，不读权重。",
        f"GQA：k/v 投影的输出只有 {CFG.n_kv_heads} 个头（{CFG.n_kv_heads * CFG.head_dim} 维），q 有 {CFG.n_heads} 个头"
        f"（{CFG.n_heads * CFG.head_dim} 维）；每个 KV 头给 {CFG.group} 个 query 头共用。所以 KV cache 只要存 "
        f"{CFG.n_kv_heads}/{CFG.n_heads} 的头（04 脚本）。",
        f"打分矩阵是 [B, 头, n, n]：它随位置数平方增长，而投影只随 n 线性增长——长上下文时注意力的份量越来越大（03 脚本）。",
        f"逐个算子手写的前向和 transformer_lab.NumpyTransformer（q/k/v 拼成一个矩阵、按组摞起来算注意力）输出的 logits "
        + (f"最大差 < {DELTA_BOUND:.0e}" if delta < DELTA_BOUND else f"最大差超过了 {DELTA_BOUND:.0e}！")
        + f"：同一个模型，只是运算顺序不同带来的舍入差（dtype = {lab.dtype}；具体数字随 BLAS 变，所以只给界）。",
        f"参数个数 {n_param_arrays:,} 和 llm_math 按结构数出来的 {mc.params():,} 一致：" + ("是" if n_param_arrays == mc.params() else "否") + "。",
    ])
    return {"n_layer_steps": len(log) - 3, "n_layer_matmuls": n_layer_matmuls, "delta_by_hand": delta, "dtype": str(lab.dtype),
            "n_params": n_param_arrays, "n_params_formula": mc.params(),
            "shapes": {r[1]: r[4] for r in log}}


# ---------------------------------------------------------------------------
# 演示 2：KV cache 增量 decode == 每步重算整个前缀
# ---------------------------------------------------------------------------
def demo2_cache_equals_recompute():
    print_header(f"演示 2：KV cache 增量 decode vs 每一步重算整个前缀（B = {B}，提示 {N_PROMPT} 个 token，贪心生成 {N_DECODE} 个）")
    model = NumpyTransformer(init_params(CFG, SEED), CFG)
    prompt = random_tokens(CFG, B, N_PROMPT, PROMPT_SEED)

    # 做法 A：带缓存。第一次前向喂整个提示，之后每次只喂上一步选出的 1 个 token
    cache = model.new_cache(B)
    logits = model.forward(prompt, cache)[:, -1]                 # [B, V]
    seq_a, logits_a = prompt, [logits]
    for _ in range(N_DECODE - 1):
        nxt = logits.argmax(-1)[:, None]                         # [B, 1]
        seq_a = np.concatenate([seq_a, nxt], axis=1)
        logits = model.forward(nxt, cache)[:, -1]
        logits_a.append(logits)
    seq_a = np.concatenate([seq_a, logits.argmax(-1)[:, None]], axis=1)

    # 做法 B：不用缓存。每一步把到目前为止的整个序列重新算一遍，取最后一个位置
    seq_b, logits_b = prompt, []
    for _ in range(N_DECODE):
        lg = model.forward(seq_b)[:, -1]
        logits_b.append(lg)
        seq_b = np.concatenate([seq_b, lg.argmax(-1)[:, None]], axis=1)

    la, lb = np.stack(logits_a, 1), np.stack(logits_b, 1)        # [B, N_DECODE, V]
    step_delta = np.abs(la - lb).max(axis=(0, 2))                # 每一步的 max |Δ|
    top2 = np.sort(lb, axis=-1)[..., -2:]                        # 重算那边每步最大的两个 logit
    gap = float((top2[..., 1] - top2[..., 0]).min())             # 贪心选择离"打平"最近的一次
    rows = []
    for i in (0, 1, 3, 7, 15, 31):
        rows.append([i + 1, N_PROMPT + i, " ".join(str(t) for t in seq_a[:, N_PROMPT + i]),
                     " ".join(str(t) for t in seq_b[:, N_PROMPT + i]), "是" if step_delta[i] < DELTA_BOUND else "否",
                     f"{np.abs(lb[:, i]).max():.2f}"])
    print_table(["第几个新 token", "位置", "带缓存选出的（2 个序列）", "重算选出的", f"logits max |Δ| < {DELTA_BOUND:.0e}",
                 "max |logit|"], rows)
    max_delta = float(step_delta.max())
    max_logit = float(np.abs(lb).max())
    eps = float(np.finfo(la.dtype).eps)
    rel_bound = DELTA_BOUND / max_logit / eps                    # 界换算成"相对 logits 的量级是 ε 的几倍"
    same = bool((seq_a == seq_b).all())
    within = max_delta < DELTA_BOUND
    print_observations([
        f"{N_DECODE} 步、{B} 个序列、每步 {CFG.vocab} 个 logits：带缓存和重算的差 max |Δ| "
        + (f"每一步都 < {DELTA_BOUND:.0e}" if within else f"有的步超过了 {DELTA_BOUND:.0e}！")
        + f"。logits 本身（所有 {N_DECODE} 步）|logit| 最大 {max_logit:.2f}，所以差相对最大的 logit < {DELTA_BOUND:.0e} / {max_logit:.2f} ≈ "
        f"{rel_bound:.0f} ε（float64 机器精度 ε = {eps:.2g}）"
        "——只是加法顺序不同的舍入；具体是几个 ε 随 BLAS 和 CPU 变，这里只给界。",
        f"两种做法贪心选出的 {B} × {N_DECODE} 个 token 完全相同：" + ("是" if same else "否") + "。"
        f"每一步最大和第二大的 logit 至少差 {gap:.2g}，"
        + ("比舍入差的界大得多，舍入改变不了 argmax。" if gap > 1e3 * DELTA_BOUND else "和舍入差的界相比并不大！")
        + "缓存没有改变模型算的东西，只是不再重复算已经算过的 K 和 V。",
        "这是后面所有\"精确\"结论的前提：回滚（第 6 讲 01）、投机解码不改变分布（第 6 讲 03）都假设增量 decode 和一次算完给出同样的分布。"
        "用 bfloat16 这类低精度时，舍入误差大好几个数量级，两种做法的差也跟着变大，可能在 logits 很接近的位置选出不同的 token；"
        "这里用 float64 把这件事排除掉。",
    ])
    return {"max_delta": max_delta, "bound": DELTA_BOUND, "max_logit": max_logit, "rel_bound_eps": rel_bound,
            "eps": eps, "top2_gap": gap, "tokens_agree": same, "dtype": str(la.dtype), "n_compared": int(la.size)}


if __name__ == "__main__":
    demo1_one_forward_pass()
    demo2_cache_equals_recompute()
