"""
quant_lab —— 第 3 讲的模型（QCFG）、把它的权重量化的各种方案、以及从模型里采样"文本"。

【QCFG：一个表现得足够像语言模型的随机模型】
词表 192、d_model 64、4 层、4 个 query 头 / 2 个 KV 头（GQA）、head_dim 16、SwiGLU d_ff 192、上下文 256，float64。
随机初始化的 transformer 默认"什么都不像"：输出要么接近均匀（熵太高，任何草稿都猜得中），要么被一两层支配。
第 6 讲拿它当投机解码的目标模型，需要：INT4 量化的自己很像它（α ≈ 0.9），只用前 3 层的草稿差一些（≈ 0.83），
只用前 1 层的更差（≈ 0.7），二元语法表最差（≈ 0.6）。这些由初始化的尺度决定（**这是选出来的假设**，
可行区域的中间；tests/replicate_seed04.py 是调它时用的工具）：
- 词嵌入 N(0, 1)；wq、wk、wv、w_gate、w_up 的标准差 1/√64（in_gain = 1；注意力不能更"尖"，
  否则 int4 对 wq/wk 的误差会翻转注意力，INT4 草稿的 α 会掉到 0.7 多）；
- wo 的标准差 0.29/√64、w_down 的标准差 0.44/√192：残差支路小一些，后面几层的贡献小，浅层草稿也像样；
- lm_head 的标准差 1.78/√64：logits 的标准差约 1.8，目标模型的熵约 3.8 nats（像"有一些把握的"语言模型）。

【量化方案】quantize_params(P, scheme)：对每层的 7 个矩阵（和可选的 lm_head）量化再反量化，结构不变：
  "int8"、"int4"：每个输出通道一个 FP16 scale；"int4-g128"、"int4-g64"、"int4-g32"：沿输入维每组一个 FP16 scale；
  "fp8-e4m3"：每个输出通道一个 FP32 scale（把最大值对到 448），元素舍入到 E4M3；
  "mxfp4"、"mxfp8"：OCP MX 块格式，每 32 个一个 E8M0 scale；"nvfp4"：E2M1 + 每 16 个一个 E4M3 scale + 张量 FP32 scale；
  "int3-g32"：INT3 每 32 个一组；"int4-g32-zp"：INT4 每 32 个一组，FP16 scale 加一个 4 位零点（非对称）。
词嵌入（查表）和 RMSNorm 的权重不量化。数的格式本身在 ../prereq3/numfmt。

【看数据的量化】（第 3 讲 05）layer_inputs 取 float 模型里每个矩阵的输入（校准激活）；gptq_quantize（GPTQ）、
awq_quantize（AWQ）用它们量化一个矩阵，quantize_params_calibrated 量化整个模型；compare_logits 和 02 同样的口径
（KL、top-1、困惑度）；with_salient_channels 造一个同样的函数、带几个大激活通道的版本。
【激活和 KV cache】（第 3 讲 06）quantize_activations（INT8 每张量 / 每 token）、smooth_scales 和 w8a8_error
（SmoothQuant）、kv_quantizer（交给 transformer_lab.KVCache 的 quant 参数：写入缓存时量化）。
"""
import os
import sys

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
for _sub in ("prereq3", "lecture02"):
    _p = os.path.join(_HERE, "..", _sub)
    if _p not in sys.path:
        sys.path.insert(0, _p)

from numfmt import (FP8_E4M3, FP4_E2M1, INT_QMAX, bits_per_value, quantize_fp8, quantize_int, quantize_int_asym,  # noqa: E402
                    quantize_mx, quantize_nvfp4, round_to)
from transformer_lab import LMConfig, NumpyTransformer, sample_inverse_cdf, softmax  # noqa: E402

__all__ = ["QCFG", "SCHEMES", "LAYER_MATRICES", "quantize_matrix", "quantize_params", "sample_tokens"]

QCFG = LMConfig(name="QCFG", vocab=192, d_model=64, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=192,
                max_seq=256, emb_std=1.0, in_gain=1.0, wo_gain=0.29, down_gain=0.44, head_gain=1.78)

LAYER_MATRICES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")

# 方案名 -> (种类, 参数)
SCHEMES = {
    "int8": ("int", 8, None),
    "int4": ("int", 4, None),
    "int4-g128": ("int", 4, 128),
    "int4-g64": ("int", 4, 64),
    "int4-g32": ("int", 4, 32),
    "fp8-e4m3": ("fp8", 8, None),
    "mxfp4": ("mx", FP4_E2M1, 32),
    "mxfp8": ("mx", FP8_E4M3, 32),
    "int3-g32": ("int", 3, 32),
    "int4-g32-zp": ("int-zp", 4, 32),
    "nvfp4": ("nvfp4", FP4_E2M1, 16),
}


def _check_scheme(scheme):
    if scheme not in SCHEMES:
        raise ValueError(f"未知的量化方案 {scheme!r}；可用的方案：{', '.join(SCHEMES)}")
    return SCHEMES[scheme]


def quantize_matrix(w, scheme, name="矩阵"):
    """
    量化再反量化一个权重矩阵 w [输入维, 输出维] -> (w', 每个数的平均位数（含 scale）)。

    【边界】分组 / MX 的块大小不整除输入维时抛 ValueError，消息里写出矩阵名；未知方案抛 ValueError 列出可用的。
    """
    kind, a, g = _check_scheme(scheme)
    n_in = w.shape[0]
    if g and n_in % g:
        raise ValueError(f"{scheme}：{name} 的输入维 {n_in} 不能被分组大小 {g} 整除")
    if kind == "int":
        wq, _ = quantize_int(w, a, "group" if g else "channel", g)
        return wq, bits_per_value(f"int{a}", n_in=n_in, group=g)
    if kind == "int-zp":
        return quantize_int_asym(w, a, g)[0], bits_per_value("int4-zp", group=g)
    if kind == "nvfp4":
        return quantize_nvfp4(w, g)[0], bits_per_value("nvfp4")
    if kind == "fp8":
        return quantize_fp8(w)[0], bits_per_value("fp8", n_in=n_in)
    wq, _ = quantize_mx(w, a, g)
    return wq, bits_per_value("mxfp4" if a is FP4_E2M1 else "mxfp8")


def quantize_params(P, scheme, include_lm_head=False, dtype=np.float64):
    """
    量化模型的权重 -> (Pq, report)。Pq 和 P 结构相同（反量化后的权重，类型 dtype），P 不被修改。

    report = {"scheme", "bits_per_param"（被量化的矩阵的平均位数，含 scale），"n_params"（被量化的参数个数），
              "matrices": [{"name", "shape", "bits", "rel_err" = ‖W − W'‖_F / ‖W‖_F, "max_abs_err"}]}。
    【参数】include_lm_head：lm_head 也量化（第 6 讲的 INT4 草稿这样做）。dtype：Pq 里矩阵的类型（量化和误差都按
    float64 算，每个矩阵算完马上转成 dtype：float32 的真实模型任何时候只多一个矩阵的 float64 副本）。
    """
    _check_scheme(scheme)
    dtype = np.dtype(dtype)
    Pq = dict(P)
    Pq["layers"] = []
    mats = []

    def q(w, name):
        wq, bits = quantize_matrix(w, scheme, name)
        err = wq - w
        mats.append({"name": name, "shape": w.shape, "bits": bits,
                     "rel_err": float(np.linalg.norm(err) / max(np.linalg.norm(w), np.finfo(float).tiny)),
                     "max_abs_err": float(np.abs(err).max())})
        return wq if wq.dtype == dtype else wq.astype(dtype)

    for i, L in enumerate(P["layers"]):
        Lq = dict(L)
        for m in LAYER_MATRICES:
            Lq[m] = q(L[m], f"layers[{i}].{m}")
        Pq["layers"].append(Lq)
    if include_lm_head:
        Pq["lm_head"] = q(P["lm_head"], "lm_head")
    n = sum(int(np.prod(m["shape"])) for m in mats)
    bits = sum(m["bits"] * int(np.prod(m["shape"])) for m in mats) / n
    return Pq, {"scheme": scheme, "bits_per_param": bits, "n_params": n, "matrices": mats}


def sample_tokens(P, cfg, n_seq, length, seed, T=1.0):
    """
    从模型里按温度 T（默认 1）采样 n_seq 条长 length 的序列 -> int 数组 [n_seq, length]（第 3、6 讲测量用的"文本"）。

    【做法】第一个 token 在词表上均匀地抽；之后每一步用 KV cache 把上一个 token 喂进去，按 softmax(logits / T) 抽下一个。
    随机数：np.random.default_rng(seed)，每一步 rng.random(n_seq) 个均匀数，CDF 反查（不依赖 numpy 版本）。
    【边界】T = 0 是贪心（取 argmax，随机数照样消耗，所以只有第一个 token 是随机的）；T < 0 抛 ValueError。
    """
    if not T >= 0:
        raise ValueError(f"温度 T 必须 ≥ 0（T = 0 表示贪心），收到 {T}")
    if n_seq < 1 or length < 1:
        raise ValueError(f"n_seq 和 length 都至少为 1（收到 {n_seq}, {length}）")
    if length > cfg.max_seq:
        raise ValueError(f"length = {length} 超过模型的上下文 max_seq = {cfg.max_seq}")
    rng = np.random.default_rng(seed)
    model = NumpyTransformer(P, cfg)
    cache = model.new_cache(n_seq, length)
    out = np.zeros((n_seq, length), dtype=np.int64)
    out[:, 0] = sample_inverse_cdf(np.full((n_seq, cfg.vocab), 1.0 / cfg.vocab), rng.random(n_seq))
    for t in range(1, length):
        logits = model.forward(out[:, t - 1:t], cache)[:, -1]
        u = rng.random(n_seq)
        out[:, t] = logits.argmax(-1) if T == 0 else sample_inverse_cdf(softmax(logits / T), u)
    return out


# ---------------------------------------------------------------------------
# 看数据的量化：校准激活、GPTQ、AWQ（第 3 讲 05）
# ---------------------------------------------------------------------------
# 每个矩阵的输入是哪一个激活（wq/wk/wv 共用注意力的输入，w_gate/w_up 共用 FFN 的输入）
INPUT_OF = {"wq": "attn_in", "wk": "attn_in", "wv": "attn_in", "wo": "attn_out",
            "w_gate": "mlp_in", "w_up": "mlp_in", "w_down": "mlp_act"}


def _rmsnorm(x, g, eps):  # [..., d] -> [..., d]
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * g


def layer_inputs(P, cfg, toks):
    """
    不带缓存、不做任何融合的朴素前向，记下每层每个矩阵的输入 -> (logits [B, n, V], acts)。

    acts[层] = {"attn_in": RMSNorm(x)·g [B·n, d]（wq/wk/wv 的输入）, "attn_out": 注意力的输出 [B·n, H·hd]（wo 的输入）,
    "mlp_in": [B·n, d]（w_gate/w_up 的输入）, "mlp_act": SiLU(gate)·up [B·n, d_ff]（w_down 的输入）}。
    【推导】和 transformer_lab.NumpyTransformer 是同一个模型的第二种写法：RMSNorm 的权重不并进矩阵、RoPE 用
    "前一半 / 后一半"旋转（x₁cosθ − x₂sinθ, x₁sinθ + x₂cosθ）、注意力逐头写。测试断言两者的 logits 只差浮点舍入。
    NumpyTransformer 的默认前向因此一点不用改（也不会变慢）。
    """
    toks = np.asarray(toks)
    B, n = toks.shape
    H, Hkv, hd, half = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.head_dim // 2
    ang = np.arange(n)[:, None] * (cfg.rope_theta ** (-np.arange(half) / half))[None, :]   # [n, hd/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(t):  # [B, n, heads, hd]
        t1, t2 = t[..., :half], t[..., half:]
        return np.concatenate([t1 * cos - t2 * sin, t1 * sin + t2 * cos], axis=-1)

    causal = np.where(np.arange(n)[None, :] > np.arange(n)[:, None], -np.inf, 0.0)    # [n, n]
    x = P["embed"][toks]
    acts = []
    for L in P["layers"]:
        h = _rmsnorm(x, L["attn_norm"], cfg.norm_eps)
        q = rope((h @ L["wq"]).reshape(B, n, H, hd))
        k = rope((h @ L["wk"]).reshape(B, n, Hkv, hd))
        v = (h @ L["wv"]).reshape(B, n, Hkv, hd)
        kv_of = np.arange(H) // cfg.group                                              # query 头 -> KV 头
        s = np.einsum("bqhd,bkhd->bhqk", q, k[:, :, kv_of]) / np.sqrt(hd) + causal
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        a = np.einsum("bhqk,bkhd->bqhd", p, v[:, :, kv_of]).reshape(B, n, H * hd)
        x = x + a @ L["wo"]
        h2 = _rmsnorm(x, L["mlp_norm"], cfg.norm_eps)
        gate = h2 @ L["w_gate"]
        act = gate / (1.0 + np.exp(-gate)) * (h2 @ L["w_up"])
        x = x + act @ L["w_down"]
        acts.append({"attn_in": h.reshape(B * n, -1), "attn_out": a.reshape(B * n, -1),
                     "mlp_in": h2.reshape(B * n, -1), "mlp_act": act.reshape(B * n, -1)})
    return _rmsnorm(x, P["final_norm"], cfg.norm_eps) @ P["lm_head"], acts


def _check_calib(w, x_calib):
    w = np.asarray(w, dtype=np.float64)
    x = np.asarray(x_calib, dtype=np.float64)
    if w.ndim != 2 or x.ndim != 2 or x.shape[1] != w.shape[0]:
        raise ValueError(f"校准激活必须是 [样本数, 输入维] 且输入维等于权重 [输入维, 输出维] 的行数"
                         f"（收到 x_calib {x.shape}、w {w.shape}）")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(w))):
        raise ValueError("权重和校准激活里不能有 NaN 或 inf")
    return w, x


def _rounder(W, i, g, scheme):
    """
    GPTQ 走到第 i 行（一组的第一行）时，用当前的权重 W 定这一组的 scale -> 函数：一行 [输出维] -> 反量化的一行。

    scale 的定法和 quantize_matrix（就近舍入）完全一样，只是用的是已经被前面的误差补偿改过的权重。
    NVFP4 的张量 scale 取当前整个 W 的最大值（前面已量化的行记的是它们量化前的值）。
    """
    kind, a, _ = SCHEMES[scheme]
    block = W[i:i + g]
    if kind == "int":
        qmax = INT_QMAX[a]
        s = quantize_int(block, a, "channel")[1]
        lo, hi = -qmax, qmax
        zero = 0.0
    elif kind == "int-zp":
        _, s, zero = quantize_int_asym(block, a, g)
        s, zero = s.ravel(), zero.ravel()
        lo, hi = 0, 2 ** a - 1
    else:
        if kind == "fp8":
            s, elem = quantize_fp8(block)[1], FP8_E4M3
        elif kind == "mx":
            s, elem = quantize_mx(block, a, g)[1].ravel(), a
        else:
            s, elem = quantize_nvfp4(W, g)[1][:, i // g], FP4_E2M1
        safe = np.where(s > 0, s, 1.0)
        return lambda r: np.where(s > 0, round_to(r / safe, elem) * s, 0.0)
    safe = np.where(s > 0, s, 1.0)
    return lambda r: np.where(s > 0, (np.clip(np.round(r / safe) + zero, lo, hi) - zero) * s, 0.0)


def gptq_quantize(w, x_calib, scheme, damp=0.01):
    """
    GPTQ（Frantar et al. 2022, arXiv 2210.17323）量化再反量化 w [输入维, 输出维] -> w' 同形状。

    【推导】目标是让 x_calib 上的输出 X·W' 接近 X·W：‖X(W − W')‖² 对 W 的一列（一个输出通道）的 Hessian 是
    H = 2XᵀX（每个输出通道都一样）。输入维一个一个按顺序量化（论文里是权重的列；这里 w 存成 [输入维, 输出维]，
    所以是行）：第 i 行舍入成 q_i 后，误差 δ = w_i − q_i 用还没量化的行来补偿：
    W[i+1:] −= U[i, i+1:]ᵀ · δ / U[i, i]，U 是 H⁻¹ 的上三角 Cholesky 因子（H⁻¹ = UᵀU；论文算法 1）。
    只剩两个输入维时这就是 w₁ += (H₀₁ / H₁₁) · δ₀——让 x₁ 的那一路抵消 x₀ 那一路的舍入误差（闭式解）。
    H 加阻尼 λI，λ = damp × mean(diag H)（论文的 1%）。分组方案的 scale 在走到每组的第一行时，用这时（已被补偿改过的）
    这一组的权重定（论文的分组做法）；每通道的方案在开始时用整列定。
    【参数】x_calib [样本数, 输入维]：这一层的输入（校准激活）；scheme：SCHEMES 里的方案；damp ≥ 0。
    【边界】x_calib 的形状不对、damp < 0、未知方案、H 奇异（例如某个输入维在校准数据里全是 0，又不加阻尼）
    都抛 ValueError。这里不做论文里为 GPU 做的"lazy batch"分块（结果相同，只是更快）。
    """
    _check_scheme(scheme)
    w, x = _check_calib(w, x_calib)
    return _gptq_rows(w, gptq_factor(x, damp), scheme)


def gptq_factor(x_calib, damp=0.01):
    """
    GPTQ 用的 H⁻¹ 的上三角 Cholesky 因子 U [输入维, 输入维]（H = 2XᵀX + λI，H⁻¹ = UᵀU）-> U。

    同一个输入的几个矩阵（wq/wk/wv、w_gate/w_up）共用一个 U，只算一次（quantize_params_calibrated 这样做）。
    【边界】damp < 0、x_calib 不是二维、H 奇异时抛 ValueError。
    """
    x = np.asarray(x_calib, dtype=np.float64)
    if x.ndim != 2 or not np.all(np.isfinite(x)):
        raise ValueError(f"校准激活必须是有限值的 [样本数, 输入维]（收到形状 {x.shape}）")
    if not damp >= 0:
        raise ValueError(f"阻尼 damp 必须 ≥ 0（收到 {damp}）")
    n_in = x.shape[1]
    H = 2.0 * x.T @ x
    H += damp * float(np.mean(np.diag(H))) * np.eye(n_in)
    # H⁻¹ = UᵀU 的上三角 U：把 H 的行列倒过来做 Cholesky 得 H = R·Rᵀ（R 上三角），则 H⁻¹ = (R⁻¹)ᵀ·R⁻¹，U = R⁻¹
    try:
        R = np.linalg.cholesky(H[::-1, ::-1])[::-1, ::-1]
    except np.linalg.LinAlgError:
        R = None
    if R is None or np.diag(R).min() <= 1e-8 * np.diag(R).max():
        raise ValueError(f"Hessian 2XᵀX{' + λI' if damp else ''} 是奇异的（校准数据没有覆盖全部 {n_in} 个输入维）："
                         f"加阻尼（damp > 0）或者换更多的校准数据")
    return np.linalg.inv(R)


def _gptq_rows(w, U, scheme):
    """GPTQ 的主循环：按 U（gptq_factor）逐行量化 w、把误差补偿到后面的行 -> w'。"""
    g = SCHEMES[scheme][2]
    n_in = w.shape[0]
    g = g or n_in
    if n_in % g:
        raise ValueError(f"{scheme}：输入维 {n_in} 不能被分组大小 {g} 整除")
    W = w.copy()
    Q = np.empty_like(W)
    for i in range(n_in):
        if i % g == 0:
            rnd = _rounder(W, i, g, scheme)
        Q[i] = rnd(W[i])
        W[i + 1:] -= np.outer(U[i, i + 1:], (W[i] - Q[i]) / U[i, i])
    return Q


def gptq_rows_lazy(w, U, scheme, block=128):
    """
    GPTQ 的主循环（同 _gptq_rows），按论文的"lazy batch"分块更新 -> w'（和 _gptq_rows 只差浮点舍入）。

    【推导】论文第 3 节 Step 2：第 i 行的误差补偿 W[i+1:] −= U[i, i+1:]ᵀ·e_i 对块外的行只是累加，
    所以一块（block 行）里只更新块内的行，块结束时用一次矩阵乘把整块的误差 E 补到后面：W[b1:] −= U[b0:b1, b1:]ᵀ·E。
    块内读到的权重和逐行的做法完全一样（分组的 scale 在组的第一行定，组落在同一块里），结果相同，只是少了大量的
    小更新（SmolLM2 的一层快约 3–5 倍）。
    【参数】U：gptq_factor 的因子；block：块的行数，必须是分组大小的整数倍（每通道的方案不限）。
    【边界】NVFP4 的张量 scale 要看整个当前的 W（块外的行还没补偿），所以它照逐行的做法算；block 不合规矩抛 ValueError。
    """
    _check_scheme(scheme)
    w = np.asarray(w, dtype=np.float64)
    kind, _, g = SCHEMES[scheme]
    n_in = w.shape[0]
    if kind == "nvfp4":
        return _gptq_rows(w, U, scheme)
    g = g or n_in
    if n_in % g:
        raise ValueError(f"{scheme}：输入维 {n_in} 不能被分组大小 {g} 整除")
    if not (isinstance(block, (int, np.integer)) and block >= 1 and (g == n_in or block % g == 0)):
        raise ValueError(f"block 必须是分组大小 {g} 的正整数倍（收到 {block!r}）")
    W = w.copy()
    Q = np.empty_like(W)
    for b0 in range(0, n_in, block):
        b1 = min(b0 + block, n_in)
        E = np.empty((b1 - b0, W.shape[1]))
        for i in range(b0, b1):
            if i % g == 0:
                rnd = _rounder(W, i, g, scheme)
            Q[i] = rnd(W[i])
            E[i - b0] = (W[i] - Q[i]) / U[i, i]
            W[i + 1:b1] -= np.outer(U[i, i + 1:b1], E[i - b0])
        W[b1:] -= U[b0:b1, b1:].T @ E
    return Q


def awq_search(w, x_calib, scheme, grid=20):
    """
    AWQ 的尺度搜索 -> (w', 选中的 a, 每个 a 的相对输出误差 [grid])。awq_quantize 只返回 w'。

    【推导】AWQ（Lin et al. 2023, arXiv 2306.00978）：激活大的输入通道更"重要"，把它那一行权重放大 s 倍再量化、
    反量化后除回 s（真实模型里激活一侧的 1/s 并进前一层，比如 RMSNorm 的权重），它的相对舍入误差就小了。
    s_j = mean|x_j|^a（a 在 [0, 1) 的 grid 个等分点 0, 1/grid, … 上搜），除以 √(max s · min s) 让 s 在 1 附近
    （和官方实现一样）；选使校准数据上 ‖X·W − X·W'‖² 最小的 a。a = 0 时 s 全是 1，就是就近舍入，
    所以在校准数据上 AWQ 不会比就近舍入差。
    【边界】形状不对、未知方案、grid 不是正整数抛 ValueError；在校准数据里全为 0 的通道 mean|x| 取最大值的 10⁻⁶。
    """
    _check_scheme(scheme)
    w, x = _check_calib(w, x_calib)
    if not (isinstance(grid, (int, np.integer)) and grid >= 1):
        raise ValueError(f"grid 必须是正整数（收到 {grid!r}）")
    m = np.abs(x).mean(axis=0)
    m = np.maximum(m, m.max() * 1e-6) if m.max() > 0 else np.ones_like(m)
    if x.shape[0] < x.shape[1]:                                   # 样本比输入维少：直接算 ‖X·D‖² 更省
        def sq(D):
            return float(np.square(x @ D).sum())
    else:
        G = x.T @ x                                               # ‖X·D‖² = Σ D ⊙ (G·D)，G 只有 [输入维, 输入维]

        def sq(D):
            return float((D * (G @ D)).sum())
    y2 = max(sq(w), np.finfo(float).tiny)
    best, errs = None, []
    for k in range(grid):
        a = k / grid
        s = m ** a
        s = s / np.sqrt(s.max() * s.min())
        wq = quantize_matrix(w * s[:, None], scheme)[0] / s[:, None]
        d = wq - w
        errs.append(sq(d) / y2)
        if best is None or errs[-1] < errs[best[1]]:
            best = (wq, k)
    return best[0], best[1] / grid, np.array(errs)


def awq_quantize(w, x_calib, scheme, grid=20):
    """AWQ 量化再反量化 w [输入维, 输出维] -> w'（见 awq_search）。"""
    return awq_search(w, x_calib, scheme, grid)[0]


def output_error(x, w, wq):
    """相对输出误差 ‖X·W − X·W'‖_F / ‖X·W‖_F（x [样本数, 输入维]）。"""
    y = x @ w
    return float(np.linalg.norm(x @ wq - y) / max(np.linalg.norm(y), np.finfo(float).tiny))


METHODS = ("rtn", "gptq", "awq")


def quantize_params_calibrated(P, acts, scheme, method, cache=None):
    """
    用校准激活量化模型的 7 × 层数 个矩阵（lm_head、词嵌入、RMSNorm 不动）-> Pq（结构同 P）。

    【参数】acts：layer_inputs 在校准文本上得到的每层输入（float 模型的激活——每层都用原模型的激活校准，
    不用前面的层量化以后的激活）；method："rtn"（就近舍入，不看 acts）、"gptq"、"awq"。
    cache：一个 dict（可选）：GPTQ 的 H⁻¹ 因子只由激活决定，同一组 acts 换方案时可以共用（传同一个 dict）。
    """
    if method not in METHODS:
        raise ValueError(f"未知的方法 {method!r}；可用：{', '.join(METHODS)}")
    _check_scheme(scheme)
    Pq = dict(P)
    Pq["layers"] = []
    for L, A in zip(P["layers"], acts):
        Lq = dict(L)
        factors = {} if cache is None else cache.setdefault(len(Pq["layers"]), {})
        for m in LAYER_MATRICES:
            x = A[INPUT_OF[m]]
            if method == "rtn":
                Lq[m] = quantize_matrix(L[m], scheme, m)[0]
            elif method == "gptq":
                if INPUT_OF[m] not in factors:
                    factors[INPUT_OF[m]] = gptq_factor(x)
                Lq[m] = _gptq_rows(_check_calib(L[m], x)[0], factors[INPUT_OF[m]], scheme)
            else:
                Lq[m] = awq_quantize(L[m], x, scheme)
        Pq["layers"].append(Lq)
    return Pq


def log_softmax(logits):  # [..., V] -> [..., V]
    """数值稳定的 log softmax。"""
    z = logits - logits.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def compare_logits(logits_ref, logits_q, toks):
    """
    量化模型和原模型在同一段文本上的比较 -> {"kl", "kl_seq", "agree", "ppl_ref", "ppl"}（和 02 的口径一样）。

    【推导】只看每条序列的前 len − 1 个位置（它们的下一个 token 在样本里）：kl = 平均 KL(p_原 ‖ p_量化)（nats）；
    kl_seq = 每条序列自己的平均 KL（[n_seq]，配对比较两个方案、算标准误用）；
    agree = 两个模型 argmax 相同的位置的比例；ppl = exp(样本的下一个 token 的平均负对数似然)。
    """
    lp, lq = log_softmax(logits_ref[:, :-1]), log_softmax(logits_q[:, :-1])
    nxt = np.asarray(toks)[:, 1:, None]
    kl = (np.exp(lp) * (lp - lq)).sum(axis=-1)                                   # [n_seq, len − 1]
    return {"kl": float(kl.mean()), "kl_seq": kl.mean(axis=1),
            "agree": float((lp.argmax(-1) == lq.argmax(-1)).mean()),
            "ppl_ref": float(np.exp(-np.take_along_axis(lp, nxt, axis=-1).mean())),
            "ppl": float(np.exp(-np.take_along_axis(lq, nxt, axis=-1).mean()))}


def with_salient_channels(P, channels, s):
    """
    同一个函数、换一种参数化 -> P'：每层 attn_norm、mlp_norm 的 channels 这几个权重乘 s，
    紧跟着的 wq/wk/wv（和 w_gate/w_up）对应的行除以 s。

    【推导】(RMSNorm(x)·g)_j · W_j = (RMSNorm(x)·g_j·s) · (W_j / s)：输出不变（只差浮点舍入），但这几个输入通道的激活
    大了 s 倍、权重小了 s 倍——训练出来的大模型里"激活特别大的通道"就是这个样子（AWQ 论文的显著通道、
    LLM.int8() 的离群特征）。这是**构造的例子**，不是训练的结果。
    """
    ch = np.asarray(channels)
    if not s > 0:
        raise ValueError(f"缩放 s 必须为正（收到 {s}）")
    P2 = dict(P)
    P2["layers"] = []
    for L in P["layers"]:
        L2 = {k: v.copy() for k, v in L.items()}
        for norm, mats in (("attn_norm", ("wq", "wk", "wv")), ("mlp_norm", ("w_gate", "w_up"))):
            L2[norm][ch] *= s
            for m in mats:
                L2[m][ch] /= s
        P2["layers"].append(L2)
    return P2


__all__ += ["INPUT_OF", "METHODS", "layer_inputs", "gptq_quantize", "gptq_factor", "gptq_rows_lazy", "awq_search", "awq_quantize", "output_error",
            "quantize_params_calibrated", "log_softmax", "compare_logits", "with_salient_channels"]


# ---------------------------------------------------------------------------
# 激活和 KV cache 的量化（第 3 讲 06）
# ---------------------------------------------------------------------------
def quantize_activations(x, granularity="token"):
    """
    INT8 对称量化再反量化激活 x [token 数, 通道数] -> x'（动态量化：scale 由这一批激活自己的最大值定）。

    【参数】granularity："tensor"（整批一个 scale）或 "token"（每个 token，即每行一个 scale）。
    scale 存成 FP16（numfmt.quantize_int 的做法；真实的 kernel 常用 FP32 的 scale，差别在 FP16 的舍入，很小）。
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"激活必须是二维 [token 数, 通道数]（收到形状 {x.shape}）")
    if granularity == "tensor":
        return quantize_int(x, 8, "tensor")[0]
    if granularity == "token":
        return quantize_int(x.T, 8, "channel")[0].T
    raise ValueError(f"未知的激活量化粒度 {granularity!r}；可用：tensor、token")


def smooth_scales(x, w, alpha):
    """
    SmoothQuant（Xiao et al. 2022, arXiv 2211.10438）的每个输入通道的平滑因子 s -> [输入维]。

    【推导】s_j = max|X_j|^α / max|W_j|^(1−α)：X_j 是激活的第 j 个通道（x 的第 j 列），W_j 是权重的第 j 个输入通道
    （w [输入维, 输出维] 的第 j 行）。X·W = (X / s)·(s·W)：激活除以 s、权重乘 s，结果不变，量化的难度从激活挪到权重；
    α 越大挪得越多。【边界】α 不在 [0, 1] 里抛 ValueError；全 0 的通道 s = 1。
    """
    if not 0 <= alpha <= 1:
        raise ValueError(f"迁移强度 α 必须在 [0, 1] 里（收到 {alpha}）")
    ax = np.abs(x).max(axis=0)
    aw = np.abs(w).max(axis=1)
    ok = (ax > 0) & (aw > 0)
    return np.where(ok, np.where(ok, ax, 1.0) ** alpha / np.where(ok, aw, 1.0) ** (1 - alpha), 1.0)


def w8a8_error(x, w, granularity="tensor", alpha=None):
    """
    W8A8 的相对输出误差 ‖X·W − Q(X')·Q(W')‖ / ‖X·W‖：权重 INT8 每输出通道、激活 INT8（granularity 同
    quantize_activations）。alpha 不为 None 时先做 SmoothQuant：X' = X / s、W' = s·W（s = smooth_scales）。
    """
    w, x = _check_calib(w, x)
    if alpha is not None:
        s = smooth_scales(x, w, alpha)
        x, w_s = x / s, w * s[:, None]
    else:
        w_s = w
    y = x @ w if alpha is None else (x * s) @ w
    yq = quantize_activations(x, granularity) @ quantize_int(w_s, 8, "channel")[0]
    return float(np.linalg.norm(yq - y) / max(np.linalg.norm(y), np.finfo(float).tiny))


# KV cache 的格式：名字 -> (说明, 每个数的位数（含 scale），head_dim 为 hd 时)
KV_FORMATS = ("fp8-e4m3", "int8-head", "int4-g8")


def kv_bits(fmt, head_dim):
    """
    KV cache 每个数平均占几位（含 scale）-> float。

    "fp8-e4m3"：8（整个缓存一个 scale = 1，不占每个数的位）；"int8-head"：每个 token 每个头一个 FP16 scale，
    8 + 16 / head_dim；"int4-g8"：每个 token 每个头里每 8 个数一组一个 FP16 scale，4 + 16 / 8 = 6。
    """
    if fmt == "fp8-e4m3":
        return 8.0
    if fmt == "int8-head":
        return 8 + 16 / head_dim
    if fmt == "int4-g8":
        return 4 + 16 / 8
    raise ValueError(f"未知的 KV cache 格式 {fmt!r}；可用：{', '.join(KV_FORMATS)}")


def kv_quantizer(fmt):
    """
    KV cache 写入时用的量化函数 f(块 [..., head_dim]) -> 同形状（交给 transformer_lab.KVCache 的 quant 参数）。

    【推导】缓存里一个 token 的一个头是最后一维的 head_dim 个数（K 是 RoPE 之后的、每个头的列重排过的值：
    第 2i、2i+1 列是原来的第 i、i + head_dim/2 维）。每头一个 scale 和重排无关；每 8 个相邻的数一组时，一组是
    4 个 RoPE 旋转对（和按原来的顺序分组不是同样的 8 个数），组总落在同一个头里。
    "fp8-e4m3"：直接舍入到 E4M3（scale = 1：这里的 K、V 的大小在 1 附近，远在 E4M3 的正规数范围 2⁻⁶..448 里）；
    "int8-head"：每个 token 每个头一个 scale（max|v| / 127，FP16）；"int4-g8"：每 8 个一组一个 scale（max|v| / 7）。
    """
    kv_bits(fmt, 8)

    def per_vector(x, bits, group):
        flat = x.reshape(-1, x.shape[-1]).T                      # [head_dim, token·头]：每列一个 token 的一个头
        q = quantize_int(flat, bits, "group" if group else "channel", group)[0]
        return q.T.reshape(x.shape)

    if fmt == "fp8-e4m3":
        return lambda x: round_to(x, FP8_E4M3)
    if fmt == "int8-head":
        return lambda x: per_vector(x, 8, None)
    return lambda x: per_vector(x, 4, 8)


__all__ += ["quantize_activations", "smooth_scales", "w8a8_error", "KV_FORMATS", "kv_bits", "kv_quantizer"]
