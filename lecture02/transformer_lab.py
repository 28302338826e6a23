"""
transformer_lab —— 一个 Llama 形状的 numpy transformer，和它的逐运算账本。

【模型】decoder-only：词嵌入 → n_layers × [RMSNorm → 注意力（RoPE、GQA）→ 残差 → RMSNorm → SwiGLU FFN → 残差]
→ RMSNorm → lm_head（不和词嵌入共享）。权重存成 (输入维, 输出维)，前向是 x @ W（picoGPT 的写法）。
全部用 **float64** 计算：带 KV cache 的增量 decode 和一次算完整个序列，差别只有浮点舍入（测试断言 < 1e-12），
而且选出的 token 完全一样——这是后面所有"精确"结论（回滚、投机解码不改变分布）的前提。

【KV cache】预先分配好的数组 + 一个位置 pos（likejazz/llama3.np、karpathy/nanochat 的做法）：
写入第 pos.. 个位置；回滚就是把 pos 往回挪（先检查不越界）。回滚后再喂同样的 token，得到的状态和从头算一样。

【账本（Counter）】模型真的运行时，每个算子按**实际数组的形状**把四个数记到账上：
- "flops"：代码真正执行的浮点运算。矩阵乘 2·m·n·k；逐元素运算按每个元素的固定次数（见 ELEMENTWISE_FLOPS）；
  注意力的打分和 softmax 按整个矩形算（因果遮罩挡住的那一半也算了，代码确实算了）。
- "useful"：数学上需要的矩阵乘 FLOPs——因果遮罩挡住的上半部分不算；softmax、norm、RoPE、激活都算 0。
  这是 roofline 里拿去和 peak_flops 比的"张量核心的活"。
- "w"：读的权重字节，按 BF16（每个 2 字节）记，不管 numpy 里是什么 dtype；一次前向每个权重矩阵读一遍。
- "kv"：注意力读的 K 和 V 的字节，按 BF16 记，包括缓存里的和这次新算的所有被看的位置。
analytic_ops 用公式算同样的四个数。测试断言：同样的形状，真实运行的账本和公式**逐算子、逐字段完全相等**。

【随机数】init_params 只用 rng.standard_normal；采样只用 rng.random() 的均匀数，自己做 CDF 反查
（cumsum + searchsorted），所以打印出来的抽样结果不依赖 numpy 的版本（choice / integers 的实现会变）。
"""
import math
import os
import sys
from dataclasses import dataclass, replace

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lecture01"))
from llm_math import ModelConfig  # noqa: E402

__all__ = ["LMConfig", "LEC2_CFG", "random_tokens", "init_params", "config_like", "NumpyTransformer", "KVCache", "Counter",
           "analytic_ops", "sum_rows", "MATMUL_OPS", "ATTN_CORE_OPS", "ALL_OPS", "ELEMENTWISE_FLOPS",
           "FIELDS", "BYTES_PER_EL", "softmax", "sample_inverse_cdf",
           "tree_mask"]

# 一次前向里的算子，按执行顺序。每层的算子在账本里按名字累加（所有层合在一行）。
ALL_OPS = ("embed", "attn_norm", "q_proj", "k_proj", "v_proj", "rope", "attn_scores", "attn_softmax",
           "attn_av", "o_proj", "attn_residual", "mlp_norm", "mlp_gate", "mlp_up", "mlp_act", "mlp_down",
           "mlp_residual", "final_norm", "lm_head")
MATMUL_OPS = ("q_proj", "k_proj", "v_proj", "o_proj", "mlp_gate", "mlp_up", "mlp_down", "lm_head")
ATTN_CORE_OPS = ("attn_scores", "attn_softmax", "attn_av")
FIELDS = ("flops", "useful", "w", "kv")
BYTES_PER_EL = 2  # 账本里的字节按 BF16 记

# 逐元素运算每个元素算几次 FLOP（约定，真实运行和公式用同一张表）：
ELEMENTWISE_FLOPS = {
    "norm": 4,      # RMSNorm：平方、求和、乘 1/rms、乘权重
    "rope": 3,      # 旋转：x·cos + rot(x)·sin 每个输出元素 2 次乘 1 次加
    "softmax": 5,   # 缩放、减最大值、exp、求和、除
    "act": 5,       # SiLU(gate)·up：取负、exp、加 1、除、乘 up
    "residual": 1,  # 残差相加
}


# ---------------------------------------------------------------------------
# 配置与初始化
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class LMConfig:
    """
    numpy 小模型的配置。结构字段之外，初始化的尺度也是配置的一部分（init_params 读它们）。

    【初始化】词嵌入 N(0, emb_std²)；wq/wk/wv/w_gate/w_up 的标准差 in_gain/√d_model；
    wo 的标准差 wo_gain/√(n_heads·head_dim)；w_down 的标准差 down_gain/√d_ff；lm_head 的标准差 head_gain/√d_model；
    RMSNorm 的权重全为 1。默认值（全是 1）是"方差保持"的初始化；第 3 讲的 QCFG 改了其中几个（见 quant_lab）。
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

    def __post_init__(self):
        for f in ("vocab", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff", "max_seq"):
            v = getattr(self, f)
            if not (isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1):
                raise ValueError(f"LMConfig.{f} 必须是正整数（收到 {v!r}）")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads = {self.n_heads} 必须是 n_kv_heads = {self.n_kv_heads} 的整数倍（GQA 分组）")
        if self.head_dim % 2:
            raise ValueError(f"head_dim = {self.head_dim} 必须是偶数（RoPE 把它分成两半旋转）")

    @property
    def group(self):
        return self.n_heads // self.n_kv_heads

    def to_model_config(self):
        """对应的 llm_math.ModelConfig（参数量、matmul_params、analytic_ops 都用它）。"""
        return ModelConfig(self.name, vocab=self.vocab, d_model=self.d_model, n_layers=self.n_layers,
                           n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, head_dim=self.head_dim,
                           d_ff=self.d_ff, max_seq=self.max_seq)


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
# 账本
# ---------------------------------------------------------------------------
class Counter:
    """逐算子的账本：op 名 -> {"flops", "useful", "w", "kv"}，都是 Python 整数（精确）。"""

    def __init__(self):
        self.ops = {}

    def add(self, op, flops=0, useful=0, w=0, kv=0):
        row = self.ops.setdefault(op, dict.fromkeys(FIELDS, 0))
        row["flops"] += int(flops)
        row["useful"] += int(useful)
        row["w"] += int(w)
        row["kv"] += int(kv)

    def total(self, field, ops=None):
        """ops 这些算子（None = 全部）的 field 之和。"""
        if field not in FIELDS:
            raise ValueError(f"未知的字段 {field!r}；可用：{', '.join(FIELDS)}")
        return sum(r[field] for op, r in self.ops.items() if ops is None or op in ops)

    def rows(self):
        """和 analytic_ops 同样格式的行（按 ALL_OPS 的顺序）。"""
        return [dict(op=op, **self.ops[op]) for op in ALL_OPS if op in self.ops]


def _causal_pairs(n_new, n_past):
    """n_new 个新位置、前面已有 n_past 个位置时，因果注意力里 (query, key) 的对数。"""
    return n_new * n_past + n_new * (n_new + 1) // 2


def _layer_ledger(add, cfg, B, n, n_past):
    """一层的账，从配置用公式算（真实运行的账在 NumpyTransformer.forward 里按数组形状记，两者互相核对）。"""
    d, ff, hd = cfg.d_model, cfg.d_ff, cfg.head_dim
    H, Hkv = cfg.n_heads, cfg.n_kv_heads
    t = B * n                       # 这一步的 token 数
    S = n_past + n                  # 被看的位置数（缓存的 + 新的）
    e = ELEMENTWISE_FLOPS
    add("attn_norm", e["norm"] * t * d, 0, d * BYTES_PER_EL, 0)
    for op, k_in, k_out in (("q_proj", d, H * hd), ("k_proj", d, Hkv * hd), ("v_proj", d, Hkv * hd)):
        add(op, 2 * t * k_in * k_out, 2 * t * k_in * k_out, k_in * k_out * BYTES_PER_EL, 0)
    add("rope", e["rope"] * t * (H + Hkv) * hd, 0, 0, 0)
    rect = 2 * B * H * n * S * hd
    causal = 2 * B * H * _causal_pairs(n, n_past) * hd
    kv_bytes = B * Hkv * S * hd * BYTES_PER_EL
    add("attn_scores", rect, causal, 0, kv_bytes)
    add("attn_softmax", e["softmax"] * B * H * n * S, 0, 0, 0)
    add("attn_av", rect, causal, 0, kv_bytes)
    add("o_proj", 2 * t * H * hd * d, 2 * t * H * hd * d, H * hd * d * BYTES_PER_EL, 0)
    add("attn_residual", e["residual"] * t * d, 0, 0, 0)
    add("mlp_norm", e["norm"] * t * d, 0, d * BYTES_PER_EL, 0)
    for op in ("mlp_gate", "mlp_up"):
        add(op, 2 * t * d * ff, 2 * t * d * ff, d * ff * BYTES_PER_EL, 0)
    add("mlp_act", e["act"] * t * ff, 0, 0, 0)
    add("mlp_down", 2 * t * ff * d, 2 * t * ff * d, ff * d * BYTES_PER_EL, 0)
    add("mlp_residual", e["residual"] * t * d, 0, 0, 0)


def _edge_ledger(add, cfg, B, n, n_head_rows):
    """层外面的账：词嵌入查表、最后的 RMSNorm、lm_head（算 n_head_rows 个位置）。"""
    d, V = cfg.d_model, cfg.vocab
    add("embed", 0, 0, B * n * d * BYTES_PER_EL, 0)  # 查表：读 B·n 行（重复的行也按读一次算）
    add("final_norm", ELEMENTWISE_FLOPS["norm"] * B * n * d, 0, d * BYTES_PER_EL, 0)
    add("lm_head", 2 * n_head_rows * d * V, 2 * n_head_rows * d * V, d * V * BYTES_PER_EL, 0)


def analytic_ops(model_cfg, B, n_new, n_past, last_only=False):
    """
    用公式算一次前向（B 个序列，每个 n_new 个新位置，前面已缓存 n_past 个）的账 -> 行的列表，每个算子一行：
    {"op", "flops", "useful", "w", "kv"}（所有层合在一行）。

    【参数】model_cfg：llm_math.ModelConfig，或任何有 to_model_config() 的配置（LMConfig）。
    last_only=True：lm_head 只算最后一个位置（生成时真正需要的）；False：每个位置都算（TransformerLM 的做法）。
    【边界】MoE 配置不在这里（numpy 模型是稠密的）：抛 ValueError。
    """
    cfg = model_cfg.to_model_config()
    if getattr(cfg, "is_moe", False):
        raise ValueError(f"analytic_ops 只支持稠密模型（{cfg.name} 是 MoE）")
    if B < 1 or n_new < 1 or n_past < 0:
        raise ValueError(f"需要 B ≥ 1、n_new ≥ 1、n_past ≥ 0（收到 B={B}, n_new={n_new}, n_past={n_past}）")
    c = Counter()
    _edge_ledger(c.add, cfg, B, n_new, B * (1 if last_only else n_new))
    for _ in range(cfg.n_layers):
        _layer_ledger(c.add, cfg, B, n_new, n_past)
    return c.rows()


def sum_rows(rows, field, ops=None):
    """rows 里属于 ops（None = 全部）的行的 field 之和。"""
    if field not in FIELDS:
        raise ValueError(f"未知的字段 {field!r}；可用：{', '.join(FIELDS)}")
    return sum(r[field] for r in rows if ops is None or r["op"] in ops)


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


class KVCache:
    """
    预先分配的 KV cache：k, v 形状 [层, B, Hkv, max_len, head_dim]，pos = 已经写入的位置数。

    rollback(n)：丢掉最后 n 个位置（只挪 pos；被丢掉的位置之后会被覆盖）。
    keep(start, offsets)：只留下 start 以后的几个位置、按顺序挪到一起（树形验证之后留下被接受的路径）。
    quant：None（默认：float64 原样存）或者一个函数 f(块) -> 同形状的块，K 和 V 每次写进缓存时先经过它
    （量化再反量化：缓存里存的就是低精度的值；第 3 讲 06 用它，见本文件末尾的 quantizing_store）。
    """

    def __init__(self, cfg, batch, max_len=None, quant=None):
        max_len = cfg.max_seq if max_len is None else max_len
        if max_len > cfg.max_seq:
            raise ValueError(f"KV cache 长度 {max_len} 超过模型的上下文 max_seq = {cfg.max_seq}")
        shape = (cfg.n_layers, batch, cfg.n_kv_heads, max_len, cfg.head_dim)
        self.k = np.zeros(shape)
        self.v = np.zeros(shape)
        if quant is not None:
            self.k, self.v = quantizing_store(self.k, quant), quantizing_store(self.v, quant)
        self.batch, self.max_len, self.pos = batch, max_len, 0

    def rollback(self, n):
        """丢掉最后 n 个位置。n 必须在 0..pos 之间，否则抛 ValueError。"""
        if not 0 <= n <= self.pos:
            raise ValueError(f"回滚 {n} 个位置超出范围：缓存里只有 {self.pos} 个位置（允许 0..{self.pos}）")
        self.pos -= n

    def keep(self, start, offsets):
        """
        只留下第 start 个位置以后的 offsets 这几个位置，按原来的顺序挪到 start, start + 1, …；pos = start + len(offsets)。

        【用途】树形验证之后留下被接受的那条路径（树的节点在缓存里按节点顺序排，路径上的节点不相邻）：
        路径节点的 K 已经按它的深度转过 RoPE，挪到 start + 深度 − 1 之后，缓存和从头喂"前缀 + 这条路径"的一样。
        【参数】offsets：相对 start 的下标，严格递增（批里每个序列留同样的位置）。
        【边界】start 不在 0..pos、offsets 不是 0..pos − start − 1 里严格递增的整数时抛 ValueError；
        offsets 为空就是 rollback(pos − start)。
        """
        if not (isinstance(start, (int, np.integer)) and not isinstance(start, bool) and 0 <= start <= self.pos):
            raise ValueError(f"start = {start!r} 超出范围：缓存里有 {self.pos} 个位置（允许 0..{self.pos}）")
        offs = np.asarray(offsets)
        n_new = self.pos - start
        if offs.size == 0:
            offs = np.zeros(0, dtype=np.int64)
        if (offs.ndim != 1 or offs.dtype.kind not in "iu" or np.any(offs < 0) or np.any(offs >= n_new)
                or np.any(np.diff(offs) <= 0)):
            raise ValueError(f"offsets 必须是 0..{n_new - 1} 里严格递增的整数（start = {start} 之后有 {n_new} 个位置），"
                             f"收到 {list(np.ravel(offsets))}")
        m = len(offs)
        self.k[:, :, :, start:start + m] = self.k[:, :, :, start + offs]   # 右边先取出副本，重叠也没关系
        self.v[:, :, :, start:start + m] = self.v[:, :, :, start + offs]
        self.pos = start + m


def tree_mask(parents, n_past):  # [n] -> [n, n_past + n] bool, [n] int
    """
    一棵 token 树的注意力遮罩和 RoPE 位置 -> (mask, positions)，交给 NumpyTransformer.forward 一次算完整棵树。

    【参数】parents[i]：第 i 个新位置的父节点，-1 = 接在已缓存的 n_past 个位置后面，否则是更早的新位置的下标 0..i−1
    （节点按"父节点在前"的顺序排，例如按层）。
    mask[i, j] = True 表示新位置 i 能看第 j 个位置：缓存里的 n_past 个位置全都能看，新位置里只看自己的祖先和自己。
    positions[i] = n_past + depth(i) − 1，depth = 到缓存的步数（父节点是 -1 的节点深度为 1）：兄弟节点位置相同。
    【边界】链 parents = [-1, 0, 1, …] 得到普通的因果遮罩和位置 n_past, n_past + 1, …；
    空的或不是一维的 parents、parents[i] 不在 -1..i−1 里、n_past < 0 抛 ValueError。
    """
    arr = np.asarray(parents)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"parents 必须是非空的一维整数列表（收到 {parents!r}）")
    par = list(arr)
    if not (isinstance(n_past, (int, np.integer)) and not isinstance(n_past, bool) and n_past >= 0):
        raise ValueError(f"n_past 必须是 ≥ 0 的整数（收到 {n_past!r}）")
    n = len(par)
    mask = np.zeros((n, n_past + n), dtype=bool)
    mask[:, :n_past] = True
    depth = np.ones(n, dtype=np.int64)
    for i, a in enumerate(par):
        if not (isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_)) and -1 <= a < i):
            raise ValueError(f"parents[{i}] = {a!r}：父节点必须是 -1（接在缓存后面）或更早的节点 0..{i - 1}")
        if a >= 0:
            mask[i, n_past:n_past + i] = mask[a, n_past:n_past + i]   # 父节点的祖先（和父节点自己）
            depth[i] = depth[a] + 1
        mask[i, n_past + i] = True
    return mask, n_past + depth - 1


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


def _rms_scale(x, eps_d):  # [..., d] -> [..., d]
    """
    RMSNorm 不乘权重的部分，再除以 √d：x / √(Σx² + d·ε) = (x / rms(x)) / √d。
    权重 g 和 √d 在构造模型时已经并进后面的矩阵（少几次 numpy 调用）。
    """
    return x / np.sqrt(np.add.reduce(x * x, axis=-1, keepdims=True) + eps_d)


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
    """

    def __init__(self, params, cfg):
        if len(params["layers"]) != cfg.n_layers:
            raise ValueError(f"params 有 {len(params['layers'])} 层，配置说 n_layers = {cfg.n_layers}")
        self.params, self.cfg = params, cfg
        hd, half = cfg.head_dim, cfg.head_dim // 2
        # 每个头内的列重排：新的第 2i 列 = 原来的第 i 列，第 2i+1 列 = 原来的第 half+i 列
        perm = np.stack([np.arange(half), np.arange(half) + half], axis=1).ravel()

        def rope_cols(w, heads):  # [d, heads·hd] -> 同形状，每个头内重排
            return w.reshape(w.shape[0], heads, hd)[:, :, perm].reshape(w.shape[0], heads * hd)

        self._layers = []
        sd = math.sqrt(cfg.d_model)
        for L in params["layers"]:
            g1, g2 = sd * L["attn_norm"][:, None], sd * L["mlp_norm"][:, None]
            wq = rope_cols(L["wq"], cfg.n_heads) / math.sqrt(hd)
            wk = rope_cols(L["wk"], cfg.n_kv_heads)
            wqkv = np.ascontiguousarray(g1 * np.concatenate([wq, wk, L["wv"]], axis=1))
            wgu = np.ascontiguousarray(g2 * np.concatenate([L["w_gate"], L["w_up"]], axis=1))
            self._layers.append((wqkv, L["wo"], wgu, L["w_down"]))
        self._head = sd * params["final_norm"][:, None] * params["lm_head"]
        inv_freq = cfg.rope_theta ** (-np.arange(half) / half)
        ang = np.arange(cfg.max_seq)[:, None] * inv_freq[None, :]      # [max_seq, hd/2]
        self._rot = np.exp(1j * ang)                                   # e^{iθ}，[max_seq, hd/2]

    def new_cache(self, batch=1, max_len=None):
        return KVCache(self.cfg, batch, max_len)

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
        H, Hkv, hd, G, ff = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.group, cfg.d_ff
        nq, nkv = H * hd, Hkv * hd
        eps_d = cfg.d_model * cfg.norm_eps
        rot = self._rot[p0:S, None, :] if positions is None else self._rot[positions][:, None, :]  # [n, 1, hd/2]
        mask = None
        if attn_mask is not None:  # 树形注意力：调用者给的遮罩
            mask = np.where(attn_mask, 0.0, -np.inf)
        elif n > 1:  # 新位置 i（绝对位置 p0 + i）只能看 ≤ p0 + i 的位置
            mask = np.where(np.arange(S)[None, :] > (p0 + np.arange(n))[:, None], -np.inf, 0.0)  # [n, S]
        add = counter.add if counter is not None else None
        e = ELEMENTWISE_FLOPS
        x = self.params["embed"][toks]                                   # [B, n, d]
        if add:
            add("embed", 0, 0, x.size * BYTES_PER_EL, 0)
        for li, (wqkv, wo, wgu, wdown) in enumerate(self._layers):
            L = self.params["layers"][li] if add else None
            h = _rms_scale(x, eps_d)
            qkv = h @ wqkv                                               # [B, n, nq + 2·nkv]
            # RoPE：q 和 k 一起，按复数乘 e^{iθ}
            qk = (qkv[..., :nq + nkv].view(np.complex128).reshape(B, n, H + Hkv, hd // 2) * rot).view(np.float64)
            cache.k[li, :, :, p0:S] = qk[:, :, H:].transpose(0, 2, 1, 3)
            cache.v[li, :, :, p0:S] = qkv[..., nq + nkv:].reshape(B, n, Hkv, hd).transpose(0, 2, 1, 3)
            K, Vv = cache.k[li, :, :, :S], cache.v[li, :, :, :S]           # [B, Hkv, S, hd]
            # 第 h 个 query 头 = 第 h // G 个 KV 头的第 h % G 个；把同组的头和位置摞在一起做一次矩阵乘
            qg = qk[:, :, :H].reshape(B, n, Hkv, G, hd).transpose(0, 2, 3, 1, 4).reshape(B, Hkv, G * n, hd)
            s = qg @ K.transpose(0, 1, 3, 2)                             # [B, Hkv, G·n, S]（1/√hd 已并进 wq）
            if mask is not None:
                s = (s.reshape(B, Hkv, G, n, S) + mask).reshape(B, Hkv, G * n, S)
            p = np.exp(s - np.maximum.reduce(s, axis=-1, keepdims=True))
            a = (p / np.add.reduce(p, axis=-1, keepdims=True)) @ Vv      # softmax · V，[B, Hkv, G·n, hd]
            a = a.reshape(B, Hkv, G, n, hd).transpose(0, 3, 1, 2, 4).reshape(B, n, nq)
            x = x + a @ wo
            if add:  # 账按真实数组的形状记：矩阵乘 2·(行数)·(权重的输入维)·(输出维)
                rows = h.shape[0] * h.shape[1]
                add("attn_norm", e["norm"] * h.size, 0, cfg.d_model * BYTES_PER_EL, 0)
                for op in ("q_proj", "k_proj", "v_proj"):
                    W = L["w" + op[0]]                                   # 原始的（未融合的）权重矩阵
                    add(op, 2 * rows * W.size, 2 * rows * W.size, W.size * BYTES_PER_EL, 0)
                add("rope", e["rope"] * qk.size, 0, 0, 0)
                # 打分和加权和都按整个矩形执行；因果遮罩下真正需要的 (query, key) 对数单独数
                visible = int(np.count_nonzero(mask == 0)) if mask is not None else n * S
                rect = 2 * s.size * hd
                useful = 2 * B * H * visible * hd
                add("attn_scores", rect, useful, 0, K.size * BYTES_PER_EL)
                add("attn_softmax", e["softmax"] * s.size, 0, 0, 0)
                add("attn_av", rect, useful, 0, Vv.size * BYTES_PER_EL)
                add("o_proj", 2 * rows * wo.size, 2 * rows * wo.size, wo.size * BYTES_PER_EL, 0)
                add("attn_residual", e["residual"] * x.size, 0, 0, 0)
            h = _rms_scale(x, eps_d)
            gu = h @ wgu                                                 # [B, n, 2·ff]
            gate = gu[..., :ff]
            act = gate / (1.0 + np.exp(-gate)) * gu[..., ff:]            # SiLU(gate)·up
            x = x + act @ wdown
            if add:
                add("mlp_norm", e["norm"] * h.size, 0, cfg.d_model * BYTES_PER_EL, 0)
                for op in ("mlp_gate", "mlp_up"):
                    W = L["w_" + op[4:]]
                    add(op, 2 * rows * W.size, 2 * rows * W.size, W.size * BYTES_PER_EL, 0)
                add("mlp_act", e["act"] * act.size, 0, 0, 0)
                add("mlp_down", 2 * rows * wdown.size, 2 * rows * wdown.size, wdown.size * BYTES_PER_EL, 0)
                add("mlp_residual", e["residual"] * x.size, 0, 0, 0)
        h = _rms_scale(x, eps_d)
        logits = h @ self._head                                          # [B, n, V]
        if add:
            add("final_norm", e["norm"] * h.size, 0, cfg.d_model * BYTES_PER_EL, 0)
            add("lm_head", 2 * B * n * self._head.size, 2 * B * n * self._head.size,
                self._head.size * BYTES_PER_EL, 0)
        cache.pos = S
        return logits


# ---------------------------------------------------------------------------
# 分块注意力（FlashAttention）与它的 HBM 流量（第 2 讲 05 用）
# ---------------------------------------------------------------------------
def _check_attention(q, k, v, causal):
    """检查注意力的输入形状：q [H, n_q, d]，k、v [H_kv, n_k, d]，H 是 H_kv 的整数倍；因果时 n_q ≤ n_k。"""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    if q.ndim != 3 or k.ndim != 3 or v.shape != k.shape:
        raise ValueError(f"形状应为 q [H, n_q, d]、k 和 v [H_kv, n_k, d]（收到 q {q.shape}、k {k.shape}、v {v.shape}）")
    H, n_q, d = q.shape
    H_kv, n_k, d_k = k.shape
    if d != d_k or min(H, H_kv, n_q, n_k, d) < 1 or H % H_kv:
        raise ValueError(f"q 的头数 {H} 必须是 K/V 头数 {H_kv} 的整数倍、head_dim 相同且各维为正"
                         f"（收到 q {q.shape}、k {k.shape}）")
    if causal and n_q > n_k:
        raise ValueError(f"因果注意力里 query 是最后 n_q 个位置：n_q = {n_q} 不能超过 n_k = {n_k}")
    return q, k, v


def flash_attention(q, k, v, block_q, block_k, causal=True):  # [H, n_q, d], [H_kv, n_k, d] x2 -> [H, n_q, d]
    """
    分块注意力（FlashAttention 的算法，FlashAttention-2 的循环顺序）-> (out, io)。

    【推导】softmax(q·kᵀ/√d + 遮罩)·v 不写出整个 n_q × n_k 的分数矩阵：query 按 block_q 行一块放进片上内存，
    key/value 按 block_k 行一块流过；每来一块 key，算这一块的分数 s，更新每行的"到目前为止的最大值" m 和
    "指数和" l（在线 softmax）：m' = max(m, rowmax(s))，l' = e^{m−m'}·l + Σ e^{s−m'}，
    输出累加器 acc' = e^{m−m'}·acc + e^{s−m'}·v；所有块走完，out = acc / l。（Dao et al. 2022, arXiv 2205.14135，
    算法 1；FlashAttention-2, arXiv 2307.08691 把 query 块放在外层循环。）结果和普通写法只差浮点舍入。
    【io】数在 HBM 和片上块之间搬了多少个**元素**（乘每个元素的字节数才是字节）：每个 query 头单独走一遍
    它的 K/V 头（GQA：组里的头各读一遍）；每个 query 块读一次（block_q × d）、输出写一次；每个 key/value 块
    对每个 query 块各读一次（2 × block_k × d）；因果时整块都在对角线上方的 key 块跳过、不计。
    m、l 留在片上（只做推理，不为反向传播写 logsumexp）。返回 {"read": …, "written": …}。
    【参数】q [H, n_q, d]，k、v [H_kv, n_k, d]；causal=True 时 query 是 n_k 个位置里的最后 n_q 个
    （第 i 个 query 的位置是 n_k − n_q + i，能看 0..它自己）。
    【边界】长度不必是块大小的整数倍（最后一块短一些）；block_q、block_k < 1 抛 ValueError。
    """
    q, k, v = _check_attention(q, k, v, causal)
    if not (int(block_q) == block_q >= 1 and int(block_k) == block_k >= 1):
        raise ValueError(f"块大小必须是正整数（收到 block_q={block_q}, block_k={block_k}）")
    H, n_q, d = q.shape
    H_kv, n_k, _ = k.shape
    group = H // H_kv
    scale = 1.0 / math.sqrt(d)
    out = np.empty_like(q)
    read = written = 0
    offset = n_k - n_q                                   # 因果时 query i 的绝对位置 = offset + i
    for h in range(H):
        kh, vh = k[h // group], v[h // group]
        for q0 in range(0, n_q, block_q):
            q1 = min(q0 + block_q, n_q)
            qb = q[h, q0:q1] * scale                      # 读一个 query 块 [bq, d]
            read += qb.size
            m = np.full(q1 - q0, -np.inf)
            l = np.zeros(q1 - q0)
            acc = np.zeros((q1 - q0, d))
            last = offset + q1 - 1 if causal else n_k - 1  # 这块 query 能看到的最后一个 key
            for k0 in range(0, last + 1, block_k):
                k1 = min(k0 + block_k, n_k)
                kb, vb = kh[k0:k1], vh[k0:k1]             # 读一个 key 块和一个 value 块 [bk, d]
                read += kb.size + vb.size
                s = qb @ kb.T                             # [bq, bk]，只在片上
                if causal:
                    pos_q = offset + np.arange(q0, q1)[:, None]
                    s = np.where(np.arange(k0, k1)[None, :] <= pos_q, s, -np.inf)
                m_new = np.maximum(m, s.max(axis=1))
                alpha = np.exp(m - m_new)                 # 旧的累加按新的最大值缩小
                p = np.exp(s - m_new[:, None])
                l = alpha * l + p.sum(axis=1)
                acc = alpha[:, None] * acc + p @ vb
                m = m_new
            out[h, q0:q1] = acc / l[:, None]              # 写一个输出块
            written += (q1 - q0) * d
    return out, {"read": read, "written": written}


def naive_attention(q, k, v, causal=True):  # [H, n_q, d], [H_kv, n_k, d] x2 -> [H, n_q, d]
    """
    不分块的注意力，三个 kernel（打分、softmax、乘 V）之间经过 HBM -> (out, io)，io 的口径同 flash_attention。

    【io】每个 query 头：打分 kernel 读 q（n_q·d）和 k（n_k·d）、写分数 S（n_q·n_k，遮罩挡住的也写：矩阵是整块的）；
    softmax kernel 读 S、写概率 P（各 n_q·n_k）；第三个 kernel 读 P 和 v（n_k·d）、写输出（n_q·d）。
    合计 读 = n_q·d + 2·n_k·d + 2·n_q·n_k，写 = 2·n_q·n_k + n_q·d。
    """
    q, k, v = _check_attention(q, k, v, causal)
    H, n_q, d = q.shape
    H_kv, n_k, _ = k.shape
    group = H // H_kv
    out = np.empty_like(q)
    read = written = 0
    for h in range(H):
        S = (q[h] / math.sqrt(d)) @ k[h // group].T        # kernel 1：写 S [n_q, n_k]
        read += q[h].size + k[h // group].size
        written += S.size
        if causal:
            S = np.where(np.arange(n_k)[None, :] <= (n_k - n_q + np.arange(n_q))[:, None], S, -np.inf)
        P = softmax(S, axis=-1)                            # kernel 2：读 S、写 P
        read += S.size
        written += P.size
        out[h] = P @ v[h // group]                         # kernel 3：读 P 和 V、写输出
        read += P.size + v[h // group].size
        written += out[h].size
    return out, {"read": read, "written": written}


def flash_blocks(M, d):
    """
    FlashAttention 按片上内存大小选块：片上能放 M 个元素时 B_c = ⌈M / 4d⌉（key 块行数），B_r = min(B_c, d)（query 块行数）
    -> (B_r, B_c)。（Dao et al. 2022 算法 1 第 1 行。）【边界】M < d 或 d < 1 抛 ValueError（放不下一行）。
    """
    if d < 1 or M < d:
        raise ValueError(f"片上内存 M = {M} 个元素至少要放下一行（d = {d}）")
    bc = -(-M // (4 * d))
    return min(bc, d), bc


__all__ += ["flash_attention", "naive_attention", "flash_blocks"]


def attention_io(kind, H, H_kv, n_q, n_k, d, block_q=None, block_k=None, causal=True):
    """
    不运行、只按公式数 naive_attention / flash_attention 搬的元素 -> {"read": …, "written": …}（和真实运行的计数
    逐个相等，测试核对）。大尺寸（32k 的提示）只能这样数。

    【推导】naive：每个 query 头 读 n_q·d + 2·n_k·d + 2·n_q·n_k，写 2·n_q·n_k + n_q·d。
    flash：每个 query 头、每个 query 块 [q0, q1)：读这块 (q1 − q0)·d；它能看到的最后一个 key 是 last
    （因果：n_k − n_q + q1 − 1；否则 n_k − 1），要读的 key 块有 ⌊last / block_k⌋ + 1 个，共 min(块数 × block_k, n_k) 行，
    K 和 V 各读这么多行 × d；写 (q1 − q0)·d。
    【边界】kind 只能是 "naive" 或 "flash"；flash 需要 block_q、block_k。
    """
    if kind == "naive":
        per = {"read": n_q * d + 2 * n_k * d + 2 * n_q * n_k, "written": 2 * n_q * n_k + n_q * d}
        return {key: H * val for key, val in per.items()}
    if kind != "flash":
        raise ValueError(f"未知的注意力写法 {kind!r}；可用：naive、flash")
    if not (block_q and block_k and block_q >= 1 and block_k >= 1):
        raise ValueError(f"flash 需要正的块大小（收到 block_q={block_q}, block_k={block_k}）")
    if causal and n_q > n_k:
        raise ValueError(f"因果注意力里 n_q = {n_q} 不能超过 n_k = {n_k}")
    read = 0
    for q0 in range(0, n_q, block_q):
        q1 = min(q0 + block_q, n_q)
        last = n_k - n_q + q1 - 1 if causal else n_k - 1
        rows = min((last // block_k + 1) * block_k, n_k)
        read += (q1 - q0) * d + 2 * rows * d
    return {"read": H * read, "written": H * n_q * d}


def online_softmax(scores, block):  # [n] -> [(块最大值, m, l), ...]
    """
    一行分数按 block 个一块地流过时，在线 softmax 的两个累计量 -> 每块之后的 (这块的最大值, m, l) 列表。

    【推导】m = 到目前为止的最大值，l = Σ e^{s − m}（到目前为止的分数）。来一块新分数 s_b：
    m' = max(m, max s_b)，l' = e^{m − m'}·l + Σ e^{s_b − m'}——旧的和按新的最大值缩小一次就对了，不用回头重算。
    走完所有块，l·e^{m} = Σ e^{s}，softmax = e^{s − m} / l（flash_attention 的每一行就是这样算的）。
    """
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 1 or s.size == 0 or not (int(block) == block >= 1):
        raise ValueError(f"scores 必须是非空的一维数组、block 是正整数（收到形状 {s.shape}、block={block}）")
    m, l, out = -np.inf, 0.0, []
    for i in range(0, s.size, block):
        b = s[i:i + block]
        m_new = max(m, float(b.max()))
        l = math.exp(m - m_new) * l + float(np.exp(b - m_new).sum())
        m = m_new
        out.append((float(b.max()), m, l))
    return out


__all__ += ["attention_io", "online_softmax"]


# ---------------------------------------------------------------------------
# 量化的 KV cache（第 3 讲 06 用）：写进缓存时量化
# ---------------------------------------------------------------------------
class _QuantizingStore(np.ndarray):
    """
    KV cache 的存储数组：cache.k[...] = 块 时先把块交给 quant（量化再反量化）再存；取出来的是普通的 ndarray 视图。

    前向（NumpyTransformer.forward）不用改一个字：它本来就是"写第 p0..S 个位置、再读 0..S"，
    写的那一刻就是量化的那一刻，和真实的推理引擎一样（每个新 token 的 K、V 写进缓存时量化）。
    KVCache.keep 挪位置时，挪过去的值会再经过 quant 一次：quant 必须是幂等的（量化已经量化过的值不变；
    quant_lab.kv_quantizer 的格式都是，测试核对）。
    """

    def __setitem__(self, idx, value):
        np.ndarray.__setitem__(self, idx, self._quant(np.asarray(value, dtype=np.float64)))

    def __getitem__(self, idx):
        return np.ndarray.__getitem__(self.view(np.ndarray), idx)


def quantizing_store(arr, quant):
    """把 arr 包成写入时经过 quant 的存储（共享 arr 的内存）-> _QuantizingStore。"""
    if not callable(quant):
        raise ValueError(f"quant 必须是函数 f(块) -> 同形状的块（收到 {quant!r}）")
    store = arr.view(_QuantizingStore)
    store._quant = quant
    return store


__all__ += [
    "quantizing_store",
]
