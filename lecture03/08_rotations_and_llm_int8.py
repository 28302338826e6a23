"""
=============================================================================
CS349E · 第 3 讲 · 08_rotations_and_llm_int8.py —— 把离群值转掉、或者分出去：QuaRot 的旋转和 LLM.int8()
=============================================================================

【这个脚本要回答的问题】
演示 1：计算不变性：折叠 RMSNorm 的权重、残差流乘一个 576 阶的 Hadamard 矩阵、w_down 前的在线 Hadamard、V/O 的
        逐头 Hadamard，模型的 logits 只差 float64 的舍入；漏了在线的那一半就不是同一个模型。
演示 2：旋转对 07 找到的离群通道做了什么：每个矩阵乘的输入的通道 max/中位数，旋转前后；第一个位置的大激活。
演示 3：W4A4、W4A8（激活每 token）和 W8A8：不旋转、只旋转残差流、加在线 Hadamard、加 V/O，模型的 KL 和 top-1。
演示 4：LLM.int8()：每层有几个特征维 |x| ≥ 6；W8A8 把它们留在 16 位前后的 KL；多出来的字节和 16 位的乘法占多少。

【怎么读输出】
- 离群程度 = 每个通道的 max|x|（在所有 token 上）里最大的 / 中位数（07 的同一个量）。"真正的输入"：
  wq/wk/wv 的是 RMSNorm(x)·g（07 的"注意力输入"），折叠以后是 x/rms(x)（g 进了权重），旋转以后是 x/rms(x)·Q。
- KL = 平均 KL(p_原 ‖ p_量化)（nats/位置），只在评估文本生成的位置上；top-1 = 两个模型 argmax 相同的位置的比例。
  "原模型"是装进来的文件本身（反量化成 float64）。
- W4：权重 INT4-g32（对称，每 32 个一个 FP16 scale；07 的"就近舍入 INT4-g32"）；W8：INT8 每输出通道；
  A4 / A8：每个矩阵乘的输入每 token 一个 FP16 scale 的对称 INT4 / INT8（QuaRot 的激活量化，不裁剪）；A16：激活不量化。
  lm_head（和词嵌入）不量化；量化的是每层的 7 个矩阵和它们的输入。

【模型的假设（务必看）】
- 模型：SmolLM2-135M-Instruct，float64（07 的理由：打印的数不随 BLAS 变）。**文件本身已经是 4 位的**（每个矩阵 Q4_1）：
  这里的 KL 量的是在"反量化出来的 float 模型"上再量化一次的代价，不是从 BF16 量化的代价。旋转以后权重不再落在
  Q4_1 的刻度上，W4 的那一次舍入对旋转和不旋转的模型都是"第二次"。
- 文本：07 的两段文本（同一个提示、同一个种子，decode_lab.sample_from_prompts）：校准文本 N_SEQ × 29 个位置上量激活
  （演示 2、4 的统计，含提示的位置），评估文本 N_SEQ 条 × N_NEW = 12 个生成的位置上量 KL。
- 前向：评估和校准的 8 条序列的提示相同，先喂一次提示（一条）、把它的 KV cache 复制给 8 条、再一次喂 8 条的生成部分
  （同一个模型的 forward 和缓存，比 8 条整段各算一遍快一倍）。激活按每 token 量化，和怎么分批无关；LLM.int8() 的离群维
  每次矩阵乘按这一批 token 找（提示一次、生成部分一次）。KV cache 不量化（QuaRot 也量化它；这里只看矩阵乘的输入）。
- 旋转：Q = 576 阶的随机化 Hadamard（H36 ⊗ H16，每行一个随机符号，种子 ROT_SEED）；对照：同一个种子的随机正交矩阵
  （只在演示 2 里：它的输入 = 旋转前的输入·Q，演示 1 的不变性保证、测试核对）。在线的：w_down 前 1536 阶的 Hadamard
  （H12 ⊗ H128），V/O 的逐头 64 阶 Hadamard（Sylvester）。QuaRot 还有一个跨 9 个头的在线 Hadamard：9 阶的不存在，不做。
- 不旋转的模型量化的是它真正的输入（RMSNorm(x)·g），权重是原来的 W；旋转的模型 g 折进了权重（fold_norms）。
- 权重量化之前先存成 float32（STORE；文件反量化出来的本来就是 float32 的值）：Hadamard 旋转后的权重里有些组的
  max|w|/7 恰在两个 FP16 刻度的正中，不这样做，旋转时求和顺序的 1e-16 之差（换一个 BLAS）就会改变打印的 KL。

【运行】python3 08_rotations_and_llm_int8.py （空闲的 2 核机器、一个 BLAS 线程：约 53 秒，和种子 04 背靠背三对，
  比值中位数 3.4 倍（3.3–4.3：种子 04 自己在 12–16 秒之间变）；整个脚本用 float64，内存峰值约 5.5 GB；第一次运行先下载模型）

【依赖】numpy；本目录的 rotation_lab（fold_norms、rotate_params、rotate_down_input、rotate_heads、hadamard、
random_orthogonal）、actquant_lab（MatmulInputHook、PerToken、Int8Decomposition、input_scales、outlier_dims）、
outlier_lab（outlier_ratio）、quant_lab（quantize_matrix、log_softmax）；../lecture02 的 real_model_lab（load_gguf）、
hub_lab（gguf_path_or_exit）、transformer_lab（NumpyTransformer）；../lecture06 的 decode_lab（sample_from_prompts）；
../lecture01 的 console。
"""
import os
import sys

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
for sub in ("lecture01", "lecture02", "lecture06", "prereq3"):
    sys.path.insert(0, os.path.join(HERE, "..", sub))

from actquant_lab import (INT8_THRESHOLD, Int8Decomposition, MatmulInputHook, PerToken, input_scales,  # noqa: E402
                          outlier_dims, systematic_dims)
from console import fmt_bound, print_header, print_note, print_observations, print_table  # noqa: E402
from decode_lab import TransformerLM, sample_from_prompts  # noqa: E402
from hub_lab import gguf_path_or_exit  # noqa: E402
from outlier_lab import outlier_ratio  # noqa: E402
from quant_lab import LAYER_MATRICES, SCHEMES, log_softmax, quantize_matrix  # noqa: E402
from real_model_lab import load_gguf  # noqa: E402
from rotation_lab import (fold_norms, hadamard_base, hadamard_kron, random_orthogonal, rotate_down_input,  # noqa: E402
                          rotate_heads, rotate_params)
from transformer_lab import NumpyTransformer  # noqa: E402

# ---- 实验的设定（07 的文本设定；旋转的种子是选的，不是事实）----
PROMPT = "Write a short story about a robot."
N_SEQ, N_NEW, TEMP, TEXT_SEED = 8, 12, 1.0, 0      # 和 07 相同：一次生成 2·N_SEQ 条，前一半校准、后一半评估
DTYPE = "float64"
ROT_SEED = 0
N_INV = 2                # 演示 1 比 logits 用的评估序列条数（各 N_NEW 个位置）
ABS_BOUND = 1e-11        # 演示 1 打印的上界：float64 下折叠、旋转只改舍入（实测 1e-13 量级，随 BLAS 的内核变，所以只印上界；
                         # 和 tests/test_rotation_lab.py 的相对界 1e-11 同一个推导：d·u 量级再放大几十倍）
STORE = np.float32      # 量化前权重先存成的类型（quantize_layers 的说明：让打印的数不随 BLAS 的求和顺序变）
OPS = ("qkv", "o_proj", "gate_up", "down")
OP_ZH = {"qkv": "注意力输入", "o_proj": "wo 输入", "gate_up": "FFN 输入", "down": "w_down 输入"}
OUT_DIM = {"qkv": lambda c: (c.n_heads + 2 * c.n_kv_heads) * c.head_dim, "o_proj": lambda c: c.d_model,
           "gate_up": lambda c: 2 * c.d_ff, "down": lambda c: c.d_model}


# ---------------------------------------------------------------------------
# 共用的计算
# ---------------------------------------------------------------------------
def shared_prompt_logits(model, toks, start, hook=None, want_all=False):
    """
    一批提示相同的序列的 logits：提示喂一次、缓存复制给每一条，再一次喂生成部分 -> [条数, 位置, V]。

    want_all=False：只要"下一个是生成的 token"的位置（第 start − 1 .. 倒数第二个，N_NEW 个）；
    True：提示的 start 个位置（一条）+ 生成部分（每条），只为了让钩子看到每个位置（校准的统计）。
    """
    toks = np.asarray(toks)
    n, S = toks.shape
    if not np.all(toks[:, :start] == toks[:1, :start]):
        raise ValueError("这一批序列的提示部分不相同")
    model.matmul_hook = hook
    try:
        c1 = model.new_cache(1, S)
        first = model.forward(toks[:1, :start], c1)[:, -1]            # [1, V]
        cache = c1.repeat(n)                                          # 提示的缓存复制给每一条
        rest = model.forward(toks[:, start:] if want_all else toks[:, start:-1], cache)
    finally:
        model.matmul_hook = None
    if want_all:
        return rest
    return np.concatenate([np.repeat(first[:, None], n, axis=0), rest], axis=1)


def ref_logprobs(logits):
    lp = log_softmax(np.asarray(logits, dtype=np.float64))
    return np.exp(lp), lp


def kl_top1(ref, logits):
    """每条序列的平均 KL(p_原 ‖ p_量化) 和 top-1 一致率 -> (kl [条数], agree)。ref = ref_logprobs(原模型的 logits)。"""
    p, lp = ref
    lq = log_softmax(np.asarray(logits, dtype=np.float64))
    kl = (p * (lp - lq)).sum(axis=-1)
    return kl.mean(axis=1), float((lp.argmax(-1) == lq.argmax(-1)).mean())


def quantize_layers(P, scheme):
    """
    就近舍入量化每层的 7 个矩阵 -> (P'（结构同 P）, 相对误差 ‖W − W'‖ / ‖W‖（所有矩阵合起来）)。

    量化之前每个矩阵先舍入到 float32（STORE）：文件反量化出来的权重本来就是 float32 的值（不变）；旋转以后的权重
    也先这样存一份再量化。不这样做，Hadamard 旋转后的 wo、w_down 里每个矩阵有几十个 32 个一组的组，max|w| / 7 恰好
    落在两个 FP16 刻度的正中，旋转的求和顺序差 1e-16 就把 scale 舍到另一边（整组 32 个数都变）：同一个 Q 的稠密写法
    和 Kronecker 写法给出的 W4A4 的 KL 差 3%。存成 float32 以后，差 1e-16 的两个数舍成同一个 float32（测试核对）。
    """
    P2, e2, w2 = dict(P), 0.0, 0.0
    P2["layers"] = []
    for L in P["layers"]:
        new = {}
        for m in LAYER_MATRICES:
            w = L[m].astype(STORE).astype(np.float64)
            new[m] = quantize_matrix(w, scheme)[0]
            e2 += float(((new[m] - w) ** 2).sum())
            w2 += float((w ** 2).sum())
        P2["layers"].append(dict(L, **new))
    return P2, (e2 / w2) ** 0.5


def paired(kl_a, kl_b):
    """同一批序列上 KL 之差 a − b -> (平均, 标准误, 平均 / 标准误)：每条序列一个差值，ddof = 1（07 的做法）。"""
    d = np.asarray(kl_a) - np.asarray(kl_b)
    se = float(d.std(ddof=1) / np.sqrt(d.size))
    return float(d.mean()), se, float(d.mean()) / se if se > 0 else float("inf")


def dims_zh(dims):
    """[247] -> "1 个（第 247 维）"；[] -> "0 个"。"""
    return f"{len(dims)} 个" + (f"（第 {'、'.join(map(str, dims))} 维）" if dims else "")


def setup():
    """装模型、生成 07 的两段文本、原模型在评估文本上的分布、校准文本上每个矩阵乘的真正输入 -> dict。"""
    P, cfg, tok = load_gguf(dtype=np.dtype(DTYPE))
    P["lm_head"] = np.ascontiguousarray(P["lm_head"])      # 共享的 lm_head 是词嵌入的转置视图：连续一份，建模型快
    model = TransformerLM(P, cfg)
    ids = tok.chat(PROMPT)
    new = sample_from_prompts(model, [ids], 2 * N_SEQ, N_NEW, TEMP, np.random.default_rng(TEXT_SEED))
    toks = np.array([np.concatenate([ids, s]) for s in new])
    ctx = {"P": P, "cfg": cfg, "start": len(ids), "calib_toks": toks[:N_SEQ], "eval_toks": toks[N_SEQ:]}
    ctx["ref_logits"] = shared_prompt_logits(model, ctx["eval_toks"], ctx["start"])
    ctx["ref"] = ref_logprobs(ctx["ref_logits"])
    rec = {}
    shared_prompt_logits(model, ctx["calib_toks"], ctx["start"], MatmulInputHook(input_scales(P, cfg), record=rec),
                         want_all=True)
    ctx["calib"] = {k: np.concatenate(v, axis=0) for k, v in rec.items()}     # {(op, 层): [行, 通道]}
    ctx["model"] = model
    return ctx


# ---------------------------------------------------------------------------
# 演示 1：计算不变性
# ---------------------------------------------------------------------------
def demo1_invariance(ctx):
    P, cfg = ctx["P"], ctx["cfg"]
    toks, start = ctx["eval_toks"], ctx["start"]
    print_header(f"演示 1：计算不变性——折叠、旋转以后还是同一个模型吗（评估文本的前 {N_INV} 条，float64）")
    Q = hadamard_kron(cfg.d_model, np.random.default_rng(ROT_SEED))        # 不造出整个矩阵（rotation_lab.Kron）
    Hd, Hh = hadamard_kron(cfg.d_ff), hadamard_kron(cfg.head_dim)
    Pf, cf = fold_norms(P, cfg)
    Pr, _ = rotate_params(Pf, cf, Q)
    Prd, _ = rotate_down_input(Pr, cf, Hd)
    Pall, _ = rotate_heads(Prd, cf, Hh)
    ref = ctx["ref_logits"]
    scale = float(np.abs(ref[:N_INV]).max())
    online = {"down": Hd}
    model = NumpyTransformer(Pall, cf)
    rows, res = [], {"max_logit": scale}
    cases = (("all", "折叠、残差流乘 H576、w_down 前在线乘 H1536、V/O 乘 H64", MatmulInputHook(online=online)),
             ("no_online", "同上，但漏了在线乘 H1536 的那一半", None))
    for key, zh, hook in cases:       # 前 N_INV 条评估序列就够看出"只差舍入"和"不是同一个模型"
        d = float(np.abs(shared_prompt_logits(model, toks[:N_INV], start, hook) - ref[:N_INV]).max())
        res[key] = d
        rows.append([zh, fmt_bound(d, ABS_BOUND), fmt_bound(d / scale, 1e-12)])
    print_table(["模型（和装进来的原模型比）", "max|Δlogit|", "÷ max|logit|"], rows)
    bases = {n: hadamard_base(n) for n in (cfg.d_model, cfg.d_ff, cfg.head_dim)}
    res["ortho"] = {M.n: float(np.abs(M.dense() @ M.dense().T - np.eye(M.n)).max()) for M in (Q, Hd, Hh)}
    res["bases"], res["tied"] = bases, (cfg.tied, cf.tied)
    res["extra_params"] = cfg.d_model * cfg.vocab
    K, p = bases[cfg.d_model]
    Kd, pd = bases[cfg.d_ff]
    print_observations([
        f"折叠和旋转只改舍入：logits 之差 {fmt_bound(res['all'], ABS_BOUND)}（logits 最大 {scale:.1f}）。"
        f"漏了 w_down 前在线乘 H 的那一半（w_down 已经换成 Hᵀ·w_down），logits 差 {res['no_online']:.1f}："
        "不是同一个模型了。",
        f"Q 是 {cfg.d_model} = {K} × {p} 阶的 Hadamard 矩阵 H{K} ⊗ H{p}（{K} 阶的用 Paley II、q = {K // 2 - 1} 造，"
        f"{p} 阶的用 Sylvester），每行乘一个随机符号；w_down 前的是 {Kd} × {pd}（Paley I、q = {Kd - 1}）。"
        f"QuaRot 的 get_hadK 给这两个阶选的底也是 {K} 和 {Kd}。max|Q Qᵀ − I| {fmt_bound(res['ortho'][cfg.d_model], 1e-13)}。",
        f"SmolLM2 的 lm_head 和词嵌入共享；最后的 RMSNorm 的权重折进 lm_head 以后就不共享了（tied: {cfg.tied} → "
        f"{cf.tied}），多存 {res['extra_params']:,} 个参数。",
    ])
    ctx.update({"Q": Q, "Hd": Hd, "Hh": Hh, "cr": cf, "Pf": Pf, "Pr": Pr, "Prd": Prd, "Pall": Pall, "model_all": model})
    return res


# ---------------------------------------------------------------------------
# 演示 2：离群通道，旋转前后
# ---------------------------------------------------------------------------
def demo2_outliers(ctx):
    P, cfg, A = ctx["P"], ctx["cfg"], ctx["calib"]
    nL = cfg.n_layers
    print_header(f"演示 2：每个矩阵乘的真正输入——通道 max|x| 的最大 / 中位，旋转前后（校准文本，{nL} 层）")
    R = random_orthogonal(cfg.d_model, np.random.default_rng(ROT_SEED))
    Q, Hd, Hh = ctx["Q"], ctx["Hd"], ctx["Hh"]
    sd = np.sqrt(cfg.d_model)
    blk = np.kron(np.eye(cfg.n_heads), Hh.dense())                  # 逐头的 H64：[H·hd, H·hd]
    variants = []
    for op, gname in (("qkv", "attn_norm"), ("gate_up", "mlp_norm")):
        def folded(li, op=op, gname=gname):
            return A[(op, li)] / P["layers"][li][gname]                # x/rms：去掉 g
        variants += [(op, "07：RMSNorm·g", lambda li, op=op: A[(op, li)]), (op, "折叠：x/rms", folded),
                     (op, "折叠 · 随机正交", lambda li, f=folded: f(li) @ R), (op, "折叠 · H576", lambda li, f=folded: Q.right(f(li)))]
    variants += [("down", "原样", lambda li: A[("down", li)]), ("down", "· 在线 H1536", lambda li: Hd.right(A[("down", li)])),
                 ("o_proj", "原样", lambda li: A[("o_proj", li)]), ("o_proj", "· 逐头 H64", lambda li: A[("o_proj", li)] @ blk)]
    rows, res = [], {}
    for op, zh, f in variants:
        r = np.array([outlier_ratio(f(li)) for li in range(nL)])
        res[(op, zh)] = r
        w = int(np.argmax(r))
        rows.append([OP_ZH[op], zh, f"{np.median(r):.1f}", f"{r.max():.1f}", str(w)])
    print_table(["输入", "变换", "各层的中位数", "最大", "最大的层"], rows)
    # 第一个位置的大激活：校准文本里提示的位置 0 是第一行；注意力输入的那一行 max|x|/rms(x)
    first = {}
    for zh, f in (("before", lambda x: x), ("after", Q.right)):
        vals = []
        for li in range(nL):
            x = A[("qkv", li)] / P["layers"][li]["attn_norm"]                 # x/rms
            x = f(x)
            vals.append((float(np.abs(x[0]).max()), float(np.abs(x[1:]).max())))
        first[zh] = vals
    big = max(range(nL), key=lambda li: first["before"][li][0])
    res["first"], res["first_layer"] = first, big
    qa = res[("qkv", "07：RMSNorm·g")]
    qh, qr = res[("qkv", "折叠 · H576")], res[("qkv", "折叠 · 随机正交")]
    qf = res[("qkv", "折叠：x/rms")]
    dn, dh = res[("down", "原样")], res[("down", "· 在线 H1536")]
    w = int(np.argmax(dn))
    res.update({"down_worst": (w, float(dn[w]), float(dh[w]))})
    b0, a0 = first["before"][big], first["after"][big]
    print_observations([
        f"注意力输入：07 的口径（含 g）各层中位数 {np.median(qa):.1f}、最大 {qa.max():.1f}；把 g 折进权重后是 "
        f"{np.median(qf):.1f} / {qf.max():.1f}；再乘 H576 只剩 {np.median(qh):.1f} / {qh.max():.1f}（随机正交："
        f"{np.median(qr):.1f} / {qr.max():.1f}）。一个离群通道被正交矩阵摊到了所有 {cfg.d_model} 维上。",
        f"最大的离群值在 w_down 的输入：第 {w} 层是 {dn[w]:.0f} 倍。残差流的旋转碰不到它（它在 SiLU(gate)·up 之后，"
        f"不在残差流里）；w_down 前在线乘 H1536 以后是 {dh[w]:.1f} 倍（各层最大 {dh.max():.1f}）。",
        f"第一个位置的大激活（07 演示 2）：第 {big} 层的注意力输入里，第一个位置 max|x|/rms(x) = {b0[0]:.1f}"
        f"（{cfg.d_model} 维里一维就占了几乎全部的范数：上限 √{cfg.d_model} = {np.sqrt(cfg.d_model):.0f}），"
        f"其余位置最多 {b0[1]:.1f}；乘 H576 以后第一个位置是 {a0[0]:.2f}、其余位置最多 {a0[1]:.1f}。"
        "旋转保持每个 token 的范数，大激活还在，只是摊平了；RMSNorm 按 token 归一化，所以它在矩阵乘的输入里"
        "只剩「均匀的大小」。",
    ])
    return res


# ---------------------------------------------------------------------------
# 演示 3：低位数的激活
# ---------------------------------------------------------------------------
def demo3_quality(ctx):
    P, cfg, cr = ctx["P"], ctx["cfg"], ctx["cr"]
    toks, start, ref = ctx["eval_toks"], ctx["start"], ctx["ref"]
    print_header(f"演示 3：W4A4 / W4A8 / W8A8，不旋转和旋转（评估文本 {N_SEQ} × {N_NEW} 个生成的位置）")
    sc0, scr = input_scales(P, cfg), input_scales(ctx["Pall"], cr)
    online = {"down": ctx["Hd"]}
    res = {}

    def run(key, model, hook):
        kl, agree = kl_top1(ref, shared_prompt_logits(model, toks, start, hook))
        res[key] = (float(kl.mean()), agree, kl)

    # 只量化激活（权重不动）：旋转一步步加上去
    run(("W16A4", "none"), ctx.pop("model"), MatmulInputHook(sc0, quant=PerToken(4)))
    run(("W16A4", "rot"), NumpyTransformer(ctx.pop("Pr"), cr), MatmulInputHook(scr, quant=PerToken(4)))
    run(("W16A4", "down"), NumpyTransformer(ctx.pop("Prd"), cr), MatmulInputHook(scr, online, PerToken(4)))
    run(("W16A4", "all"), ctx.pop("model_all"), MatmulInputHook(scr, online, PerToken(4)))
    # 权重也量化：INT4-g32（和 W8 的 INT8 每通道）
    err = {}
    W4f, err["fold"] = quantize_layers(ctx.pop("Pf"), "int4-g32")
    run(("W4A16", "fold"), NumpyTransformer(W4f, ctx["cr"]), None)
    del W4f
    W4, err["none"] = quantize_layers(P, "int4-g32")
    W4all, err["all"] = quantize_layers(ctx["Pall"], "int4-g32")
    for tag, Wx, cx, sc, onl in (("none", W4, cfg, sc0, None), ("all", W4all, cr, scr, online)):
        m = NumpyTransformer(Wx, cx)
        del Wx
        run(("W4A16", tag), m, MatmulInputHook(online=onl) if onl else None)
        run(("W4A8", tag), m, MatmulInputHook(sc, onl, PerToken(8)))
        run(("W4A4", tag), m, MatmulInputHook(sc, onl, PerToken(4)))
        del m
    del W4, W4all
    W8, err["w8"] = quantize_layers(P, "int8")
    ctx["W8model"] = NumpyTransformer(W8, cfg)
    del W8
    run(("W8A8", "none"), ctx["W8model"], MatmulInputHook(sc0, quant=PerToken(8)))
    ctx["w8a8"] = res[("W8A8", "none")]
    res["w_err"] = err
    zh = {"none": "不旋转", "rot": "残差流 H576", "down": "+ 在线 H1536", "all": "+ V/O 的 H64（全部）",
          "fold": "只折叠 g，不旋转"}
    rows = []
    for key in (("W16A4", "none"), ("W16A4", "rot"), ("W16A4", "down"), ("W16A4", "all"),
                ("W4A16", "none"), ("W4A16", "fold"), ("W4A16", "all"), ("W4A8", "none"), ("W4A8", "all"),
                ("W4A4", "none"), ("W4A4", "all"), ("W8A8", "none")):
        kl, agree, _ = res[key]
        tag = zh[key[1]] if key[0] == "W16A4" or key[1] in ("none", "fold") else "全部旋转"
        rows.append([key[0], tag, f"{kl:.4f}", f"{100 * agree:.1f}%"])
    print_table(["权重 / 激活", "旋转", "KL（nats）", "top-1 一致"], rows)
    print_note("（W16：权重不动（文件反量化出来的）；旋转一行行累加：先残差流，再 w_down 前的在线 H1536，再 V/O。"
               "\"全部旋转\" = 三者都做。）")
    k = {key: v[0] for key, v in res.items() if isinstance(key, tuple)}
    for a, b in ((("W16A4", "none"), ("W16A4", "all")), (("W4A4", "none"), ("W4A4", "all")),
                 (("W4A16", "none"), ("W4A16", "all"))):
        res[(a, b)] = paired(res[b][2], res[a][2])
    pa, pw = res[(("W16A4", "none"), ("W16A4", "all"))], res[(("W4A16", "none"), ("W4A16", "all"))]
    print_observations([
        f"只量化激活（W16A4）：不旋转 KL {k[('W16A4', 'none')]:.3f}；旋转残差流 {k[('W16A4', 'rot')]:.3f}，"
        f"再加 w_down 前的在线 H1536 {k[('W16A4', 'down')]:.3f}，再加 V/O 的 H64 {k[('W16A4', 'all')]:.3f}"
        f"（全部旋转 − 不旋转：{pa[0]:+.3f} ± {pa[1]:.3f}，{pa[2]:+.1f} 个标准误，n = {N_SEQ} 条）。",
        f"只量化权重（W4A16，就近舍入）时旋转的反而差：{k[('W4A16', 'none')]:.3f} → {k[('W4A16', 'all')]:.3f}"
        f"（{pw[2]:+.1f} 个标准误），只把 g 折进权重、不旋转就已经是 {k[('W4A16', 'fold')]:.3f}。误差的总量差不多"
        f"（INT4-g32 的相对误差：原来的 {100 * err['none']:.2f}%、折叠后 {100 * err['fold']:.2f}%、旋转后 "
        f"{100 * err['all']:.2f}%），落在哪里不一样。折叠为什么有影响是能推出来的：一组 {SCHEMES['int4-g32'][2]} 行整组乘同一个数，"
        "就近舍入的结果跟着乘（scale 也乘，只差 FP16 的刻度），所以折叠只能通过同一组里 g 的大小不同起作用——g 大的行"
        "定了 scale，g 小的行相对舍得粗。旋转为什么更差没有验证（一个猜测：它把每个数摊成所有数的组合）。"
        "这里没有再拆开看是哪一层、哪个矩阵，也没有试 GPTQ："
        "QuaRot 的代码默认用 GPTQ 量化旋转后的权重（spcl/QuaRot 的 fake_quant/utils.py：不加 --w_rtn 就是 GPTQ），"
        "所以这一行只说就近舍入、只说这个文件，不是旋转的一般规律。",
        f"所以 W4A4 里两样混在一起：不旋转 {k[('W4A4', 'none')]:.3f}、旋转 {k[('W4A4', 'all')]:.3f}"
        f"（{res[(('W4A4', 'none'), ('W4A4', 'all'))][2]:+.1f} 个标准误）；W4A8 {k[('W4A8', 'none')]:.3f} → "
        f"{k[('W4A8', 'all')]:.3f}；W8A8（不旋转）{k[('W8A8', 'none')]:.4f}。文件本身就是 4 位的（Q4_1），"
        "第 2 讲 06 演示 4 里它答得对；坏的是在它上面再做一次对称的 INT4-g32 就近舍入（07 演示 1 的\"第二次舍入\"）："
        f"不旋转的 W4A16 top-1 只有 {100 * res[('W4A16', 'none')][1]:.0f}%。旋转救的是激活那一半。",
        "QuaRot（arXiv 2404.00456v2 的摘要；v1 的摘要写的是 0.29）：权重、激活、KV cache 全部 4 位，LLaMA2-70B 的 "
        "WikiText-2 困惑度最多差 0.47、零样本任务保留 99%；就近舍入、不要校准数据的是 6 位和 8 位（无损）。那是 700 亿"
        f"参数的 BF16 模型、量的是困惑度；这里是一个已经 4 位的 1.35 亿参数模型、就近舍入、{N_SEQ} 条 × {N_NEW} 个位置"
        "的 KL，不拿来比大小。",
    ])
    return res


# ---------------------------------------------------------------------------
# 演示 4：LLM.int8()
# ---------------------------------------------------------------------------
def demo4_llm_int8(ctx):
    P, cfg, A = ctx["P"], ctx["cfg"], ctx["calib"]
    toks, start, ref = ctx["eval_toks"], ctx["start"], ctx["ref"]
    nL = cfg.n_layers
    print_header(f"演示 4：LLM.int8()——每层 |x| ≥ {INT8_THRESHOLD:g} 的特征维（校准文本），和 W8A8 留下它们前后的 KL")
    counts = {op: [int(outlier_dims(A[(op, li)]).sum()) for li in range(nL)] for op in OPS}
    n_tok = A[("qkv", 0)].shape[0]
    rows = [[str(li)] + [str(counts[op][li]) for op in OPS] for li in range(nL)]
    rows.append(["通道数"] + [str(A[(op, 0)].shape[1]) for op in OPS])
    print_table(["层"] + [OP_ZH[op] for op in OPS], rows)
    model = ctx.pop("W8model")
    dec = Int8Decomposition()
    res = {"counts": counts, "n_tok": n_tok}
    res["w8a8"] = ctx["w8a8"]                  # 演示 3 的 W8A8（同一个模型、同样的钩子，只是没有分解）
    kl, agree = kl_top1(ref, shared_prompt_logits(model, toks, start, MatmulInputHook(input_scales(P, cfg), quant=dec)))
    res["int8"] = (float(kl.mean()), agree, kl)
    del model
    res["diff"] = paired(res["int8"][2], res["w8a8"][2])
    # 分解的代价：16 位的乘加占的比例（每次矩阵乘按 行 × |O| × 输出维 加权）；FP16 的列比 INT8 每个数多 1 字节
    out = {op: f(cfg) for op, f in OUT_DIM.items()}
    res["mac16"] = sum(r * o * out[op] for op, li, r, k, o in dec.log) / sum(r * k * out[op] for op, li, r, k, o in dec.log)
    res["vals16"] = sum(r * o for op, li, r, k, o in dec.log)
    res["vals"] = sum(r * k for op, li, r, k, o in dec.log)
    res["calls"], res["calls_with"] = len(dec.log), sum(1 for e in dec.log if e[4] > 0)
    res["w_params"] = sum(L[m].size for L in P["layers"] for m in LAYER_MATRICES)
    res["systematic"] = {op: systematic_dims([A[(op, li)] for li in range(nL)]) for op in ("qkv", "gate_up")}
    print_table(["W8A8（权重 INT8 每通道，激活 INT8 每 token）", "KL（nats）", "top-1 一致"],
                [["全部 INT8", f"{res['w8a8'][0]:.5f}", f"{100 * res['w8a8'][1]:.1f}%"],
                 [f"LLM.int8()：|x| ≥ {INT8_THRESHOLD:g} 的维留 16 位", f"{res['int8'][0]:.5f}",
                  f"{100 * res['int8'][1]:.1f}%"]])
    tot = {op: sum(counts[op]) for op in OPS}
    last = counts["down"][-1]
    d = res["diff"]
    sysd = res["systematic"]
    print_observations([
        f"真正的输入里 |x| ≥ {INT8_THRESHOLD:g} 的特征维（校准文本 {n_tok} 个不同的位置，{nL} 层合计）：注意力输入 "
        f"{tot['qkv']} 个、wo 输入 {tot['o_proj']} 个、FFN 输入 {tot['gate_up']} 个、w_down 输入 {tot['down']} 个。"
        f"w_down 的输入越往后越多：第 {nL - 1} 层 {A[('down', 0)].shape[1]} 维里 {last} 维过 {INT8_THRESHOLD:g}"
        f"（{100 * last / A[('down', 0)].shape[1]:.0f}%）——固定的阈值 6 在那里挑出来的已经不是\"少数几个离群维\"。",
        "论文的\"系统性\"离群特征（§4.1：|x| ≥ 6、同一维出现在至少 25% 的层里、至少 6% 的位置上）：注意力输入 "
        + dims_zh(sysd["qkv"]) + "、FFN 输入 " + dims_zh(sysd["gate_up"]) + "。论文在 67 亿参数附近看到\"相变\"："
        "更大的模型里所有的层都在同样的几维上出现这样的离群值（§4）。这里只有一个 1.35 亿参数的模型、一段很短的文本，"
        "说明不了规模上的规律。",
        f"W8A8 的 KL {res['w8a8'][0]:.5f}，把这些维留在 16 位以后 {res['int8'][0]:.5f}（差 {d[0]:+.5f} ± {d[1]:.5f}，"
        f"{d[2]:+.1f} 个标准误，n = {N_SEQ}）。代价：评估时 {res['calls']} 次矩阵乘里 {res['calls_with']} 次有离群维，"
        f"16 位的乘加占 {100 * res['mac16']:.2f}%，激活的 {res['vals']:,} 个数里 {res['vals16']:,} 个存成 FP16"
        f"（多 {res['vals16']:,} 字节，FP16 比 INT8 每个多 1 字节；{100 * (1 - res['vals16'] / res['vals']):.2f}% 仍是 8 位，"
        f"论文的摘要说超过 99.9%）；权重仍是 {res['w_params']:,} 个 INT8 加每个输出通道一个 scale。另外每次矩阵乘"
        "都要先扫一遍找离群维、把那几列拆出来、两次乘法的结果相加。",
    ])
    return res

if __name__ == "__main__":
    gguf_path_or_exit()          # 拿不到模型文件时只打印两条出路，退出码 1
    CTX = setup()
    demo1_invariance(CTX)
    demo2_outliers(CTX)
    demo3_quality(CTX)
    demo4_llm_int8(CTX)
