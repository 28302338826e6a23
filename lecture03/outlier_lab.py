"""
outlier_lab —— 一个模型在一段文本上的激活长什么样：每层的残差流、各矩阵的输入、缓存里的 K 和 V，以及量它们的离群程度。

【为什么不用 quant_lab.layer_inputs】它是给第 3 讲的小模型（QCFG）写的：逐头 einsum、按 float64 算，在 SmolLM2-135M
（30 层、d = 576）上比模型自己的前向慢约 3 倍，也不给残差流和 K、V。capture 是同一个模型的第三种写法：
按 cfg.dtype 算（float32 的模型就是 float32），注意力用批量矩阵乘，多记下残差流（Sun et al. 2024 的"大激活"在它里面）
和 RoPE 之后的 K、V（KIVI 看的就是缓存里的 K、V）。测试断言它的 logits 和 transformer_lab.NumpyTransformer 的只差浮点舍入。

【离群的统计量】outlier_ratio：每个通道的 max|x|（在所有 token 上取最大），最大的通道 / 中位数的通道。
和第 3 讲 06 打印的（它的 spread）是同一个量，所以小模型和真实模型的数可以直接比。
"""
import numpy as np

__all__ = ["ACT_KEYS", "capture", "outlier_ratio", "top_channels", "recurring_channels", "massive_activations"]

# 每层记下的激活：名字 -> 它是谁的输入
ACT_KEYS = ("resid", "attn_in", "attn_out", "mlp_in", "mlp_act")


def _rmsnorm(x, g, eps):  # [..., d] -> [..., d]
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * g


def capture(P, cfg, toks, layers=None, start=0, resid=None):  # toks [B, n] -> logits [B, n, V], acts
    """
    不带缓存的前向，记下每层的激活 -> (logits [B, n, V], acts)。

    acts[层] = {"resid": 进入这一层的残差流 x [B·n, d], "attn_in": RMSNorm(x)·g（wq/wk/wv 的输入）[B·n, d],
    "attn_out": 注意力的输出 [B·n, H·hd]（wo 的输入）, "mlp_in": [B·n, d]（w_gate/w_up 的输入）,
    "mlp_act": SiLU(gate)·up [B·n, d_ff]（w_down 的输入）, "k": RoPE 之后的 K [B, Hkv, n, hd],
    "v": V [B, Hkv, n, hd]}（K、V 按 Hugging Face 的维序：第 i 维和第 i + hd/2 维是一个旋转对）。
    【推导】Llama：x ← x + Attn(RMSNorm(x)·g₁)，x ← x + W_down(SiLU(W_gate h)·W_up h)，h = RMSNorm(x)·g₂；
    RoPE 按"前一半 / 后一半"旋转，GQA 的第 h 个 query 头用第 h // (H / Hkv) 个 KV 头。
    【参数】layers：只记这几层（其余层照算、不记，省内存）；None = 全部。
    start、resid：从第 start 层算起，进入它的残差流是 resid [B·n, d]（上一次 capture 记下的 acts[start]["resid"]）：
    只改了第 start 层以后的权重时，前面的层不用重算（第 3 讲 07 比较几层的量化方法时这样做）。
    【边界】toks 不是二维、越界、长于 cfg.max_seq，start 不在 0..层数−1，resid 的形状不对时抛 ValueError。
    """
    toks = np.asarray(toks)
    if toks.ndim != 2 or toks.shape[1] < 1 or toks.shape[1] > cfg.max_seq:
        raise ValueError(f"toks 必须是 [批, 长度]、长度 1..{cfg.max_seq}（收到形状 {toks.shape}）")
    if toks.min() < 0 or toks.max() >= cfg.vocab:
        raise ValueError(f"token 必须在 0..{cfg.vocab - 1} 之间")
    dt = np.dtype(cfg.dtype)
    B, n = toks.shape
    H, Hkv, hd, half, G = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.head_dim // 2, cfg.group
    keep = set(range(cfg.n_layers)) if layers is None else set(layers)
    ang = np.arange(n)[:, None] * (cfg.rope_theta ** (-np.arange(half) / half))[None, :]   # [n, hd/2]，float64 算角度
    cos, sin = np.cos(ang).astype(dt), np.sin(ang).astype(dt)

    def rope(t):  # [B, heads, n, hd]
        t1, t2 = t[..., :half], t[..., half:]
        return np.concatenate([t1 * cos - t2 * sin, t1 * sin + t2 * cos], axis=-1)

    causal = np.where(np.arange(n)[None, :] > np.arange(n)[:, None], -np.inf, 0.0).astype(dt)   # [n, n]
    if not (isinstance(start, (int, np.integer)) and 0 <= start < cfg.n_layers):
        raise ValueError(f"start 必须是 0..{cfg.n_layers - 1} 之间的整数（收到 {start!r}）")
    if resid is None:
        if start:
            raise ValueError("从中间的层算起（start > 0）要给进入那一层的残差流 resid")
        x = np.asarray(P["embed"], dtype=dt)[toks].reshape(B * n, cfg.d_model)
    else:
        resid = np.asarray(resid)
        if resid.shape != (B * n, cfg.d_model):
            raise ValueError(f"resid 必须是 [B·n, d] = {(B * n, cfg.d_model)}（收到 {resid.shape}）")
        x = resid.astype(dt)
    acts = {}
    for li in range(start, cfg.n_layers):       # 残差流一直是二维 [B·n, d]：一次矩阵乘只读一遍权重
        L = P["layers"][li]
        h = _rmsnorm(x, L["attn_norm"].astype(dt), dt.type(cfg.norm_eps))
        q = rope((h @ L["wq"]).reshape(B, n, H, hd).transpose(0, 2, 1, 3))          # [B, H, n, hd]
        k = rope((h @ L["wk"]).reshape(B, n, Hkv, hd).transpose(0, 2, 1, 3))        # [B, Hkv, n, hd]
        v = (h @ L["wv"]).reshape(B, n, Hkv, hd).transpose(0, 2, 1, 3)
        qg = q.reshape(B, Hkv, G * n, hd)                       # 同一个 KV 头的 G 个 query 头摞在一起
        s = (qg @ k.transpose(0, 1, 3, 2)).reshape(B, Hkv, G, n, n) / dt.type(np.sqrt(hd)) + causal
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        a = (p.reshape(B, Hkv, G * n, n) @ v).reshape(B, H, n, hd).transpose(0, 2, 1, 3).reshape(B * n, H * hd)
        x_in = x
        x = x + a @ L["wo"]
        h2 = _rmsnorm(x, L["mlp_norm"].astype(dt), dt.type(cfg.norm_eps))
        gate = h2 @ L["w_gate"]
        act = gate / (1 + np.exp(-gate)) * (h2 @ L["w_up"])
        x = x + act @ L["w_down"]
        if li in keep:
            acts[li] = {"resid": x_in, "attn_in": h, "attn_out": a, "mlp_in": h2, "mlp_act": act, "k": k, "v": v}
    logits = (_rmsnorm(x, P["final_norm"].astype(dt), dt.type(cfg.norm_eps)) @ P["lm_head"]).reshape(B, n, -1)
    return logits, acts


def _channel_max(x):  # [..., 通道] -> [通道]
    x = np.asarray(x)
    if x.ndim < 2 or x.shape[-1] < 1 or x.size == 0:
        raise ValueError(f"激活必须至少是二维 [..., 通道]、不空（收到形状 {x.shape}）")
    return np.abs(x.reshape(-1, x.shape[-1])).max(axis=0)


def outlier_ratio(x):  # [..., 通道] -> float
    """
    通道的离群程度 -> 每个通道的 max|x|（在所有 token 上）里，最大的 / 中位数。

    【推导】和第 3 讲 06 的统计量相同。一个通道的最大值比一般的通道大很多倍，INT8 每张量（甚至每 token）的 scale 就被它撑大，
    其余通道分到的刻度很少（LLM.int8()、SmoothQuant 说的"离群通道"）。高斯噪声里 d 个通道的这个比值只有 1 点几。
    【边界】中位数为 0（一半以上的通道全 0）时返回 inf；形状不对抛 ValueError。
    """
    m = _channel_max(x)
    med = float(np.median(m))
    return float(m.max() / med) if med > 0 else float("inf")


def top_channels(x, k=3):  # [..., 通道] -> [k]
    """max|x| 最大的 k 个通道的下标（从大到小）-> int 数组。"""
    m = _channel_max(x)
    if not (isinstance(k, (int, np.integer)) and 1 <= k <= m.size):
        raise ValueError(f"k 必须是 1..{m.size} 之间的整数（收到 {k!r}）")
    return np.argsort(-m, kind="stable")[:k]


def recurring_channels(per_layer_top, min_layers=2):
    """
    在几层里都是离群通道的那些 -> [(通道, 出现的层数)]，按层数从多到少、同数按通道号排。

    【参数】per_layer_top：每层的 top_channels 的列表；min_layers：至少出现在几层里才算"重复出现"。
    """
    if not (isinstance(min_layers, (int, np.integer)) and min_layers >= 1):
        raise ValueError(f"min_layers 必须是 ≥ 1 的整数（收到 {min_layers!r}）")
    count = {}
    for top in per_layer_top:
        for c in set(int(c) for c in top):
            count[c] = count.get(c, 0) + 1
    return sorted(((c, n) for c, n in count.items() if n >= min_layers), key=lambda t: (-t[1], t[0]))


def massive_activations(resid, n_seq):  # [B·n, d] -> dict
    """
    残差流里最大的激活在哪里 -> {"max", "median", "ratio", "pos", "channel", "first_max", "rest_max"}。

    【推导】Sun et al. 2024（arXiv 2402.17762）："大激活"是少数几个固定维度上、比中位数大好几个数量级的值，
    出现在第一个 token（和分隔符）上。这里按 |x| 找最大的那一个：它在序列里的位置 pos、维度 channel，和第一个位置上
    的最大值 first_max、其余位置的最大值 rest_max；ratio = max / median（|x| 在所有 token、所有维度上的中位数）。
    【参数】resid：capture 的 "resid"（B 条序列摞在一起，每条 n 个位置）；n_seq = B。
    【边界】行数不是 n_seq 的整数倍时抛 ValueError；每条只有一个位置时 rest_max = 0。
    """
    r = np.abs(np.asarray(resid, dtype=np.float64))
    if r.ndim != 2 or n_seq < 1 or r.shape[0] % n_seq:
        raise ValueError(f"resid 必须是 [条数·长度, d]，行数是 n_seq = {n_seq} 的整数倍（收到形状 {r.shape}）")
    r3 = r.reshape(n_seq, -1, r.shape[1])
    s, pos, ch = np.unravel_index(int(np.argmax(r3)), r3.shape)
    med = float(np.median(r))
    return {"max": float(r3[s, pos, ch]), "median": med, "ratio": float(r3[s, pos, ch] / med) if med > 0 else float("inf"),
            "pos": int(pos), "channel": int(ch), "first_max": float(r3[:, 0].max()),
            "rest_max": float(r3[:, 1:].max()) if r3.shape[1] > 1 else 0.0}
