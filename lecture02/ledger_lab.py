"""
ledger_lab —— 逐运算的账本：一次前向每个算子的 FLOPs、有用的 FLOPs、读的权重字节和 KV 字节；
Counter 由真正运行的 numpy 模型（transformer_lab.NumpyTransformer）填，analytic_ops 用公式算同样的行。

【四个字段】
- "flops"：代码真正执行的浮点运算。矩阵乘 2·m·n·k；逐元素运算按每个元素的固定次数（见 ELEMENTWISE_FLOPS）；
  注意力的打分和 softmax 按整个矩形算（因果遮罩挡住的那一半也算了，代码确实算了）。
- "useful"：数学上需要的矩阵乘 FLOPs——因果遮罩挡住的上半部分不算；softmax、norm、RoPE、激活都算 0。
  这是 roofline 里拿去和 peak_flops 比的"张量核心的活"。
- "w"：读的权重字节，按 BF16（每个 2 字节）记，不管 numpy 里是什么 dtype；一次前向每个权重矩阵读一遍。
- "kv"：注意力读的 K 和 V 的字节，按 BF16 记，包括缓存里的和这次新算的所有被看的位置。
测试断言：同样的形状，真实运行的账本和公式**逐算子、逐字段完全相等**。
"""

__all__ = ["Counter", "analytic_ops", "sum_rows", "MATMUL_OPS", "ATTN_CORE_OPS", "ALL_OPS", "ELEMENTWISE_FLOPS",
           "FIELDS", "BYTES_PER_EL"]

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
