"""
lecture05/09_serving_under_load.py：每个观察引用的数由独立的算法重算；"重放 == 真跑"在一个小模型上核对；
稳态的一步是 modelled_step_time 的不动点；06 的解析模拟用的"半带宽"等于按 float32 的字节算；--live 的路径用一个
小模型的服务器跑一遍（真的 HTTP、127.0.0.1 的临时端口、SmolLM2 的分词器）。
"""
import math

import numpy as np
import pytest

from conftest import load_script, script_results, script_stdout, smollm2_path
from bpe_lab import BPETokenizer, bytes_to_unicode
from engine_lab import LLMEngine
from hw_specs import Chip
from iteration_lab import iteration_time
from runner_lab import CPU_COST, modelled_step_time
from transformer_lab import config_like, init_params

REL = "lecture05/09_serving_under_load.py"
S = load_script(REL)


@pytest.fixture(scope="module")
def d1():
    """演示 1 返回的数：取自脚本自己的运行（test_scripts 跑的那一次，console.save_results 存下的），不在进程里再跑一遍。"""
    return script_results(REL)["d1"]


@pytest.fixture(scope="module")
def d2():
    """演示 2 返回的数：取自脚本自己的运行（test_scripts 跑的那一次，console.save_results 存下的），不在进程里再跑一遍。"""
    return script_results(REL)["d2"]


_BY_HAND = {}


def by_hand(rate):
    """
    引擎的请求（requests_at）-> 每个请求的 (TTFT, TPOT)，直接从 token 的时间算（不用 metrics_lab）。每个率只算一次。
    """
    if rate not in _BY_HAND:
        _BY_HAND[rate] = [(t[0] - arrival, (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else 0.0)
                          for arrival, t in requests_at(rate)]
    return _BY_HAND[rate]


def requests_at(rate):
    """
    率 rate 下每个请求的 (到达时刻, 每个 token 的时刻)，按请求 id 排：取自脚本自己那次运行（console.save_results
    存下的 "times"：演示 1、2 跑过的每个率）；脚本没跑过的率在这里跑引擎。
    """
    saved = script_results(REL)["times"]
    if (rate, S.N_REQ) in saved:
        return saved[(rate, S.N_REQ)]
    eng, ids = S.run_engine(rate)
    return [(eng.requests[i].arrival, eng.requests[i].token_times) for i in ids]


def test_cfg_is_the_smollm2_file_in_float32():
    from test_engine_script import gguf_info
    real = gguf_info(smollm2_path(), "cfg32")                # real_model_lab.gguf_config（会话里只读一次元数据）
    assert config_like(real, name=S.CFG.name) == S.CFG


def test_replay_equals_running_a_model_step_for_step():
    """一个小模型（词表同 SmolLM2、2 层、float64）真跑前 8 个请求；用它的 token 重放、用占位的 0 重放：每个 token 的时刻一样。"""
    cfg = config_like(S.CFG, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=32, dtype="float64",
                      max_seq=256)
    params = init_params(cfg, 0)
    n, rate = 8, 2.0
    real, ids = S.run_engine(rate, n, cfg=cfg, params=params)
    streams = {i: list(real.requests[i].output) for i in ids}
    again, _ = S.run_engine(rate, n, streams=streams, cfg=cfg)
    zeros, _ = S.run_engine(rate, n, streams={i: [0] * len(streams[i]) for i in ids}, cfg=cfg)
    for e in (again, zeros):
        assert [r.token_times for r in e.requests] == [r.token_times for r in real.requests]
        assert [s["chunks"] for s in e.steps] == [s["chunks"] for s in real.steps]
    assert sum(len(v) for v in streams.values()) == int(S.OUT_LENS[:n].sum())
    assert max(s["seqs"] for s in real.steps) > 1                          # 真的成批跑过


def test_attainment_and_goodput_recomputed_by_hand(d1):
    for r in S.RATES:
        m = by_hand(r)
        att = np.mean([t <= S.TTFT_SLO and p <= S.TPOT_SLO for t, p in m])
        assert d1["eng_att"][r] == pytest.approx(att, abs=1e-15)
    # goodput：那个率达标、比它高的那个点不达标（或者到了稳态的上限）
    att_at = lambda r: np.mean([t <= S.TTFT_SLO and p <= S.TPOT_SLO for t, p in by_hand(r)])  # noqa: E731
    assert att_at(d1["goodput"]) >= S.GOAL
    assert d1["upper"] >= d1["cap"] or att_at(d1["upper"]) < S.GOAL
    i = max(k for k, r in enumerate(S.RATES) if r <= d1["goodput"])          # goodput 落在粗网格的哪一格
    assert d1["width"] == pytest.approx((S.RATES[i + 1] - S.RATES[i]) / (S.N_REFINE + 1), rel=1e-9)
    assert d1["hits"] == 0 and d1["goodput_06"] > d1["goodput"]
    assert d1["cap_06"] > d1["cap"]                                           # 去掉开销，撑得住的率更高
    # 第一个不达标的率，和它超标的请求数
    fail = min(r for r in S.RATES if att_at(r) < S.GOAL)
    m = by_hand(fail)
    assert (d1["fail_rate"], d1["n_ttft"], d1["n_tpot"]) == (fail, sum(t > S.TTFT_SLO for t, _ in m),
                                                             sum(p > S.TPOT_SLO for _, p in m))
    # 最低的率、一个序列单独 decode 的一步：读一遍 float32 的权重 + 每步 + 每序列开销（KV 不计）
    w_bytes = 4 * (S.M.params() - 0)
    # 一行：一行一次的 GEMV 路（标定的 gemv 带宽）
    assert d1["single"] == pytest.approx(w_bytes / CPU_COST["gemv_bytes_per_s"] + CPU_COST["step_s"] + CPU_COST["seq_s"],
                                         rel=0.02)


def test_half_bandwidth_chip_equals_float32_bytes():
    full = Chip("cpu", mem_bw=CPU_COST["bytes_per_s"], mem_bytes=0.0, flops={"bf16": CPU_COST["flops_per_s"]})
    for nd, ctx, pre in ((1, 100, 0), (4, 800, 0), (2, 300, 200), (0, 0, 256)):
        a = iteration_time(S.M, S.CPU_CHIP, nd, ctx, prefill_tokens=pre)
        b = iteration_time(S.M, full, nd, ctx, prefill_tokens=pre, w_bits=32, kv_bits=32)
        assert a == pytest.approx(b, rel=1e-12)


def test_steady_state_is_a_fixed_point_of_the_step_time(d2):
    o = float(S.OUT_LENS.mean())
    for r in S.RATES:
        st = S.steady_state(r)
        if not st["ok"]:
            continue
        assert modelled_step_time(st["counts"]) == pytest.approx(st["s"], rel=1e-12)
        assert st["B"] == pytest.approx(r * (o - 1) * st["s"], rel=1e-12)
    cap = d2["cap"]
    assert S.steady_state(cap)["ok"] and not S.steady_state(cap * 1.001)["ok"]
    assert cap <= d2["lam_work"] and d2["lam_work"] == pytest.approx(
        1 / (d2["work"]["compute"] + d2["work"]["bytes"] + d2["work"]["seq"]), rel=1e-12)
    # 1/(活) 正是"斜率 = 1"的率：略低有不动点的斜率 < 1，略高没有
    assert S.steady_state(d2["lam_work"] * 1.0001)["why"] == "活干不完"
    assert d2["first_unstable"] == min(r for r in S.RATES if r > cap)


def test_queue_at_the_last_arrival_recomputed(d2):
    for r in S.RATES:
        arr = [a for a, _ in requests_at(r)]
        first = [t[0] for _, t in requests_at(r)]
        want = sum(1 for a, f in zip(arr, first) if a < arr[-1] < f)
        assert d2["rows"][r]["queued"] == want
    assert d2["queued_top"] > d2["queued_stable_max"]
    assert d2["s_dec"] <= d2["tpot_sim"] <= d2["s_mix"]                     # 观察 4 说"落在两者之间"
    assert d2["tpot_sim"] == pytest.approx(np.median([p for _, p in by_hand(d2["r_last"])]), rel=1e-12)


def test_printed_figures(d1, d2):
    out = script_stdout(REL)
    assert f"引擎的 goodput 约 {d1['goodput']:.3g} req/s" in out
    assert f"有稳态的最高到达率约 {d2['cap']:.3g} req/s" in out
    assert "--live" not in out and "演示 3" not in out


def big_tokenizer(vocab):
    """词表 = 3 个特殊 token + 256 个单字节 + 两字节的组合，凑到 vocab 个（没有模型文件时测 --live：提示是 SmolLM2 大小的 id）。"""
    b2u = bytes_to_unicode()
    toks = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [b2u[b] for b in range(256)]
    toks += [b2u[x] + b2u[y] for x in range(256) for y in range(256)][:vocab - len(toks)]
    return BPETokenizer(toks, [], [3, 3, 3] + [1] * (vocab - 3), eos_id=2)


def _live_tokenizer(vocab):
    """
    SmolLM2 的文件已经在本机：用它的分词器（会话里只建一次，test_engine_script、test_serve_hardening 也用它）；
    不在（离线）：big_tokenizer（这个测试不需要模型文件，离线照样跑，不下载）。
    """
    from hub_lab import ModelUnavailableError, gguf_path, is_smollm2
    try:
        path = gguf_path(fetch=False)
    except ModelUnavailableError:
        path = None
    if path and is_smollm2(path):
        from test_engine_script import gguf_info
        return gguf_info(path, "tok")
    return big_tokenizer(vocab)


def test_live_path_runs_the_server_and_the_load_generator_over_http(capsys):
    """
    --live 的路径（demo3_live）：小模型（1 层，词表同 SmolLM2）的服务器、真的 HTTP。分词器的词表和 SmolLM2 一样大
    （_live_tokenizer）：提示是 SmolLM2 词表里的 id，小模型吐出的每个 id 也都解码得了。
    """
    from test_serve import serve                         # test_serve 装好的 serve.py（不再装一遍）
    cfg = config_like(S.CFG, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=32, max_seq=256)
    params = init_params(cfg, 0)
    tok = _live_tokenizer(cfg.vocab)
    assert len(tok.tokens) == cfg.vocab

    engines = []

    def start():
        eng = LLMEngine(params, cfg, S.N_BLOCKS, S.BLOCK, S.BUDGET, S.MAX_SEQS, clock="wall")
        engines.append(eng)
        return serve.make_server(eng, tok, "tiny")
    # 一个有限的率（按泊松到达的时刻真的等着发）和 inf（一次全发）：率取 200 req/s，4 个请求的到达只跨几十毫秒
    sums = S.demo3_live(start, n=4, rates=(200.0, math.inf))
    # 每个率一个新服务器（新引擎）：第二个率不会命中第一个率留下的前缀缓存（同样的提示重发过去会全部命中）
    assert len(engines) == 2 and all(e.bm.hits == 0 for e in engines)
    out = capsys.readouterr().out
    assert "演示 3" in out and "实测" in out
    assert [s["completed"] for s in sums] == [4, 4]
    assert [s["output_tokens"] for s in sums] == [int(S.OUT_LENS[:4].sum())] * 2
