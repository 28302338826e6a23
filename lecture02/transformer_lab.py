"""
transformer_lab —— 一个 Llama 形状的 numpy transformer：配置、初始化、带 KV cache 的前向（运行时把账记到账本上）。

【模型】decoder-only：词嵌入 → n_layers × [RMSNorm → 注意力（RoPE、GQA）→ 残差 → RMSNorm → SwiGLU FFN → 残差]
→ RMSNorm → lm_head（不和词嵌入共享）。权重存成 (输入维, 输出维)，前向是 x @ W（picoGPT 的写法）。
玩具模型和种子全部用 **float64** 计算：带 KV cache 的增量 decode 和一次算完整个序列，差别只有浮点舍入
（测试断言 < 1e-12），而且选出的 token 完全一样——这是后面所有"精确"结论（回滚、投机解码不改变分布）的前提。
真实模型（real_model_lab）还可以选 float32（LMConfig.dtype）：快一倍、内存减半，舍入误差大约 1e-5 量级。

【同一讲的其他实验模块】ledger_lab（逐运算的账本：真实运行记的 Counter 和公式算的 analytic_ops，两者逐算子相等）、
kvcache_lab（KV cache：预先分配的数组 + 位置 pos，回滚、树形遮罩、写入时量化）、flash_lab（分块注意力）。
账本和 KV cache 的名字从这里再导出（种子脚本从 transformer_lab 导入 Counter、analytic_ops 等）。

【随机数】init_params 只用 rng.standard_normal；采样只用 rng.random() 的均匀数，自己做 CDF 反查
（cumsum + searchsorted），所以打印出来的抽样结果不依赖 numpy 的版本（choice / integers 的实现会变）。
"""
import math
import os
import sys
from dataclasses import dataclass, replace

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "..", "lecture01"))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
from llm_math import ModelConfig  # noqa: E402
# 账本和 KV cache 各在自己的实验模块里；这里再导出，因为种子脚本从 transformer_lab 导入它们（lecture06/04 的 Counter、analytic_ops）
from ledger_lab import (ALL_OPS, ATTN_CORE_OPS, BYTES_PER_EL, ELEMENTWISE_FLOPS, FIELDS, MATMUL_OPS,  # noqa: E402,F401
                        Counter, analytic_ops, sum_rows)
from kvcache_lab import KVCache, tree_mask  # noqa: E402,F401

__all__ = ["LMConfig", "LEC2_CFG", "random_tokens", "init_params", "config_like", "NumpyTransformer", "KVCache", "Counter",
           "analytic_ops", "sum_rows", "MATMUL_OPS", "ATTN_CORE_OPS", "ALL_OPS", "ELEMENTWISE_FLOPS",
           "FIELDS", "BYTES_PER_EL", "softmax", "sample_inverse_cdf", "tree_mask"]


# ---------------------------------------------------------------------------
# 配置与初始化
# ---------------------------------------------------------------------------
DTYPES = ("float64", "float32")  # 模型能用的浮点类型（LMConfig.dtype）


@dataclass(frozen=True)
class LMConfig:
    """
    numpy 小模型的配置。结构字段之外，初始化的尺度也是配置的一部分（init_params 读它们）。

    【初始化】词嵌入 N(0, emb_std²)；wq/wk/wv/w_gate/w_up 的标准差 in_gain/√d_model；
    wo 的标准差 wo_gain/√(n_heads·head_dim)；w_down 的标准差 down_gain/√d_ff；lm_head 的标准差 head_gain/√d_model；
    RMSNorm 的权重全为 1。默认值（全是 1）是"方差保持"的初始化；第 3 讲的 QCFG 改了其中几个（见 quant_lab）。
    【真实模型】tied = True：lm_head 就是词嵌入矩阵的转置（SmolLM2 这样；参数量只算一次）；
    dtype = "float64"（默认：玩具模型和种子都用它）或 "float32"：模型的权重、激活、RoPE 表、遮罩和 KV cache
    全部用这个类型（numpy 里 float32 × float64 会升成 float64，所以每一处都要显式地用同一个类型）。
    """
    name: str = "tiny"
    vocab: int = 64
    d_model: int = 32
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 8
    d_ff: int = 64
    max_seq: int = 128
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    emb_std: float = 1.0
    in_gain: float = 1.0
    wo_gain: float = 1.0
    down_gain: float = 1.0
    head_gain: float = 1.0
    tied: bool = False
    dtype: str = "float64"

    def __post_init__(self):
        for f in ("vocab", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff", "max_seq"):
            v = getattr(self, f)
            if not (isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1):
                raise ValueError(f"LMConfig.{f} 必须是正整数（收到 {v!r}）")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads = {self.n_heads} 必须是 n_kv_heads = {self.n_kv_heads} 的整数倍（GQA 分组）")
        if self.head_dim % 2:
            raise ValueError(f"head_dim = {self.head_dim} 必须是偶数（RoPE 把它分成两半旋转）")
        if self.dtype not in DTYPES:
            raise ValueError(f"LMConfig.dtype 必须是 {' 或 '.join(DTYPES)}（收到 {self.dtype!r}）")

    @property
    def group(self):
        return self.n_heads // self.n_kv_heads

    def to_model_config(self):
        """对应的 llm_math.ModelConfig（参数量、matmul_params、analytic_ops 都用它）。"""
        return ModelConfig(self.name, vocab=self.vocab, d_model=self.d_model, n_layers=self.n_layers,
                           n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, head_dim=self.head_dim,
                           d_ff=self.d_ff, tied=self.tied, max_seq=self.max_seq)


# 第 2 讲的演示模型：Llama 的形状（GQA 组大小 4），尺寸是随意选的小数字，初始化用默认的方差保持尺度（不像语言模型，
# 只用来看形状、账本和缓存；像语言模型的是第 3 讲的 QCFG）。
LEC2_CFG = LMConfig(name="lec2-tiny", vocab=256, d_model=64, n_layers=4, n_heads=8, n_kv_heads=2, head_dim=8,
                    d_ff=192, max_seq=128)


def random_tokens(cfg, batch, n, seed):  # -> [batch, n] int
    """均匀随机的 token：⌊u · vocab⌋，u 来自 np.random.default_rng(seed).random()（均匀分布的 CDF 反查）。"""
    return (np.random.default_rng(seed).random((batch, n)) * cfg.vocab).astype(np.int64)


def config_like(cfg, **overrides):
    """复制一个配置、改几个字段（例如 n_layers=3 得到"只用前 3 层"的草稿模型的配置）。"""
    return replace(cfg, **overrides)


def init_params(cfg, seed=0):
    """
    按 cfg 的初始化尺度随机生成参数 -> dict（picoGPT 的写法：名字同模型自己的权重）。

    P = {"embed": [V, d], "layers": [每层一个 dict], "final_norm": [d], "lm_head": [d, V]}；
    每层：attn_norm [d]、wq [d, H·hd]、wk [d, Hkv·hd]、wv [d, Hkv·hd]、wo [H·hd, d]、
    mlp_norm [d]、w_gate [d, ff]、w_up [d, ff]、w_down [ff, d]。
    P["layers"] 是列表：取前 k 层（pk["layers"] = P["layers"][:k]）就是一个更浅的模型。
    【随机数】只用 standard_normal，按上面的顺序抽，所以同一个 seed 在任何 numpy 版本上得到同样的参数。
    """
    rng = np.random.default_rng(seed)
    d, ff, V = cfg.d_model, cfg.d_ff, cfg.vocab
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    s_in = cfg.in_gain / math.sqrt(d)

    def normal(shape, std):
        return rng.standard_normal(shape) * std

    P = {"embed": normal((V, d), cfg.emb_std), "layers": []}
    for _ in range(cfg.n_layers):
        P["layers"].append({
            "attn_norm": np.ones(d),
            "wq": normal((d, q), s_in), "wk": normal((d, kv), s_in), "wv": normal((d, kv), s_in),
            "wo": normal((q, d), cfg.wo_gain / math.sqrt(q)),
            "mlp_norm": np.ones(d),
            "w_gate": normal((d, ff), s_in), "w_up": normal((d, ff), s_in),
            "w_down": normal((ff, d), cfg.down_gain / math.sqrt(ff)),
        })
    P["final_norm"] = np.ones(d)
    P["lm_head"] = normal((d, V), cfg.head_gain / math.sqrt(d))
    return P


# ---------------------------------------------------------------------------
# 前向计算
# ---------------------------------------------------------------------------
def softmax(x, axis=-1):  # [..., n] -> [..., n]
    """数值稳定的 softmax（先减最大值）。"""
    z = np.exp(x - x.max(axis=axis, keepdims=True))
    return z / z.sum(axis=axis, keepdims=True)


def sample_inverse_cdf(probs, u):  # [..., V], [...] -> [...] (int)
    """
    按概率 probs 抽下标：第一个累积概率 > u·总和 的位置（CDF 反查）。u 是 [0, 1) 的均匀数，形状 = probs 去掉最后一维。

    【边界】概率为 0 的下标永远不会被抽到（它的 CDF 区间是空的）；浮点舍入使 u·总和 落在最后时，
    取最后一个正概率的下标。
    """
    probs = np.asarray(probs, dtype=np.float64)
    c = np.cumsum(probs, axis=-1)
    if probs.ndim == 1:  # 单个分布：快速路径（和下面的一般路径结果相同）
        j = int(np.searchsorted(c, float(u) * c[-1], side="right"))
        return j if j < len(c) else int(np.flatnonzero(probs > 0)[-1])
    x = np.asarray(u, dtype=np.float64) * c[..., -1]
    j = np.sum(c <= x[..., None], axis=-1)
    over = j >= probs.shape[-1]
    if np.any(over):
        last = probs.shape[-1] - 1 - np.argmax((probs > 0)[..., ::-1], axis=-1)
        j = np.where(over, last, j)
    return j


def _check_tree_args(attn_mask, positions, n, p0, max_seq):
    """
    检查 forward 的 attn_mask、positions（缺的那个用普通的因果遮罩 / 连续位置补上）-> (mask [n, p0 + n] bool, positions [n])。

    【边界】形状不对、不是布尔 / 整数、某个新位置看不到它自己、看了它后面的新位置（那样节点的顺序就不是"父节点在前"，
    留下路径之后的缓存也不对）、位置不在 0..max_seq − 1 里，都抛 ValueError。
    """
    S = p0 + n
    later = np.arange(S)[None, :] > (p0 + np.arange(n))[:, None]        # [n, S]：新位置 i 后面的位置
    if attn_mask is None:
        attn_mask = ~later
    attn_mask = np.asarray(attn_mask)
    if attn_mask.shape != (n, S) or attn_mask.dtype != bool:
        raise ValueError(f"attn_mask 必须是形状 [新位置数 {n}, 缓存位置 + 新位置 = {S}] 的布尔数组"
                         f"（收到形状 {attn_mask.shape}、类型 {attn_mask.dtype}）")
    if not attn_mask[np.arange(n), p0 + np.arange(n)].all() or np.any(attn_mask & later):
        raise ValueError("attn_mask 的每个新位置必须能看它自己、不能看它后面的位置（节点按父节点在前的顺序排）")
    positions = p0 + np.arange(n) if positions is None else np.asarray(positions)
    if positions.shape != (n,) or positions.dtype.kind not in "iu" or np.any(positions < 0) or np.any(positions >= max_seq):
        raise ValueError(f"positions 必须是 {n} 个 0..{max_seq - 1} 之间的整数（收到 {positions!r}）")
    return attn_mask, positions


def _mm(a, w):  # [B, n, k] @ [k, m] -> [B, n, m]
    """
    激活乘权重，先摊成二维 [B·n, k] 再乘：numpy 对三维 @ 二维是每个 [n, k] 切片各调一次 BLAS，每次都把整个 w
    读一遍（decode 时 n = 1，批里每条序列各读一遍权重）；摊平后一次 GEMM 只读一遍。结果只差浮点舍入的顺序。
    """
    return (a.reshape(-1, a.shape[-1]) @ w).reshape(a.shape[:-1] + (w.shape[1],))


def _rms_scale(x, eps_d):  # [..., d] -> [..., d]
    """
    RMSNorm 不乘权重的部分，再除以 √d：x / √(Σx² + d·ε) = (x / rms(x)) / √d。
    权重 g 和 √d 在构造模型时已经并进后面的矩阵（少几次 numpy 调用）。
    """
    return x / np.sqrt(np.add.reduce(x * x, axis=-1, keepdims=True) + eps_d)


def _scaled_rows(s, w, dt):  # [k], [k, m] -> 连续存放的 s[:, None] * w，dtype dt
    """
    lm_head 并进最后的 RMSNorm 权重：s[:, None] * w，结果按行连续存放（矩阵乘快）。

    绑定词嵌入时 w 是 embed.T（一个转置的视图）：整块乘再转成连续的要两趟、还要一份 V × d 的临时数组；这里按 4096 列一段
    直接乘进连续的结果里，一趟、不多分配。每个数都是同一次乘法 s_i · w_ij，和整块乘逐位相同。
    """
    out = np.empty(w.shape, dtype=np.result_type(s, w))
    for j in range(0, w.shape[1], 4096):
        np.multiply(s[:, None], w[:, j:j + 4096], out=out[:, j:j + 4096])
    return np.asarray(out, dtype=dt)


def _scale_into(g, w):  # [k, 1], [k, m] -> g * w（w 是刚拼好的、没有别人用的数组：类型够时就地乘）
    if np.result_type(g, w) != w.dtype:
        return g * w
    return np.multiply(g, w, out=w)


class NumpyTransformer:
    """
    Llama 形状的 numpy 模型：params（init_params 的 dict）+ cfg。

    【为了快做的等价变换】（只在构造时做一次；profile 显示 decode 一步的时间几乎全是 numpy 调用的固定开销，
    所以减少调用次数最有效）：
    - wq/wk/wv 拼成一个矩阵、w_gate/w_up 拼成一个矩阵（融合的矩阵乘；账本仍按 q_proj、k_proj、… 分开记）；
    - RMSNorm 的权重 g（和 √d_model）并进紧跟着的矩阵：(x/rms · g) @ W = (x/(rms·√d)) @ (√d·diag(g) W)；注意力的 1/√head_dim 并进 wq；
    - RoPE 写成复数乘法：把 wq、wk 每个头的列重排成 (x₀, x_{hd/2}, x₁, x_{hd/2+1}, …)，相邻两列看成一个复数，
      旋转就是乘 e^{iθ}。q·k 对两边同样的重排不变，所以注意力完全一样（缓存里的 K 也是重排后的）。
    这些变换只改变浮点舍入的顺序：测试断言带缓存的 decode 和一次算完的差别 < 1e-12（float64）。
    params 之后不应再修改。
    【类型】一切按 cfg.dtype（float64 或 float32）算：融合的矩阵、词嵌入、RoPE 表（complex128 / complex64）、遮罩、
    KV cache 都是这个类型，所以 float32 的模型从头到尾是 float32（测试断言 logits 和缓存的 dtype）。
    """

    def __init__(self, params, cfg):
        if len(params["layers"]) != cfg.n_layers:
            raise ValueError(f"params 有 {len(params['layers'])} 层，配置说 n_layers = {cfg.n_layers}")
        self.params, self.cfg = params, cfg
        dt = self._dt = np.dtype(cfg.dtype)
        self._cdt = np.dtype(np.complex64 if dt == np.float32 else np.complex128)
        hd, half = cfg.head_dim, cfg.head_dim // 2
        # 每个头内的列重排：新的第 2i 列 = 原来的第 i 列，第 2i+1 列 = 原来的第 half+i 列
        perm = np.stack([np.arange(half), np.arange(half) + half], axis=1).ravel()

        def rope_cols(w, heads):  # [d, heads·hd] -> 同形状，每个头内重排
            return w.reshape(w.shape[0], heads, hd)[:, :, perm].reshape(w.shape[0], heads * hd)

        self._layers = []
        sd = math.sqrt(cfg.d_model)
        # 乘法都写进刚拼好的数组里（out=）：每个数的运算和写成 g1 * concat(...) 一样，只是不再多分配一份同样大的临时数组
        # （float64 的 SmolLM2 有 1 GB 权重，构造时间大半是分配和写内存）
        for L in params["layers"]:
            g1, g2 = sd * L["attn_norm"][:, None], sd * L["mlp_norm"][:, None]
            wq = rope_cols(L["wq"], cfg.n_heads)
            wq /= math.sqrt(hd)
            wk = rope_cols(L["wk"], cfg.n_kv_heads)
            wqkv = np.concatenate([wq, wk, L["wv"]], axis=1)
            wgu = np.concatenate([L["w_gate"], L["w_up"]], axis=1)
            wqkv, wgu = _scale_into(g1, wqkv), _scale_into(g2, wgu)
            self._layers.append((np.asarray(wqkv, dtype=dt), np.asarray(L["wo"], dtype=dt),
                                 np.asarray(wgu, dtype=dt), np.asarray(L["w_down"], dtype=dt)))
        self._head = _scaled_rows(sd * params["final_norm"], params["lm_head"], dt)
        self._embed = np.asarray(params["embed"], dtype=dt)
        inv_freq = cfg.rope_theta ** (-np.arange(half) / half)
        ang = np.arange(cfg.max_seq)[:, None] * inv_freq[None, :]      # [max_seq, hd/2]，角度按 float64 算
        self._rot = np.exp(1j * ang).astype(self._cdt)                 # e^{iθ}，[max_seq, hd/2]
        self._eps_d = cfg.d_model * cfg.norm_eps
        self.matmul_hook = None                                        # 每次权重矩阵乘之前的输入变换（见 linear）
        self.matmul = _mm                                              # 权重矩阵乘本身（引擎的"批不变"模式换掉它）

    def new_cache(self, batch=1, max_len=None):
        return KVCache(self.cfg, batch, max_len)

    # ---- 模型的零件：forward 按顺序调用它们；第 5 讲的引擎（runner_lab）把一个不规则的批摊成 [N, d] 也调用它们 ----
    # 数学只在这里写一次。每个零件都接受任意的前导维 [..., d]（forward 用 [B, n, d]，引擎用 [N, d]）。
    def embed(self, toks):  # [...] int -> [..., d]
        """词嵌入：查表。"""
        return self._embed[toks]

    def rms_scale(self, x):  # [..., d] -> [..., d]
        """RMSNorm 不乘权重的部分（权重 g 和 √d 已并进后面的矩阵，见类的说明）。"""
        return _rms_scale(x, self._eps_d)

    def linear(self, x, w, op, li):  # [..., k], [k, m] -> [..., m]
        """
        一次权重矩阵乘 x @ w（先摊成二维，见 _mm）。

        【钩子】self.matmul_hook 不是 None 时，先把输入换成 matmul_hook(op, li, x)（同形状）再乘：
        激活量化、在线旋转（第 3 讲）从这里插进来。op ∈ {"qkv", "o_proj", "gate_up", "down", "lm_head"}，
        li 是层号（lm_head 是 -1）。默认 None：不多做任何运算，forward 的每个字节不变。
        """
        if self.matmul_hook is not None:
            x = self.matmul_hook(op, li, x)
        return self.matmul(x, w)

    def qkv_proj(self, li, h):  # [..., d] -> [..., nq + 2·nkv]
        """第 li 层融合的 q/k/v 投影（q、k 的列已按 RoPE 的复数写法重排，q 已乘 1/√hd）。"""
        return self.linear(h, self._layers[li][0], "qkv", li)

    def rope_table(self, positions):  # [n] int -> [n, 1, hd/2] complex
        """每个 token 自己的位置的 e^{iθ}（RoPE 表里取行）：位置可以任意（引擎里不同序列的 token 位置各不相同）。"""
        return self._rot[positions][:, None, :]

    def rope(self, qkv, rot):  # [..., nq + 2·nkv], [..., 1, hd/2] -> [..., H + Hkv, hd]
        """q 和 k 一起转 RoPE：相邻两列看成一个复数，乘 e^{iθ}（rot 由 rope_table 或 RoPE 表的切片给）。"""
        cfg = self.cfg
        H, Hkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        c = qkv[..., :(H + Hkv) * hd].view(self._cdt).reshape(qkv.shape[:-1] + (H + Hkv, hd // 2))
        return (c * rot).view(self._dt)

    def attention(self, q, K, Vv, mask):  # [B, n, H, hd], [B, Hkv, S, hd] ×2, [n, S] 或 None -> [B, n, H·hd]
        """
        注意力的核心：softmax(q·Kᵀ + mask)·V（1/√hd 已并进 wq）。mask 是加性的（0 = 能看，−inf = 不能看），None = 全能看。

        【GQA】第 h 个 query 头 = 第 h // G 个 KV 头的第 h % G 个；把同组的头和位置摞在一起做一次矩阵乘。
        """
        B, n, H, hd = q.shape
        Hkv, S = K.shape[1], K.shape[2]
        G = H // Hkv
        qg = q.reshape(B, n, Hkv, G, hd).transpose(0, 2, 3, 1, 4).reshape(B, Hkv, G * n, hd)
        s = qg @ K.transpose(0, 1, 3, 2)                                 # [B, Hkv, G·n, S]
        if mask is not None:
            s = (s.reshape(B, Hkv, G, n, S) + mask).reshape(B, Hkv, G * n, S)
        p = np.exp(s - np.maximum.reduce(s, axis=-1, keepdims=True))
        a = (p / np.add.reduce(p, axis=-1, keepdims=True)) @ Vv          # softmax · V，[B, Hkv, G·n, hd]
        return a.reshape(B, Hkv, G, n, hd).transpose(0, 3, 1, 2, 4).reshape(B, n, H * hd)

    def o_proj(self, li, a):  # [..., H·hd] -> [..., d]
        """第 li 层注意力的输出投影。"""
        return self.linear(a, self._layers[li][1], "o_proj", li)

    def mlp(self, li, h):  # [..., d] -> [..., d]
        """第 li 层的 SwiGLU：(SiLU(h·W_gate) ⊙ h·W_up)·W_down（gate、up 融合成一次矩阵乘）。"""
        ff = self.cfg.d_ff
        gu = self.linear(h, self._layers[li][2], "gate_up", li)          # [..., 2·ff]
        gate = gu[..., :ff]
        act = gate / (1.0 + np.exp(-gate)) * gu[..., ff:]                # SiLU(gate)·up
        return self.linear(act, self._layers[li][3], "down", li)

    def lm_head(self, h):  # [..., d] -> [..., V]
        """最后的 RMSNorm 权重已并进 lm_head：输入是 rms_scale(x)。"""
        return self.linear(h, self._head, "lm_head", -1)

    def forward(self, toks, cache=None, counter=None, attn_mask=None, positions=None):  # [B, n] -> [B, n, V]
        """
        喂 toks（每个序列 n 个新 token），写进 cache，返回这 n 个位置的 logits。

        【参数】cache=None 时用一个新的缓存（一次算完整个序列）；counter 不为 None 时把账记上。
        attn_mask [n, 已缓存 + n]（布尔，True = 能看）和 positions [n]（RoPE 位置）：树形注意力用（见 tree_mask）；
        都不给时是普通的因果遮罩、位置接着缓存往后数。新 token 总是写进缓存的第 pos.. 个槽，不管它的 RoPE 位置。
        【边界】cache 放不下（已有位置 + n > 缓存长度）时抛 ValueError；token 越界也抛 ValueError；
        遮罩或位置不合规矩（见 _check_tree_args）也抛 ValueError。
        """
        cfg = self.cfg
        toks = np.asarray(toks)
        if toks.ndim != 2 or toks.shape[1] < 1:
            raise ValueError(f"toks 必须是形状 [批, 长度 ≥ 1] 的整数数组（收到形状 {toks.shape}）")
        B, n = toks.shape
        if cache is None:
            cache = self.new_cache(B, n)
        if cache.batch != B:
            raise ValueError(f"缓存的批大小是 {cache.batch}，toks 的批大小是 {B}")
        p0 = cache.pos
        S = p0 + n
        if S > cache.max_len:
            raise ValueError(f"序列长度 {S} 超过 KV cache 的长度 {cache.max_len}（模型上下文 max_seq = {cfg.max_seq}）")
        if toks.min() < 0 or toks.max() >= cfg.vocab:
            raise ValueError(f"token 必须在 0..{cfg.vocab - 1} 之间")
        if attn_mask is not None or positions is not None:
            attn_mask, positions = _check_tree_args(attn_mask, positions, n, p0, cfg.max_seq)
        H, Hkv, hd, ff = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
        nq, nkv = H * hd, Hkv * hd
        rot = self._rot[p0:S, None, :] if positions is None else self.rope_table(positions)  # [n, 1, hd/2]
        mask = None
        if attn_mask is not None:  # 树形注意力：调用者给的遮罩
            mask = np.where(attn_mask, 0.0, -np.inf).astype(self._dt)
        elif n > 1:  # 新位置 i（绝对位置 p0 + i）只能看 ≤ p0 + i 的位置
            mask = np.where(np.arange(S)[None, :] > (p0 + np.arange(n))[:, None], -np.inf, 0.0).astype(self._dt)
        add = counter.add if counter is not None else None
        e = ELEMENTWISE_FLOPS
        x = self.embed(toks)                                             # [B, n, d]
        if add:
            add("embed", 0, 0, x.size * BYTES_PER_EL, 0)
        for li in range(cfg.n_layers):
            L = self.params["layers"][li] if add else None
            h = self.rms_scale(x)
            qkv = self.qkv_proj(li, h)                                   # [B, n, nq + 2·nkv]
            qk = self.rope(qkv, rot)                                     # [B, n, H + Hkv, hd]
            cache.k[li, :, :, p0:S] = qk[:, :, H:].transpose(0, 2, 1, 3)
            cache.v[li, :, :, p0:S] = qkv[..., nq + nkv:].reshape(B, n, Hkv, hd).transpose(0, 2, 1, 3)
            K, Vv = cache.k[li, :, :, :S], cache.v[li, :, :, :S]           # [B, Hkv, S, hd]
            a = self.attention(qk[:, :, :H], K, Vv, mask)                # [B, n, nq]
            x = x + self.o_proj(li, a)
            if add:  # 账按真实数组的形状记：矩阵乘 2·(行数)·(权重的输入维)·(输出维)
                wo = self._layers[li][1]
                s_size = B * H * n * S                                   # 打分矩阵 s 的元素数
                rows = h.shape[0] * h.shape[1]
                add("attn_norm", e["norm"] * h.size, 0, cfg.d_model * BYTES_PER_EL, 0)
                for op in ("q_proj", "k_proj", "v_proj"):
                    W = L["w" + op[0]]                                   # 原始的（未融合的）权重矩阵
                    add(op, 2 * rows * W.size, 2 * rows * W.size, W.size * BYTES_PER_EL, 0)
                add("rope", e["rope"] * qk.size, 0, 0, 0)
                # 打分和加权和都按整个矩形执行；因果遮罩下真正需要的 (query, key) 对数单独数
                visible = int(np.count_nonzero(mask == 0)) if mask is not None else n * S
                rect = 2 * s_size * hd
                useful = 2 * B * H * visible * hd
                add("attn_scores", rect, useful, 0, K.size * BYTES_PER_EL)
                add("attn_softmax", e["softmax"] * s_size, 0, 0, 0)
                add("attn_av", rect, useful, 0, Vv.size * BYTES_PER_EL)
                add("o_proj", 2 * rows * wo.size, 2 * rows * wo.size, wo.size * BYTES_PER_EL, 0)
                add("attn_residual", e["residual"] * x.size, 0, 0, 0)
            h = self.rms_scale(x)
            x = x + self.mlp(li, h)
            if add:
                wdown = self._layers[li][3]
                add("mlp_norm", e["norm"] * h.size, 0, cfg.d_model * BYTES_PER_EL, 0)
                for op in ("mlp_gate", "mlp_up"):
                    W = L["w_" + op[4:]]
                    add(op, 2 * rows * W.size, 2 * rows * W.size, W.size * BYTES_PER_EL, 0)
                add("mlp_act", e["act"] * (h.size // cfg.d_model) * ff, 0, 0, 0)
                add("mlp_down", 2 * rows * wdown.size, 2 * rows * wdown.size, wdown.size * BYTES_PER_EL, 0)
                add("mlp_residual", e["residual"] * x.size, 0, 0, 0)
        h = self.rms_scale(x)
        logits = self.lm_head(h)                                         # [B, n, V]
        if add:
            add("final_norm", e["norm"] * h.size, 0, cfg.d_model * BYTES_PER_EL, 0)
            add("lm_head", 2 * B * n * self._head.size, 2 * B * n * self._head.size,
                self._head.size * BYTES_PER_EL, 0)
        cache.pos = S
        return logits
