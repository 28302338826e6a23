"""
=============================================================================
CS349E · 第 6 讲 · train_draft_heads.py —— 训练 SmolLM2 的两个草稿：Medusa 头和 EAGLE 式的特征草稿（numpy）
=============================================================================

不是编号脚本（它生成数据、训练，要几分钟）：它产出的权重和 token id 在 lecture06/trained_drafts/ 里，
13_trained_drafts.py 和测试读它们。再跑一遍得到同样的字节（同一台机器、同样的 BLAS 线程数）。

【做什么】
1. 数据（自蒸馏，Medusa 论文给 Medusa-2 的做法；Cai et al. 2024，arXiv 2401.10774）：SmolLM2 自己回答一组固定的聊天提示
   （TOPICS × TEMPLATES，每个提示 T = 0 一次、T = 1 一次），用第 5 讲的引擎成批地生成
   （LLMEngine(…, keep_hidden=True)：同一次前向记下每个位置的特征，见 engine_lab）。每个位置留下特征 f 和抽出的 token。
   留出的提示（HELDOUT，题目和句式都不在训练的里面）只做贪心续写，从不训练：它们的 token id 存进文件，
   13 的默认运行不用再生成。
2. 草稿词表（FR-Spec 的做法）：训练文本里最常见的 VOCAB_N 个 token；草稿的 lm_head 只取这几列（训练和草稿都便宜
   49152 / VOCAB_N 倍），目标照样在整个词表上验证。
3. 训练（trained_draft_lab：手写的前向和反向，Adam，float32）：Medusa 的 K_HEADS 个头、EAGLE 式草稿各 EPOCHS 个 epoch，
   每个 epoch 打乱一次（种子 SEED）；打印进度条和每个 epoch 的损失。
4. 写 trained_drafts/smollm2_drafts.npz（权重 float16、草稿词表、训练和留出文本的 token id）和
   smollm2_drafts.json（命令、模型文件的 sha256、数据量、每个 epoch 的损失）。两个文件的字节只取决于数据和训练
   （zip 里的时间戳固定）。

【运行】python3 lecture06/train_draft_heads.py （一个 BLAS 线程，console 的规则。2 核机器上量的：生成 420 个回答、
36,282 个 token 用 184 秒（uptime 的负载约 3：别的进程在跑；负载 7–8 时 447 秒），训练两个草稿各 4 个 epoch 用 69–83 秒；
一共约 4.5 分钟。两次从头生成的数据（特征、token）逐位相同；同一份数据训练两次，写出的两个文件逐字节相同）
python3 lecture06/train_draft_heads.py --data /tmp/x.npz （把生成的数据存到那里；已经有就直接读，只重新训练）
【依赖】../lecture05 的 engine_lab；本目录的 trained_draft_lab；../lecture02 的 real_model_lab、hub_lab；
../lecture01 的 console（BLAS 线程数）。
"""
import io
import json
import os
import sys
import time
import zipfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
for sub in ("lecture01", "lecture02", "lecture05"):
    sys.path.insert(0, os.path.join(HERE, "..", sub))

import console  # noqa: E402,F401（BLAS 一个线程）
from decode_lab import TransformerLM  # noqa: E402
from engine_lab import LLMEngine  # noqa: E402
from hub_lab import gguf_path_or_exit, sha256_file  # noqa: E402
from real_model_lab import load_gguf  # noqa: E402
from trained_draft_lab import (eagle_inputs, eagle_loss, init_eagle, init_medusa, medusa_loss,  # noqa: E402
                               train_epochs, train_scale)

# ---- 设置（都是选出来的）----
TOPICS = ("the ocean", "volcanoes", "bicycles", "the moon", "coffee", "honey bees", "rainforests", "chess",
          "the printing press", "electric cars", "photosynthesis", "the Roman Empire", "black holes", "gardening",
          "recycling", "the human heart", "earthquakes", "jazz music", "penguins", "solar panels", "the internet",
          "bread baking", "mountains", "friendship", "time management", "dinosaurs", "rivers", "robots",
          "the water cycle", "libraries")
TEMPLATES = ("Write a short paragraph about {}.",
             "Explain {} to a ten-year-old.",
             "Give three interesting facts about {}.",
             "Write a short poem about {}.",
             "What are the advantages and disadvantages of {}?",
             "Write a Python function related to {}, with a docstring.",
             "Summarize the history of {} in a few sentences.")
HELDOUT = ("Describe a walk through a busy city market in the morning.",
           "Write a Python function that checks whether a string is a palindrome.",
           "List five tips for learning a new language.",
           "Why do leaves change color in autumn?",
           "Repeat the following sentence three times: The quick brown fox jumps over the lazy dog.",
           "Write a short story about a lost key.")
MAX_TOKENS = 96            # 每个训练回答最多几个新 token（停在 <|im_end|>）
HELDOUT_TOKENS = 64        # 留出的贪心续写最多几个新 token
STOP = 2                   # <|im_end|>
SEED = 0                   # T = 1 的第 i 个请求用种子 SEED + i；训练打乱的种子
K_HEADS = 3                # Medusa 头的个数（头 i 预测 i + 1 个位置之后的 token）
VOCAB_N = 4096             # 草稿词表的大小
EPOCHS, BATCH, LR = 4, 256, 1e-3
FEAT_WEIGHT = 1.0          # EAGLE 式的特征回归 ‖√d·(u − f)‖²（√d 的尺度上按分量求和）：回归为主，像 EAGLE 的分类只占 0.1
# 这三个数在试跑里挑过（留出提示上 T = 0 的 α）：学习率 3e-3 比 1e-3 差；8 个 epoch 时训练损失一直降，留出的 α 几乎
# 不涨（数据只有 36k 个 token）；特征回归的权重从 1/576 换成 1，EAGLE 式第二步（用自己预测的特征）的 α 从约 0.07 到约 0.2。
BATCH_SEQS = 32            # 引擎一步最多几个序列
OUT_DIR = os.path.join(HERE, "trained_drafts")
OUT_NPZ, OUT_JSON = "smollm2_drafts.npz", "smollm2_drafts.json"
COMMAND = "python3 lecture06/train_draft_heads.py"


def training_prompts():
    """训练用的提示（文本）-> list：每个题目 × 每个句式。"""
    return [t.format(topic) for topic in TOPICS for t in TEMPLATES]


def _bar(done, total, t0, what):
    w = 30
    k = int(w * done / total)
    sys.stderr.write(f"\r{what} [{'#' * k}{'.' * (w - k)}] {done}/{total}  {time.perf_counter() - t0:5.0f} s")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def generate(lm, cfg, prompts, max_tokens, temps, seeds):
    """引擎成批地生成 -> [(提示 id, 输出 id, 特征 [n, d] float32)]，按提示的顺序。"""
    need = max(len(p) for p in prompts) + max_tokens
    nb = max(BATCH_SEQS * -(-need // 16), -(-cfg.max_seq // 16))
    eng = LLMEngine(lm, cfg, nb, 16, max_num_batched_tokens=512, max_num_seqs=BATCH_SEQS, keep_hidden=True)
    ids = [eng.add_request(p, max_tokens, t, s, STOP) for p, t, s in zip(prompts, temps, seeds)]
    t0, done = time.perf_counter(), 0
    while eng.has_unfinished_requests():
        for _, _, why in eng.step():
            if why is not None:
                done += 1
                _bar(done, len(ids), t0, "生成")
    return [(list(eng.requests[i].tokens[:eng.requests[i].n_prompt]), list(eng.requests[i].output),
             np.asarray(eng.requests[i].hidden, dtype=np.float32)) for i in ids]


def make_data(lm, cfg, tok):
    """训练数据和留出文本 -> dict（数组）。"""
    texts = training_prompts()
    prompts = [tok.chat(t) for t in texts]
    n = len(prompts)
    runs = generate(lm, cfg, prompts + prompts, MAX_TOKENS, [0.0] * n + [1.0] * n,
                    [SEED + i for i in range(2 * n)])
    held = generate(lm, cfg, [tok.chat(t) for t in HELDOUT], HELDOUT_TOKENS, [0.0] * len(HELDOUT),
                    [0] * len(HELDOUT))
    out = {"train_tokens": np.concatenate([np.asarray(o, dtype=np.int32) for _, o, _ in runs]),
           "train_lengths": np.asarray([len(o) for _, o, _ in runs], dtype=np.int32),
           "train_feats": np.concatenate([h for _, _, h in runs]),
           "heldout_prompts": np.concatenate([np.asarray(p, dtype=np.int32) for p, _, _ in held]),
           "heldout_prompt_lengths": np.asarray([len(p) for p, _, _ in held], dtype=np.int32),
           "heldout_tokens": np.concatenate([np.asarray(o, dtype=np.int32) for _, o, _ in held]),
           "heldout_lengths": np.asarray([len(o) for _, o, _ in held], dtype=np.int32)}
    return out


def draft_vocab(tokens, n):
    """训练文本里最常见的 n 个 token（次数相同时 id 小的在前），升序 -> int32 数组。"""
    counts = np.bincount(tokens, minlength=1)
    order = np.lexsort((np.arange(counts.size), -counts))
    top = order[:n]
    return np.sort(top[counts[top] > 0]).astype(np.int32)


def training_rows(data, vocab_ids, V):
    """
    -> (特征 F [N, d], 每个位置的 token Y [N], 下一个位置的下标 nxt [N]（序列末尾是 -1），位置 j 之后第 i 个 token 的下标)。
    """
    lengths = data["train_lengths"]
    N = int(lengths.sum())
    seq_end = np.repeat(np.cumsum(lengths), lengths)          # 每个位置所在序列的结尾（开区间）
    j = np.arange(N)
    col = np.full(V, -1, dtype=np.int64)
    col[vocab_ids] = np.arange(vocab_ids.size)
    Y = data["train_tokens"].astype(np.int64)

    def ahead(i):                                            # 位置 j 之后第 i 个 token 在草稿词表里的列（没有 = -1）
        lab = np.full(N, -1, dtype=np.int64)
        ok = j + i < seq_end
        lab[ok] = col[Y[j[ok] + i]]
        return lab
    return Y, ahead, seq_end


def train(data, lm, progress=True):
    """训练两个草稿 -> (medusa 参数, eagle 参数, 草稿词表, 每个 epoch 的损失 {medusa, eagle})。"""
    cfg = lm.cfg
    d, V = cfg.d_model, cfg.vocab
    vocab_ids = draft_vocab(data["train_tokens"], VOCAB_N)
    sc = train_scale(lm)                                                   # 草稿在 √d·f 的尺度上算
    head = np.ascontiguousarray(lm._head[:, vocab_ids].astype(np.float32) / np.float32(sc))
    F = data["train_feats"].astype(np.float32) * np.float32(sc)
    Y, ahead, seq_end = training_rows(data, vocab_ids, V)
    N = F.shape[0]
    med_labels = np.stack([ahead(i + 1) for i in range(K_HEADS)])          # [k, N]
    rows_m = np.flatnonzero(med_labels[0] >= 0)                            # 至少第一个头有标签的位置

    def bar(what):
        t0 = time.perf_counter()
        return (lambda ep, b, nb: _bar(b, nb, t0, f"{what} epoch {ep + 1}/{EPOCHS}")) if progress else None

    pm = init_medusa(d, K_HEADS, np.float32)
    loss_m = train_epochs(pm, lambda p, idx: medusa_loss(p, head, F[rows_m[idx]], med_labels[:, rows_m[idx]]),
                          rows_m.size, BATCH, EPOCHS, LR, np.random.default_rng(SEED), bar("Medusa"))
    for ep, l in enumerate(loss_m):
        print(f"Medusa epoch {ep + 1}: 平均损失（{K_HEADS} 个头的交叉熵之和）{l:.4f}", flush=True)
    nxt = np.flatnonzero(np.arange(N) + 1 < seq_end)                        # 有下一个位置的
    X = (eagle_inputs(lm, F[nxt] / np.float32(sc), Y[nxt]) * np.float32(sc)).astype(np.float32)
    Fn = F[nxt + 1]
    lab = ahead(1)[nxt]
    pe = init_eagle(d, np.float32)
    loss_e = train_epochs(pe, lambda p, idx: eagle_loss(p, head, X[idx], Fn[idx], lab[idx], FEAT_WEIGHT),
                          nxt.size, BATCH, EPOCHS, LR, np.random.default_rng(SEED + 1), bar("EAGLE"))
    for ep, l in enumerate(loss_e):
        print(f"EAGLE  epoch {ep + 1}: 平均损失（交叉熵 + 特征回归）{l:.4f}", flush=True)
    return pm, pe, vocab_ids, {"medusa": loss_m, "eagle": loss_e}, {"medusa_rows": int(rows_m.size),
                                                                     "eagle_rows": int(nxt.size)}


def save_npz(path, arrays):
    """np.savez 的格式，但 zip 里每个文件的时间戳固定（np.savez 写当前时间）：同样的数组 -> 同样的字节。"""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name in sorted(arrays):
            buf = io.BytesIO()
            np.save(buf, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            z.writestr(info, buf.getvalue())


def main():
    args = sys.argv[1:]
    data_path = args[args.index("--data") + 1] if "--data" in args else None
    path = gguf_path_or_exit()
    t_all = time.perf_counter()
    P, cfg, tok = load_gguf(path, dtype=np.float32)
    lm = TransformerLM(P, cfg, "SmolLM2")
    t0 = time.perf_counter()
    if data_path and os.path.exists(data_path):
        with np.load(data_path) as z:
            data = {k: z[k] for k in z.files}
        print(f"数据：从 {data_path} 读入")
    else:
        data = make_data(lm, cfg, tok)
        if data_path:
            np.savez(data_path, **data)
    t_data = time.perf_counter() - t0
    n_tok = int(data["train_lengths"].sum())
    print(f"数据：{len(data['train_lengths'])} 个回答、{n_tok} 个 token（特征 {data['train_feats'].shape}）；"
          f"留出 {len(HELDOUT)} 个提示、{int(data['heldout_lengths'].sum())} 个 token；用时 {t_data:.0f} s", flush=True)
    t0 = time.perf_counter()
    pm, pe, vocab_ids, losses, rows = train(data, lm)
    t_train = time.perf_counter() - t0
    cover = float(np.isin(data["train_tokens"], vocab_ids).mean())
    print(f"训练：用时 {t_train:.0f} s；草稿词表 {vocab_ids.size} 个 token，覆盖训练 token 的 {cover:.1%}")
    os.makedirs(OUT_DIR, exist_ok=True)
    arrays = {"medusa_w": pm["w"].astype(np.float16), "medusa_b": pm["b"].astype(np.float16),
              "eagle_w_in": pe["w_in"].astype(np.float16), "eagle_b_in": pe["b_in"].astype(np.float16),
              "eagle_w1": pe["w1"].astype(np.float16), "eagle_b1": pe["b1"].astype(np.float16),
              "vocab_ids": vocab_ids,
              "train_tokens": data["train_tokens"].astype(np.int32),
              "train_lengths": data["train_lengths"].astype(np.int32)}
    for k in ("heldout_prompts", "heldout_prompt_lengths", "heldout_tokens", "heldout_lengths"):
        arrays[k] = data[k].astype(np.int32)
    save_npz(os.path.join(OUT_DIR, OUT_NPZ), arrays)
    meta = {"command": COMMAND, "gguf_sha256": sha256_file(path), "dtype_of_training": "float32",
            "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS", ""),
            "train_prompts": len(training_prompts()), "train_answers": int(len(data["train_lengths"])),
            "train_tokens": n_tok, "heldout_prompts": list(HELDOUT), "max_tokens": MAX_TOKENS,
            "heldout_tokens": HELDOUT_TOKENS, "k_heads": K_HEADS, "vocab_n": int(vocab_ids.size),
            "epochs": EPOCHS, "batch": BATCH, "lr": LR, "seed": SEED, "rows": rows,
            "loss_per_epoch": {k: [round(float(x), 6) for x in v] for k, v in losses.items()}}
    with open(os.path.join(OUT_DIR, OUT_JSON), "w", encoding="utf-8") as f:
        json.dump(meta, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"写好 {OUT_DIR}/{OUT_NPZ}（{os.path.getsize(os.path.join(OUT_DIR, OUT_NPZ)) / 1e6:.2f} MB）和 {OUT_JSON}；"
          f"总用时 {time.perf_counter() - t_all:.0f} s")


if __name__ == "__main__":
    main()
