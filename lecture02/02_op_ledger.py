"""
=============================================================================
CS349E · 第 2 讲 · 02_op_ledger.py —— 逐运算的账本：跑出来的账 == 公式算的账
=============================================================================

【这个脚本要回答的问题】
演示 1：prefill（一次喂进整个提示）时，模型运行时按数组形状记下的账（Counter）和 analytic_ops 用公式算的账，
逐算子、逐字段（FLOPs、有用 FLOPs、权重字节、KV 字节）是否完全相等？
演示 2：decode（带 KV cache，每次喂 1 个 token）的一步，同样逐格核对。
演示 3：FLOPs 和字节都花在哪儿了？权重矩阵乘、注意力核心、其余逐元素运算各占多少——小模型的 prefill / decode（账本），
以及 Llama-3.1-70B 的 prefill / decode（公式；演示 1、2 说明公式和运行时按数组形状记的账一致）。

【怎么读输出】账本的四个字段（定义见 transformer_lab 的模块说明）：
"FLOPs" = 代码真正执行的浮点运算（矩阵乘 2·m·n·k；逐元素运算按每个元素固定的次数；因果遮罩挡住的那一半也算，代码确实算了）；
"有用" = 数学上需要的矩阵乘 FLOPs（遮罩挡住的不算；softmax、norm、RoPE、激活算 0）——roofline 拿它和峰值算力比；
"权重" = 读的权重字节，"KV" = 注意力读的 K、V 字节，都按 BF16（每个数 2 字节）记，不管 numpy 里是 float64。
每层的同名算子合成一行。"账本"列来自 NumpyTransformer.forward(..., counter=c)：运行时按每个数组的真实形状记的账
（簿记，不是计时、也不是硬件计数器的测量）；"公式"列来自 analytic_ops，只用配置里的几个整数。

【模型的假设（务必看）】账本只记权重和 KV 的读取，不记激活的读写（真实 GPU 上激活也要进出显存，融合的算子可以省掉大部分）；
字节按 BF16 记是约定。小模型是 transformer_lab.LEC2_CFG（同 01 脚本，随机初始化）。Llama-3.1-70B 的结构来自它的 config.json（llm_math）；
它的 prefill 只在最后一个位置算 lm_head（last_only=True，生成时真正需要的），小模型的运行在每个位置都算 lm_head。

【运行】python3 02_op_ledger.py （约 0.2 秒）

【依赖】numpy；本目录的 transformer_lab（NumpyTransformer、LEC2_CFG、random_tokens）、ledger_lab（Counter、analytic_ops、sum_rows）；
../lecture01 的 console、hw_specs、llm_math。
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
for sub in ("lecture01", "lecture02"):
    sys.path.insert(0, os.path.join(HERE, "..", sub))

from console import fmt_bytes, fmt_num, print_header, print_observations, print_table  # noqa: E402
from hw_specs import H100  # noqa: E402
from llm_math import LLAMA31_70B  # noqa: E402
from transformer_lab import LEC2_CFG, NumpyTransformer, init_params, random_tokens  # noqa: E402
from ledger_lab import ALL_OPS, ATTN_CORE_OPS, Counter, FIELDS, MATMUL_OPS, analytic_ops, sum_rows  # noqa: E402

# ---- 小模型（transformer_lab.LEC2_CFG，同 01 脚本）和演示用的形状 ----
CFG = LEC2_CFG
SEED, PROMPT_SEED = 0, 1
B, N_PROMPT = 2, 32
OTHER_OPS = tuple(op for op in ALL_OPS if op not in MATMUL_OPS and op not in ATTN_CORE_OPS)
GROUPS = (("权重矩阵乘", MATMUL_OPS), ("注意力核心", ATTN_CORE_OPS), ("其余", OTHER_OPS))   # 其余：norm、RoPE、激活、残差、查表


def run_prefill_and_decode():
    """小模型：先 prefill 整个提示（一个账本），再 decode 一步（另一个账本）。返回 (prefill 账本, decode 账本)。"""
    model = NumpyTransformer(init_params(CFG, SEED), CFG)
    prompt = random_tokens(CFG, B, N_PROMPT, PROMPT_SEED)
    cache = model.new_cache(B)
    c_pre, c_dec = Counter(), Counter()
    logits = model.forward(prompt, cache, counter=c_pre)
    model.forward(logits[:, -1].argmax(-1)[:, None], cache, counter=c_dec)
    return c_pre, c_dec


def side_by_side(counted, analytic):
    """账本的行和公式的行并排 -> (表格的行, 相等的格子数, 格子总数)。"""
    ana = {r["op"]: r for r in analytic}
    rows, same, cells = [], 0, 0
    for r in counted.rows():
        a = ana[r["op"]]
        row = [r["op"]]
        for f in FIELDS:
            row += [r[f], a[f]]
            same += int(r[f] == a[f])
            cells += 1
        row.append("✓" if all(r[f] == a[f] for f in FIELDS) else "✗")
        rows.append(row)
    missing = set(ana) ^ set(counted.ops)
    return rows, same - len(missing), cells + len(missing)


HEADERS = ["算子", "FLOPs 账本", "公式", "有用 账本", "公式", "权重 账本", "公式", "KV 账本", "公式", "相等"]
UNITS_NOTE = "FLOPs 和有用 FLOPs 是次数；权重、KV 是读的字节（按 BF16）"


# ---------------------------------------------------------------------------
# 演示 1：prefill 的账
# ---------------------------------------------------------------------------
def demo1_prefill_ledger():
    print_header(f"演示 1：prefill 的账——B = {B} 个序列、每个 {N_PROMPT} 个 token，缓存里原来没有东西（n_past = 0）")
    c_pre, _ = run_prefill_and_decode()
    ana = analytic_ops(CFG, B, N_PROMPT, 0, last_only=False)
    rows, same, cells = side_by_side(c_pre, ana)
    print(UNITS_NOTE)
    print_table(HEADERS, rows)
    tot = {f: c_pre.total(f) for f in FIELDS}
    w_mm = c_pre.total("w", MATMUL_OPS)   # 权重矩阵的字节（词嵌入查表读的行数随 token 数变，不算在内）
    sc = c_pre.ops["attn_scores"]
    print(f"\n核对：{len(rows)} 个算子 × {len(FIELDS)} 个字段 = {cells} 个数，账本 == 公式的有 {same} 个："
          + ("全部相等" if same == cells else "有不相等的！"))
    print_observations([
        f"账本是模型运行时按每个数组的真实形状、照 transformer_lab 的约定（矩阵乘 2·m·n·k，逐元素运算每个元素固定几次）记的账，"
        f"不是测量；公式只用配置里的几个整数。{cells} 个数逐个相等，说明公式和代码实际算的形状记的是同一本账——"
        "本讲 03、04 脚本和第 5 讲用同一个 analytic_ops 给 Llama-3.1-70B 记账；但这里只核对了这一个小配置、"
        "lm_head 每个位置都算的口径（70B 那边只算最后一个位置，这个口径没有跑过）。"
        "它不说明硬件真的执行了这么多 FLOPs、搬了这么多字节（BLAS 怎么做、缓存命中多少、激活的读写，都不在账里）；"
        "两边还共用同一张逐元素约定表（ELEMENTWISE_FLOPS），相等也检验不了这张表本身。",
        f"注意力打分（attn_scores）执行了 {sc['flops']:,} 次 FLOP，有用的只有 {sc['useful']:,}："
        f"因果遮罩挡住了上三角，比例 {sc['useful'] / sc['flops']:.3f} = (n+1)/(2n)，n = {N_PROMPT}。",
        f"整个 prefill：执行 {fmt_num(tot['flops'])} FLOPs、有用 {fmt_num(tot['useful'])}；读权重矩阵 {fmt_bytes(w_mm)}、"
        f"读 KV {fmt_bytes(tot['kv'])}（BF16 计）。权重矩阵每次前向读一遍，不管这次喂多少个 token"
        f"（词嵌入查表另读 {fmt_bytes(c_pre.total('w', ('embed',)))}：每个 token 一行，随 token 数增长）。",
    ])
    return {"cells": cells, "same": same, "n_ops": len(rows), "totals": tot, "w_matmul": w_mm,
            "scores_useful_ratio": sc["useful"] / sc["flops"]}


# ---------------------------------------------------------------------------
# 演示 2：decode 一步的账
# ---------------------------------------------------------------------------
def demo2_decode_ledger():
    print_header(f"演示 2：decode 一步的账——B = {B} 个序列、每个喂 1 个新 token，缓存里已有 {N_PROMPT} 个位置")
    c_pre, c_dec = run_prefill_and_decode()
    ana = analytic_ops(CFG, B, 1, N_PROMPT, last_only=False)
    rows, same, cells = side_by_side(c_dec, ana)
    print(UNITS_NOTE)
    print_table(HEADERS, rows)
    print(f"\n核对：{len(rows)} 个算子 × {len(FIELDS)} 个字段 = {cells} 个数，账本 == 公式的有 {same} 个："
          + ("全部相等" if same == cells else "有不相等的！"))
    f_pre, f_dec = c_pre.total("useful"), c_dec.total("useful")
    w_pre, w_dec = c_pre.total("w", MATMUL_OPS), c_dec.total("w", MATMUL_OPS)
    kv_row = c_dec.ops["attn_scores"]
    k_bytes, v_bytes = c_dec.ops["attn_scores"]["kv"], c_dec.ops["attn_av"]["kv"]   # 打分读 K，加权和读 V
    print_observations([
        f"decode 一步的有用 FLOPs 是 prefill 的 {f_dec / f_pre:.3f}（{fmt_num(f_dec)} vs {fmt_num(f_pre)}），"
        f"而读的权重矩阵字节一样多（{fmt_bytes(w_dec)} vs {fmt_bytes(w_pre)}）：每次前向都要把所有权重读一遍，"
        f"decode 却只摊到 {B} 个 token 上。这就是 decode 受带宽限制的原因（03 脚本量化它）。",
        f"decode 时打分的\"执行\"和\"有用\"相等（{kv_row['flops']:,}）：新 token 看所有 {N_PROMPT + 1} 个位置，没有被遮罩挡住的。",
        f"注意力读的 K 字节（打分那一行）= B × KV 头 × 被看的位置 × head_dim × 2 字节 × 层数 = "
        f"{B} × {CFG.n_kv_heads} × {N_PROMPT + 1} × {CFG.head_dim} × 2 × {CFG.n_layers} = {k_bytes:,}；加权和那一行读同样多的 V，"
        f"合起来 K {k_bytes:,} + V {v_bytes:,} = {k_bytes + v_bytes:,} 字节："
        "缓存多长，每一步就要把它整个读一遍（04 脚本）。",
    ])
    return {"cells": cells, "same": same, "useful_ratio": f_dec / f_pre, "w_pre": w_pre, "w_dec": w_dec,
            "k_bytes": k_bytes, "v_bytes": v_bytes, "kv_total": c_dec.total("kv")}


# ---------------------------------------------------------------------------
# 演示 3：FLOPs 和字节花在哪儿
# ---------------------------------------------------------------------------
def _split(rows):
    """各组的 (执行 FLOPs, 有用 FLOPs, 读的字节 = 权重 + KV)。"""
    return [(name, sum_rows(rows, "flops", ops), sum_rows(rows, "useful", ops),
             sum_rows(rows, "w", ops) + sum_rows(rows, "kv", ops)) for name, ops in GROUPS]


def demo3_where_it_goes():
    print_header("演示 3：FLOPs 和字节花在哪儿——prefill vs decode，小模型（账本）和 Llama-3.1-70B（公式）")
    c_pre, c_dec = run_prefill_and_decode()
    m = LLAMA31_70B
    scenarios = [
        (f"小模型 prefill（B={B}, {N_PROMPT} 个 token）", c_pre.rows()),
        (f"小模型 decode（B={B}, 上下文 {N_PROMPT + 1}）", c_dec.rows()),
        ("70B prefill（B=1, 2048 个 token）", analytic_ops(m, 1, 2048, 0, last_only=True)),
        ("70B decode（B=1, 上下文 2048）", analytic_ops(m, 1, 1, 2047, last_only=True)),
        ("70B decode（B=64, 上下文 8192）", analytic_ops(m, 64, 1, 8191, last_only=True)),
    ]
    rows, out = [], {}
    for label, rr in scenarios:
        name = label
        parts = _split(rr)
        F = sum(p[1] for p in parts)
        U = sum(p[2] for p in parts)
        By = sum(p[3] for p in parts)
        shares = {}
        for gname, f, u, by in parts:
            rows.append([name, gname, f"{100 * f / F:.1f}%", f"{100 * u / U:.1f}%", f"{100 * by / By:.1f}%"])
            shares[gname] = (f / F, u / U, by / By)
            name = ""
        out[label] = {"shares": shares, "intensity": U / By, "useful": U, "bytes": By,
                      "lm_head_w_share": sum_rows(rr, "w", ("lm_head",)) / sum_rows(rr, "w", MATMUL_OPS)}
    print("其余 = norm、RoPE、激活、残差、查表；读的字节 = 权重 + KV")
    print_table(["场景", "部分", "执行 FLOPs 占比", "有用 FLOPs 占比", "读的字节占比"], rows)
    print("\n每个场景的总量和算术强度（有用 FLOPs ÷ 读的字节）：")
    print_table(["场景", "有用 FLOPs", "读的字节", "强度 FLOP/字节"],
                [[k, fmt_num(v["useful"]), fmt_bytes(v["bytes"]), f"{v['intensity']:.1f}"] for k, v in out.items()])
    keys = list(out)
    tiny_pre, tiny_dec, big_pre, big_dec, big_dec64 = (out[k] for k in keys)
    ridge = H100.ridge_point("bf16")
    mm, at = GROUPS[0][0], GROUPS[1][0]
    print_observations([
        f"Llama-3.1-70B 的 prefill（2048 个 token）有用 FLOPs 的 {100 * big_pre['shares'][mm][1]:.1f}% 在权重矩阵乘里，"
        f"注意力核心只占 {100 * big_pre['shares'][at][1]:.1f}%；强度 {big_pre['intensity']:.0f} FLOP/字节，远高于 H100 的拐点 "
        f"{ridge:.0f} FLOP/字节（BF16 峰值 ÷ 带宽）——prefill 受算力限制。",
        f"同一个模型 decode（B = 1）：强度只有 {big_dec['intensity']:.2f} FLOP/字节，读的字节 {100 * big_dec['shares'][mm][2]:.1f}% 是权重矩阵——"
        "一个 token 读一遍全部权重，每个权重只做一次乘加（2 FLOPs / 2 字节 = 1）。",
        f"B = 64、上下文 8192 时，读的字节里 KV 占了 {100 * big_dec64['shares'][at][2]:.1f}%，超过了权重："
        f"批大了以后权重被 64 个 token 分摊，而每个序列的 KV 各读各的（03、04 脚本）。",
        f"小模型的比例和 70B 不一样：d_model 只有 {CFG.d_model}，prefill 里 norm、RoPE、激活、残差（表里的\"其余\"；"
        "softmax 算在注意力核心里）占执行 FLOPs 的 "
        f"{100 * tiny_pre['shares'][GROUPS[2][0]][0]:.1f}%（70B：{100 * big_pre['shares'][GROUPS[2][0]][0]:.2f}%），"
        f"lm_head 占权重矩阵字节的 {100 * tiny_pre['lm_head_w_share']:.1f}%（70B：{100 * big_pre['lm_head_w_share']:.1f}%）。"
        "所以讲大模型的比例要用公式（演示 1、2：在小模型上，公式和运行时按数组形状记的账逐格相等），不能直接看小模型。",
    ])
    out["ridge"] = ridge
    return out


if __name__ == "__main__":
    demo1_prefill_ledger()
    demo2_decode_ledger()
    demo3_where_it_goes()
