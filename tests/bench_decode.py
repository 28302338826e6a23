"""
解码的基准：QCFG 模型每秒能走几个 decode 步（带账本 / 不带账本），投机解码每秒产出几个 token；
加 --real 时换成真实模型 SmolLM2-135M：装载时间、prefill 和 decode 每秒几个 token（float32 / float64，
BLAS 一个线程 / numpy 默认的线程数），decode 一步读权重的速度，和这台机器的内存能流多快（一次大数组拷贝）。

运行（仓库根目录）：python3 tests/bench_decode.py          （QCFG）
                    python3 tests/bench_decode.py --real   （真实模型；每种设置在一个新进程里跑，
                                                            因为 BLAS 的线程数只能在进程启动前定）
这不是测试（pytest 不收集），计时会随机器的负载波动；每项取几次里最快的一次。种子脚本 04 的运行时间几乎
全花在 decode 步上（约 1.8 万次前向），所以这里的"每步微秒数"直接决定它跑多久。
"""
import json
import os
import subprocess
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


def real_child(dtype):
    """在子进程里：装载真实模型、量 prefill 和 decode，打印一行 JSON。"""
    from real_model_lab import load_gguf
    from transformer_lab import NumpyTransformer
    t0 = time.perf_counter()
    P, cfg, tok = load_gguf(dtype=np.dtype(dtype))
    model = NumpyTransformer(P, cfg)
    t_load = time.perf_counter() - t0
    prompt = np.array([tok.encode("The quick brown fox jumps over the lazy dog. " * 12)[:128]])
    t_pre = best_of(lambda: model.forward(prompt), 3)
    n_steps = 16

    def decode():  # -> 只算 decode 那几步的时间（prefill 不计）
        cache = model.new_cache(1, 160)
        model.forward(prompt, cache)
        t = time.perf_counter()
        for _ in range(n_steps):
            model.forward(np.array([[42]]), cache)
        return time.perf_counter() - t

    t_dec = min(decode() for _ in range(3)) / n_steps
    w_bytes = cfg.to_model_config().matmul_params() * np.dtype(dtype).itemsize   # 一步读的权重（lm_head 含在内）
    big = np.ones(64 * 2 ** 20 // 8 * 8)                                          # 512 MB 的 float64
    t_copy = best_of(lambda: big.copy(), 3)
    print(json.dumps({"load_s": t_load, "prefill_tok_s": prompt.shape[1] / t_pre, "decode_ms": t_dec * 1e3,
                      "weights_GBps": w_bytes / t_dec / 1e9, "copy_GBps": 2 * big.nbytes / t_copy / 1e9}))


def real_main():
    """真实模型：float32 / float64 × BLAS 一个线程 / 默认线程数，各在一个新进程里。"""
    print("SmolLM2-135M 在这台机器上（批 1；prompt 128 个 token；decode 一步 = 读一遍全部矩阵的权重）")
    for threads in ("1", None):
        for dtype in ("float32", "float64"):
            env = dict(os.environ)
            for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
                env.pop(var, None)
                if threads:
                    env[var] = threads
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--real-child", dtype], env=env,
                               capture_output=True, text=True)
            if r.returncode:
                print(r.stderr)
                raise SystemExit(r.returncode)
            d = json.loads(r.stdout.strip().splitlines()[-1])
            who = "BLAS 1 线程" if threads else "BLAS 默认线程数"
            print(f"{dtype}，{who}：装载 {d['load_s']:.1f} s；prefill 每秒 {d['prefill_tok_s']:.0f} 个 token；"
                  f"decode 一步 {d['decode_ms']:.1f} ms（每秒 {1e3 / d['decode_ms']:.1f} 个 token，读权重 "
                  f"{d['weights_GBps']:.1f} GB/s；这台机器一次大拷贝 {d['copy_GBps']:.1f} GB/s）")


if __name__ == "__main__":
    if "--real-child" in sys.argv:
        real_child(sys.argv[sys.argv.index("--real-child") + 1])
    elif "--real" in sys.argv:
        real_main()
    else:
        main()
