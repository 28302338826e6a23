"""
解码的基准：QCFG 模型每秒能走几个 decode 步（带账本 / 不带账本），投机解码每秒产出几个 token。

运行（仓库根目录）：python3 tests/bench_decode.py
这不是测试（pytest 不收集），计时会随机器的负载波动；每项取 5 次里最快的一次。种子脚本 04 的运行时间几乎
全花在 decode 步上（约 1.8 万次前向），所以这里的"每步微秒数"直接决定它跑多久。
"""
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _sub in ("lecture06", "lecture03", "prereq3", "lecture02", "lecture01"):
    sys.path.insert(0, os.path.join(ROOT, _sub))

from decode_lab import autoregressive_generate, speculative_generate, TransformerLM  # noqa: E402
from quant_lab import QCFG, quantize_params  # noqa: E402
from transformer_lab import config_like, init_params  # noqa: E402
from ledger_lab import Counter  # noqa: E402


def best_of(fn, repeat=5):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    P = init_params(QCFG, seed=0)
    target = TransformerLM(P, QCFG, "目标")
    pk = dict(P)
    pk["layers"] = P["layers"][:3]
    draft3 = TransformerLM(pk, config_like(QCFG, n_layers=3), "前3层")
    int4 = TransformerLM(quantize_params(P, "int4-g32", include_lm_head=True)[0], QCFG, "int4")
    n_steps = 200
    prompt = np.arange(16) % QCFG.vocab

    def decode(counter):
        cache = target.new_cache(1)
        target.forward(prompt[None, :], cache, counter)
        tok = np.array([[1]])
        for _ in range(n_steps):
            target.forward(tok, cache, counter)

    t_plain = best_of(lambda: decode(None))
    t_ledger = best_of(lambda: decode(Counter()))
    print(f"QCFG decode 一步（批 1，无账本）：{t_plain / n_steps * 1e6:.0f} µs，每秒 {n_steps / t_plain:.0f} 步")
    print(f"QCFG decode 一步（批 1，记账本）：{t_ledger / n_steps * 1e6:.0f} µs，每秒 {n_steps / t_ledger:.0f} 步")

    n_new = 96
    t_ar = best_of(lambda: autoregressive_generate(target, prompt, n_new, 1.0, np.random.default_rng(0)))
    print(f"普通自回归生成：每秒 {n_new / t_ar:.0f} 个 token")
    for name, dr, g in (("INT4 草稿", int4, 8), ("前 3 层草稿", draft3, 8), ("前 3 层草稿", draft3, 4)):
        t = best_of(lambda: speculative_generate(target, dr, prompt, n_new, g, 1.0, np.random.default_rng(0)))
        print(f"投机解码（{name}，γ = {g}）：每秒 {n_new / t:.0f} 个 token（numpy 上草稿不便宜，只看实现有多快）")


if __name__ == "__main__":
    main()
