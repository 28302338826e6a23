"""
引擎的基准（不是 pytest 的测试：文件名不以 test_ 开头）：SmolLM2-135M float32、一个 BLAS 线程，
decode 一步的时间随批（1, 2, 4, … 64 个正在跑的序列）怎么变，和引擎自己的开销（调度、块的账、建下标数组；
按块表取 K/V 算注意力，不算开销）占一步的多少。

目标（issue 27）：16 个序列的 decode 吞吐 ≥ 1 个的 4 倍；16 个序列时引擎自己的开销 ≤ 一步的 10%。
每个批：B 个请求各有 CTX 个 token 的提示，prefill 完以后量 REPEAT 步 decode，取最快的一步（best of 3）。

运行：OPENBLAS_NUM_THREADS=1 python3 tests/bench_engine.py [--batches 1,2,4,8,16,32,64]
"""
import os
import sys
import time

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _sub in ("lecture01", "lecture02", "lecture05", "lecture06"):
    sys.path.insert(0, os.path.join(ROOT, _sub))

import numpy as np  # noqa: E402

from engine_lab import LLMEngine  # noqa: E402
from runner_lab import CPU_COST, step_counts  # noqa: E402
from real_model_lab import load_gguf  # noqa: E402
from transformer_lab import NumpyTransformer  # noqa: E402

CTX, REPEAT, BLOCK = 64, 3, 16


def bench(model, cfg, B):
    """-> (最快一步的秒数, 那一步里引擎自己的开销的秒数)。"""
    nb = max(-(-cfg.max_seq // BLOCK), B * -(-(CTX + REPEAT + 2) // BLOCK))
    eng = LLMEngine(model, cfg, nb, block_size=BLOCK, max_num_batched_tokens=2048, max_num_seqs=B)
    for b in range(B):
        eng.add_request([(7 * b + j) % 1000 + 100 for j in range(CTX)], REPEAT + 2)
    best = None
    while eng.has_unfinished_requests():
        t0 = time.perf_counter()
        eng.step()
        dt = time.perf_counter() - t0
        s = eng.steps[-1]
        if s["decodes"] == B and (best is None or dt < best[0]):
            best = (dt, s["overhead"])
    return best


def main(argv):
    batches = (1, 2, 4, 8, 16, 32, 64)
    if "--batches" in argv:
        batches = tuple(int(x) for x in argv[argv.index("--batches") + 1].split(","))
    P, cfg, _ = load_gguf(dtype=np.float32)
    model = NumpyTransformer(P, cfg)
    print(f"SmolLM2-135M float32，一个 BLAS 线程，每个序列缓存 {CTX} 个 token；每个批量 {REPEAT} 步 decode 取最快（best of 3）")
    print(f"{'批':>4}  {'一步 ms':>9}  {'token/s':>9}  {'× 批 1':>7}  {'开销 ms':>8}  {'开销占比':>8}")
    base, res = None, {}
    for B in batches:
        dt, ov = bench(model, cfg, B)
        tps = B / dt
        base = base or tps
        res[B] = (dt, ov, tps)
        print(f"{B:>4}  {dt * 1e3:>9.1f}  {tps:>9.1f}  {tps / base:>7.2f}  {ov * 1e3:>8.2f}  {ov / dt:>8.1%}")
    # runner_lab.CPU_COST 的两个固定开销：实测一步 − roofline 部分（同样的账、CPU_COST 的算力和带宽），按 a + b·B 拟合
    if len(res) >= 2:
        Bs = np.array(sorted(res), dtype=float)
        roof = [max(k["flops"] / CPU_COST["flops_per_s"], k["bytes"] / CPU_COST["bytes_per_s"])
                for k in (step_counts(cfg, [(1, CTX + 1, True)] * int(B)) for B in Bs)]
        resid = np.array([res[int(B)][0] for B in Bs]) - np.array(roof)
        b, a = np.polyfit(Bs, resid, 1)
        print(f"实测 − roofline ≈ {a * 1e3:.2f} ms + {b * 1e3:.3f} ms × B（runner_lab.CPU_COST 假设 "
              f"{CPU_COST['step_s'] * 1e3:.1f} ms + {CPU_COST['seq_s'] * 1e3:.1f} ms × B）")
    if 1 in res and 16 in res:
        ratio = res[16][2] / res[1][2]
        share = res[16][1] / res[16][0]
        print(f"16 个序列 / 1 个的吞吐：{ratio:.2f} 倍（目标 ≥ 4）；16 个序列时引擎开销占一步 {share:.1%}（目标 ≤ 10%）")


if __name__ == "__main__":
    main(sys.argv[1:])
