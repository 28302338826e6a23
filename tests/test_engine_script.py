"""
第 5 讲 08_numpy_engine.py：演示 2–5（模型时间、重放）直接调用、断言它们返回的数；演示 1、6 从脚本的输出
（test_scripts 已经跑过一次，这里共用）里读。只读 GGUF 的元数据和分词器（不装权重），所以很快。
"""
import re

import numpy as np
import pytest

from conftest import load_script, script_stdout, smollm2_path
from gguf_lab import read_gguf
from real_model_lab import gguf_config
from bpe_lab import BPETokenizer

S8 = "lecture05/08_numpy_engine.py"
_CTX = {}


def ctx():
    if not _CTX:
        g = read_gguf(smollm2_path())
        _CTX["cfg"] = gguf_config(g, np.float32)
        _CTX["tok"] = BPETokenizer.from_gguf_metadata(g.metadata)
        g.close()
        _CTX["mod"] = load_script(S8)
    return _CTX["mod"], _CTX["cfg"], _CTX["tok"]


def quiet(f, *a):
    import contextlib
    import io
    with contextlib.redirect_stdout(io.StringIO()):
        return f(*a)


def test_demo2_throughput_at_16_is_at_least_4x_and_knee_at_twice_the_ridge():
    mod, cfg, _ = ctx()
    r = quiet(mod.demo2_batch, cfg)
    assert r["tps"][16] / r["tps"][1] >= 4
    assert r["ridge"] == pytest.approx(53e9 / 10.4e9)
    # float32 decode 的强度 ≈ B/2（KV 的字节让它略小）：第一个越过拐点的批是 16（8 的强度 ≈ 4 < 5.1）
    assert r["knee"] == 16
    tps = [r["tps"][b] for b in mod.BATCHES]
    assert all(b >= a for a, b in zip(tps, tps[1:]))


def test_demo3_paged_runs_more_at_once_and_reservation_never_preempts():
    mod, cfg, _ = ctx()
    r = quiet(mod.demo3_paged_vs_reserved, cfg)
    pg, rs = r["engine"]["分页（16 一块）"], r["engine"][f"整段预留 {mod.MAX_LEN3}"]
    assert rs["max"] == mod.POOL_TOKENS3 // mod.MAX_LEN3 and rs["pre"] == 0
    assert pg["max"] > rs["max"] and pg["pre"] > 0 and pg["t"] < rs["t"]


def test_demo4_hits_equal_the_full_blocks_shared_with_earlier_prompts():
    """命中的块数按提示手算：每个请求开头有几个满块（最多 (len − 1) // 16）和更早的某个提示逐 token 相同。"""
    mod, cfg, tok = ctx()
    r = quiet(mod.demo4_prefix_cache, cfg, tok)
    doc = (mod.DOC_SENT * mod.DOC_REPEAT).strip()
    prompts = [tok.chat(doc + "\n\n" + q) for q in mod.DOC_QUESTIONS]
    B = mod.BLOCK
    want = 0
    for i, p in enumerate(prompts):
        best = 0
        for q in prompts[:i]:
            k = 0
            while k < (len(p) - 1) // B and p[k * B:(k + 1) * B] == q[k * B:(k + 1) * B] and (k + 1) * B <= len(q):
                k += 1
            best = max(best, k)
        want += best
    assert r["on"]["hits"] == want and r["off"]["hits"] == 0
    assert r["on"]["computed"] == r["off"]["computed"] - want * B
    assert r["on"]["ttft"] < r["off"]["ttft"]


def test_demo5_small_budget_bounds_the_stall():
    mod, cfg, _ = ctx()
    r = quiet(mod.demo5_chunked, cfg)
    lo, hi = mod.BUDGETS[0], mod.BUDGETS[-1]
    assert r[lo]["itl_max"] < r[hi]["itl_max"] / 5
    # 长提示的段数：预算减去 8 个 decode 的 token 才是它每步能拿的（64 → 56 一段，1024 个 token → 19 段）
    assert r[lo]["pieces"] == -(-mod.LONG_PROMPT // (lo - mod.N_DECODERS))
    # CPU 的拐点：float32 decode 读 4 字节权重做 2 次 FLOP，(8 + c) 行仍受带宽限制要 2·(8 + c)/算力 ≤ 4/带宽，
    # c ≤ 2·53/10.4 − 8 ≈ 2.2（注意力的 FLOPs 和 KV 的字节略有出入）
    assert r["knee_cpu"] == int(2 * 53e9 / 10.4e9 - mod.N_DECODERS)
    assert r["knee_gpu"] > 100 * max(r["knee_cpu"], 1)


def test_demo1_every_answer_equals_its_solo_run_and_demo6_prints_bounds_not_blas_digits():
    """
    回归：演示 6 曾印出舍入误差本身（5.5e-05、7.1e-14），它的各位数字随 BLAS 的内核变（Sandybridge 内核 6.0e-05、
    numpy 1.24 6.1e-05），同一个脚本在不同的机器上印出不同的字节。现在只印上界；实测超出上界时脚本会照实印出数字，
    所以这里看到上界 = 实测的在上界之内。
    """
    out = script_stdout(S8)
    m = re.search(r"(\d+) / (\d+) 个回答和这个请求单独跑", out)
    assert m and m.group(1) == m.group(2)
    mod, _, _ = ctx()
    assert (mod.BOUND32, mod.BOUND64) == (1e-4, 1e-12)
    assert re.search(r"float32  演示 1 的请求流 vs 各自单独跑 +< 1e-4 +0\.\d\d +0\n", out)
    assert re.search(r"float32  2 个提示一起 prefill vs 各自 +< 1e-4\n", out)
    assert re.search(r"float64  2 个提示一起 prefill vs 各自 +< 1e-12\n", out)
    demo6 = out[out.index("演示 6"):]
    assert not re.search(r"\d\.\de-\d\d", demo6)              # 没有 BLAS 定的数字（x.xe-yy）
    # 翻转的粗估按上界算：1 / (2 · 1e-4 · 密度)，密度 = 差距 < 0.5 的比例 / 0.5（比例按印出的百分数，只留一位有效数字）
    m = re.search(r"这里 (\d+) 个位置里差距 < 0\.5 的占 (\d+)%；偏差按上界 1e-4 算）：至少约每 ([\d,]+) 个", demo6)
    assert m
    frac = int(m.group(2)) / 100
    assert int(m.group(3).replace(",", "")) == float(f"{1 / (2 * 1e-4 * frac / 0.5):.1g}")


def test_sci_and_below_format_bounds():
    mod, _, _ = ctx()
    assert [mod.sci(x) for x in (1e-4, 2e-4, 1e-12, 2.0 ** 29)] == ["1e-4", "2e-4", "1e-12", "5e8"]
    assert mod.below(5.5e-5, 1e-4) == "< 1e-4" and mod.below(1.5e-4, 1e-4) == "1.5e-04"
