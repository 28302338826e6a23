"""
runner_lab.dispatch_matmul：引擎的权重矩阵乘按行数分路——M = 1 和 M > ROWWISE_MAX_ROWS 一次矩阵乘，
2 ≤ M ≤ ROWWISE_MAX_ROWS 一行一次，大于 ROWWISE_BLOCK_BYTES 的矩阵（lm_head）一行一次、按列分块。

- 每条路、每个形状（列数不是块宽的整数倍：最后一块是残块）的结果都在点积的舍入界里等于精确值；
- 分块的路真的被走到（把界调小，小模型的 lm_head 也分块），引擎里 2、3 个请求同时 decode 时每个请求 ==
  它单独生成的（float64：token 相同、logits 差 < 1e-12），块一个不漏。
SmolLM2 的 lm_head（float32 113 MB）在真实模型的引擎测试里走这条路；这里用小模型把每一种错都抓住。
"""
import numpy as np
import pytest

import runner_lab
from decode_lab import TransformerLM, autoregressive_generate
from engine_lab import LLMEngine
from transformer_lab import LMConfig, init_params


def exact_rows(x, w):
    """x @ w 的参考值，在 longdouble 里算（x86 上 64 位尾数，比 float64 精得多；在 longdouble 就是 float64 的平台上，
    它自己的舍入也在同一个界里，所以下面的界取 2 倍）。"""
    return np.einsum("ik,km->im", x.astype(np.longdouble), w.astype(np.longdouble))


@pytest.mark.parametrize("M", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("m", [5, 1024, 2500])
def test_every_path_is_the_product_within_the_dot_product_bound(M, m, monkeypatch):
    """|算的 − 参考| ≤ 2·k·ε·Σ|x||w|（k 项点积的标准舍入界 k·ε·Σ|x||w|，算的和参考各一份；ε = float64 的机器精度）：
    每一列都要算到（np.empty 留下的垃圾、漏掉的残块都远远出界）。"""
    monkeypatch.setattr(runner_lab, "ROWWISE_BLOCK_BYTES", 0)          # 这里每个矩阵都算"大"：分块的路
    monkeypatch.setattr(runner_lab, "ROWWISE_BLOCK_COLS", 1024)
    R = np.random.default_rng(M * 10_000 + m)
    k = 37
    x, w = R.standard_normal((M, k)), R.standard_normal((k, m))
    got = runner_lab.dispatch_matmul(x, w)
    assert got.shape == (M, m) and got.dtype == np.float64
    bound = 2 * k * np.finfo(np.float64).eps * (np.abs(x) @ np.abs(w))
    assert np.all(np.abs(got - exact_rows(x, w)) <= bound)


def test_the_blocked_path_is_taken_only_for_big_matrices_and_a_few_rows(monkeypatch):
    """大矩阵、2–3 行时按列分块（数 matmul 的调用：每块每行一次），小矩阵一行一次，M = 4 一次 GEMM。"""
    calls = []
    real = np.matmul

    def counting(a, b, *args, **kw):
        calls.append(b.shape[1])
        return real(a, b, *args, **kw)
    monkeypatch.setattr(runner_lab.np, "matmul", counting)
    monkeypatch.setattr(runner_lab, "ROWWISE_BLOCK_COLS", 100)
    R = np.random.default_rng(0)
    w = R.standard_normal((8, 250))
    monkeypatch.setattr(runner_lab, "ROWWISE_BLOCK_BYTES", w.nbytes - 1)
    runner_lab.dispatch_matmul(R.standard_normal((3, 8)), w)
    assert calls == [100] * 3 + [100] * 3 + [50] * 3                  # 3 块（最后一块 50 列）× 3 行
    calls.clear()
    monkeypatch.setattr(runner_lab, "ROWWISE_BLOCK_BYTES", w.nbytes)   # 不比界大：不分块
    runner_lab.dispatch_matmul(R.standard_normal((3, 8)), w)
    assert calls == []


@pytest.mark.parametrize("T", [0.0, 1.0])
def test_engine_with_blocked_lm_head_equals_each_request_alone(T, monkeypatch):
    """界调到 0：小模型的每个权重矩阵在 2、3 行的步里都分块（块宽 100 列，词表 512 不整除）。2 或 3 个请求
    同时 decode，每个请求的输出和 logits == 它单独生成的（float64）。"""
    monkeypatch.setattr(runner_lab, "ROWWISE_BLOCK_BYTES", 0)
    monkeypatch.setattr(runner_lab, "ROWWISE_BLOCK_COLS", 100)
    cfg = LMConfig(max_seq=48, n_layers=2)
    model = TransformerLM(init_params(cfg, 3), cfg)
    R = np.random.default_rng(8)
    prompts = [[int(t) for t in R.integers(0, cfg.vocab, size=n)] for n in (4, 9, 6)]
    for n_req in (2, 3):
        eng = LLMEngine(model, cfg, 32, block_size=4, max_num_seqs=n_req, keep_logits=True)
        ids = [eng.add_request(p, 6, T, 70 + i) for i, p in enumerate(prompts[:n_req])]
        for _ in range(40):                                            # 有界：每个请求 6 个 token
            if not eng.has_unfinished_requests():
                break
            eng.step()
        assert not eng.has_unfinished_requests()
        assert max(s["decodes"] for s in eng.steps) == n_req, "要真的有 2、3 行的 decode 步"
        for i, rid in enumerate(ids):
            want = [int(t) for t in autoregressive_generate(model, prompts[i], 6, T, np.random.default_rng(70 + i))]
            assert eng.requests[rid].output == want
            seq = prompts[i] + want
            ref = model.full_logits([seq[:-1]])[0, len(prompts[i]) - 1:]
            got = np.array(eng.requests[rid].logits)
            assert np.max(np.abs(got - ref)) < 1e-12 * max(1.0, np.max(np.abs(ref)))
        assert eng.num_free_blocks == eng.num_blocks
