"""
重复种子脚本 lecture06/04 的演示 3、4：换 N 组别的随机种子再跑，数一数它打印的每一句话有多大比例成立。

种子脚本只打印一次抽样的结果；这个工具检查那次抽样"不是碰巧好"：QCFG 的初始化尺度就是用它挑的
（quant_lab.py 的说明：挑可行区域的中间，让大多数抽样都和脚本的文字相符）。

两种重复：
  --vary sampler（默认）：模型固定（init_params 的 seed = 0，和脚本一样），换提示、测 α 的文本和采样器的随机数；
  --vary model：连模型的初始化种子也换（检查 QCFG 这组尺度本身在可行区域中间，而不是 seed 0 碰巧好）。

运行（仓库根目录）：python3 tests/replicate_seed04.py [--n 20] [--vary sampler|model] [--jobs 2]
它不是测试（文件名不以 test_ 开头，pytest 不收集）；它重新实现了演示 3、4 的循环（用同样的实验模块）。
"""
import argparse
import math
import os
import sys
from multiprocessing import Pool

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _sub in ("lecture06", "lecture03", "prereq3", "lecture02", "lecture01"):
    sys.path.insert(0, os.path.join(ROOT, _sub))

from decode_lab import adjust, autoregressive_generate, NGramLM, speculative_generate, TransformerLM  # noqa: E402
from spec_math_lab import expected_tokens, ops_factor, truncated_geometric  # noqa: E402
from stats_lab import chi2_gof  # noqa: E402
from quant_lab import QCFG, quantize_params, sample_tokens  # noqa: E402
from transformer_lab import config_like, init_params  # noqa: E402
from ledger_lab import Counter, MATMUL_OPS  # noqa: E402

GAMMAS = (1, 2, 4, 8)
NAMES = ("INT4 量化的自己", "只用前 3 层", "只用前 1 层", "二元语法表")


def build_models(cfg=QCFG, model_seed=0):
    """和种子脚本的 build_models 相同（可换模型种子和配置）。"""
    P = init_params(cfg, seed=model_seed)
    target = TransformerLM(P, cfg, "目标")
    drafts = {NAMES[0]: TransformerLM(quantize_params(P, "int4-g32", include_lm_head=True)[0], cfg, "int4")}
    for k, name in ((3, NAMES[1]), (1, NAMES[2])):
        pk = dict(P)
        pk["layers"] = P["layers"][:k]
        drafts[name] = TransformerLM(pk, config_like(cfg, n_layers=k), name)
    drafts[NAMES[3]] = NGramLM.fit(sample_tokens(P, cfg, n_seq=64, length=128, seed=1 + model_seed), cfg.vocab)
    return target, drafts


def measured_alpha(target, draft, toks, T=1.0):
    lp = target.full_logits(toks)
    lq = draft.table[toks] if isinstance(draft, NGramLM) else draft.full_logits(toks)
    return float(np.minimum(adjust(lp, T), adjust(lq, T)).sum(-1).mean())


def one_draw(args):
    """一次重复：返回演示 3、4 的全部数字。draw = 0 时随机数和种子脚本完全相同。"""
    draw, model_seed, cfg = args
    target, drafts = build_models(cfg, model_seed)
    off = 1000 * draw
    toks = sample_tokens(target.params, cfg, n_seq=8, length=64, seed=0 + off)
    prompts = sample_tokens(target.params, cfg, n_seq=8, length=16, seed=11 + off)
    n_new = 96
    res = {"alpha": {}, "meas": {}, "pred": {}, "rounds": {}, "acc": {}, "frac": {}}
    for name, dr in drafts.items():
        a = measured_alpha(target, dr, toks)
        res["alpha"][name] = a
        for g in GAMMAS:
            calls, acc = 0, []
            for i, pr in enumerate(prompts):
                _, st = speculative_generate(target, dr, pr, n_new, g, 1.0, np.random.default_rng(100 + i + off))
                calls += st["target_calls"]
                acc += st["accepted"]
            res["meas"][(name, g)] = len(prompts) * n_new / calls
            res["pred"][(name, g)] = expected_tokens(a, g)
            res["rounds"][(name, g)] = calls
            res["acc"][(name, g)] = acc
            res["frac"][(name, g)] = float(np.mean(acc)) / g
    # 演示 4
    prompts4 = sample_tokens(target.params, cfg, n_seq=4, length=16, seed=11 + off)
    dr = drafts[NAMES[1]]
    per_tok = 2 * cfg.to_model_config().matmul_params()
    extra = len(prompts4) * (prompts4.shape[1] - 1) * per_tok
    cb = Counter()
    for i, pr in enumerate(prompts4):
        autoregressive_generate(target, pr, n_new, 1.0, np.random.default_rng(i + off), counter=cb)
    bf, bw = cb.total("flops", MATMUL_OPS) - extra, cb.total("w", MATMUL_OPS)
    res["flop_ratio"], res["w_ratio"] = {}, {}
    for g in (2, 4, 8):
        ct = Counter()
        for i, pr in enumerate(prompts4):
            speculative_generate(target, dr, pr, n_new, g, 1.0, np.random.default_rng(i + off), counter_t=ct)
        res["flop_ratio"][g] = (ct.total("flops", MATMUL_OPS) - extra) / bf
        res["w_ratio"][g] = ct.total("w", MATMUL_OPS) / bw
    res["thm311_8"] = ops_factor(res["alpha"][NAMES[1]], 8, 0)
    return res


def _z(meas, pred, alpha, g, rounds):
    """实测和式 (1) 的差，除以抽样误差（每轮产出 1 + 截断几何分布，方差按 α 算）。"""
    p = truncated_geometric(min(alpha, 1 - 1e-12), g)
    n = np.arange(g + 1) + 1
    var = float((p * n * n).sum() - (p * n).sum() ** 2)
    return (meas - pred) / math.sqrt(var / rounds)


def sign_test_p(n_hi, n_lo):
    """双侧符号检验的 p 值。"""
    n, k = n_hi + n_lo, min(n_hi, n_lo)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)


def claims(r):
    """种子脚本演示 3、4 的每一句话，在这次抽样里是否成立 -> {说法: bool}。"""
    al, meas, pred = r["alpha"], r["meas"], r["pred"]
    cells = [(n, g) for n in NAMES for g in GAMMAS]
    rel = [meas[c] / pred[c] - 1 for c in cells]
    shown = [round(meas[c], 2) - round(pred[c], 2) for c in cells]          # 按打印的两位小数比高低
    n_up, n_down = sum(x > 1e-9 for x in shown), sum(x < -1e-9 for x in shown)
    z = [_z(meas[c], pred[c], al[c[0]], c[1], r["rounds"][c]) for c in cells]
    n_hi = sum(x > 0 for x in rel)
    hist_acc = r["acc"][(NAMES[1], 8)]
    counts = np.bincount(hist_acc, minlength=9)
    _, _, pval = chi2_gof(counts, truncated_geometric(al[NAMES[1]], 8))
    tf = [n for n in NAMES[:3]]
    return {
        "INT4 γ=8 每次前向 > 5 个": meas[(NAMES[0], 8)] > 5,
        "α 顺序：INT4 > 前 3 层 > 前 1 层": al[NAMES[0]] > al[NAMES[1]] > al[NAMES[2]],
        "二元语法表最低或接近最低（差 ≤ 0.02）": al[NAMES[3]] <= min(al[n] for n in tf) + 0.02,
        "γ 越大产出越多（每个草稿）": all(meas[(n, a)] < meas[(n, b)] for n in NAMES for a, b in zip(GAMMAS, GAMMAS[1:])),
        "越准的草稿产出越多（γ = 8，三个 transformer 草稿）": meas[(NAMES[0], 8)] > meas[(NAMES[1], 8)] > meas[(NAMES[2], 8)],
        "每格 100–499 轮（一两百到四百多）": all(100 <= r["rounds"][c] <= 499 for c in cells),
        "抽样误差以内（每格 |z| < 3）": max(abs(x) for x in z) < 3,
        "有高有低（按打印值，高低各 ≥ 2 格，符号检验 p > 0.05；\"没有系统偏差\"不成立：07 演示 3 观察 4）": (
            min(n_up, n_down) >= 2 and sign_test_p(n_up, n_down) > 0.05),
        "平均偏差 |mean(实测/预测 − 1)| < 2%": abs(float(np.mean(rel))) < 0.02,
        "被接受比例随 γ 下降": all(r["frac"][(n, a)] > r["frac"][(n, b)] for n in NAMES for a, b in zip(GAMMAS, GAMMAS[1:])),
        "直方图接近截断几何（χ² 拟合优度的 p > 0.01）": pval > 0.01,
        "γ=8 运算量在 1.8–2.0×（把\"约 +90%\"读宽；04 印的是 1.97×：07 演示 4 观察 2）": 1.8 <= r["flop_ratio"][8] <= 2.0,
        "γ=8 运算量接近定理 3.11（差 < 0.1）": abs(r["flop_ratio"][8] - r["thm311_8"]) < 0.1,
        "γ=8 读权重约五分之一（0.15–0.25×）": 0.15 <= r["w_ratio"][8] <= 0.25,
        "运算量随 γ 增加、读权重随 γ 减少": (r["flop_ratio"][2] < r["flop_ratio"][4] < r["flop_ratio"][8]
                                   and r["w_ratio"][2] > r["w_ratio"][4] > r["w_ratio"][8]),
    }, {"mean_rel": float(np.mean(rel)), "max_z": max(abs(x) for x in z), "n_hi": n_hi, "n_up_shown": n_up}


def replicate(n=20, vary="sampler", jobs=2, cfg=QCFG, first=1):
    """跑 n 次重复（draw = first..first+n−1），返回每次的 (数字, 说法, 统计)。"""
    if vary == "sampler":
        args = [(d, 0, cfg) for d in range(first, first + n)]
    else:
        args = [(d, d, cfg) for d in range(first, first + n)]
    with Pool(jobs) as pool:
        results = pool.map(one_draw, args)
    return [(r,) + claims(r) for r in results]


def main():
    ap = argparse.ArgumentParser(description="重复种子脚本 04 的演示 3、4，数每句话成立的比例")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--vary", choices=("sampler", "model"), default="sampler")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--first", type=int, default=1)
    a = ap.parse_args()
    out = replicate(a.n, a.vary, a.jobs, first=a.first)
    names = list(out[0][1])
    print(f"{a.n} 次重复（--vary {a.vary}），每句话成立的次数：")
    for k in names:
        hits = sum(o[1][k] for o in out)
        print(f"  {hits:3d}/{a.n}  {k}")
    allok = sum(all(o[1].values()) for o in out)
    print(f"  {allok:3d}/{a.n}  全部成立")
    al = {n: [o[0]['alpha'][n] for o in out] for n in NAMES}
    print("α 的范围：" + "；".join(f"{n} {min(v):.3f}–{max(v):.3f}" for n, v in al.items()))
    for key, label in (("mean_rel", "平均相对偏差"), ("max_z", "最大 |z|"), ("n_hi", "偏高的格数"),
                       ("n_up_shown", "按打印值偏高的格数")):
        v = [o[2][key] for o in out]
        print(f"{label}：平均 {np.mean(v):.3f}，范围 {min(v):.3f}–{max(v):.3f}")
    v8 = [o[0]["meas"][(NAMES[0], 8)] for o in out]
    f8 = [o[0]["flop_ratio"][8] for o in out]
    w8 = [o[0]["w_ratio"][8] for o in out]
    print(f"INT4 γ=8 每次前向：{min(v8):.2f}–{max(v8):.2f}；γ=8 运算量 {min(f8):.2f}–{max(f8):.2f}×"
          f"（平均 {np.mean(f8):.3f}，标准差 {np.std(f8):.3f}）；读权重 {min(w8):.2f}–{max(w8):.2f}×")


if __name__ == "__main__":
    main()
