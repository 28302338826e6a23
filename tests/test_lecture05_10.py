"""lecture05/10_disaggregation_measured.py：演示返回的数字（真的 worker 进程；玩具模型和不装权重的 replay worker，模型时钟）。
期望值从标定文件、公式和每个请求的 token 时刻在这里重算，不用脚本里算它们的那几行。演示 1、3、4 的数读成对运行那一次
存下的（conftest.script_results），核对的文字就是那次打印的，不在测试进程里再起 worker 跑一遍演示。"""
import json
import os

import numpy as np
import pytest

from conftest import load_script, script_demo_text, script_results
from runner_lab import modelled_step_time, step_counts

REL = "lecture05/10_disaggregation_measured.py"
S = load_script(REL)
with open(os.path.join(os.path.dirname(__file__), "..", "lecture05", "cpu_calibration.json"), encoding="utf-8") as _f:
    DIS = json.load(_f)["sections"]["disaggregation"]["constants"]
SMOL_TOK = 2 * 30 * 3 * 64 * 4                       # SmolLM2：2 · 30 层 · 3 个 KV 头 · 64 · float32


@pytest.fixture(scope="module")
def res():
    return script_results(REL)


@pytest.fixture(scope="module")
def d3(res):
    return res["demo3"]


def test_demo1_nbytes_equals_the_formula_and_the_transfer_is_bytes_over_the_stored_rate(res):
    r = res["demo1"]
    assert r["per_tok"] == 2 * 2 * 2 * 8 * 8
    pipe = {n: (nb, w) for v, n, nb, w in r["rows"] if v == "pipe"}
    shm = {n: (nb, w) for v, n, nb, w in r["rows"] if v == "shm"}
    for n, (nb, w) in pipe.items():
        assert nb == 512 * n and w > nb                       # 管道：头 + K、V
        assert shm[n][0] == 512 * n and 0 < shm[n][1] < 1024   # 共享内存：只有头（几百字节）
    total = SMOL_TOK * 1024
    assert r["smol_per_tok"] == SMOL_TOK and r["smol_total"] == total and r["shm_nbytes"] == total
    assert r["times"]["管道（存下的速率）"] == pytest.approx(total / DIS["pipe_bytes_per_s"], rel=1e-12)
    assert r["times"]["共享内存（存下的速率）"] == pytest.approx(total / DIS["shm_bytes_per_s"], rel=1e-12)
    assert r["times"]["NVLink 4（05/03）"] == total / 450e9
    assert r["times"]["IB NDR 一个端口（05/03）"] == total / 50e9
    t_pre = modelled_step_time(step_counts(S.SMOL, [(1024, 0, True)]))   # 一步算完 1,024 个 token（预算 2,048）
    assert r["t_prefill"] == pytest.approx(t_pre, rel=1e-9)
    out = script_demo_text(REL, 1)
    assert f"{r['times']['管道（存下的速率）'] / t_pre * 100:.1f}%" in out
    slow = max(total / DIS["pipe_bytes_per_s"], total / DIS["shm_bytes_per_s"])
    assert f"慢 {slow / (total / 50e9):.0f} 倍" in out and f"只占它的 {slow / t_pre * 100:.1f}%" in out


def test_demo2_is_the_stored_kappas_times_a_modelled_decode_step(capsys):
    r = S.demo2_bus()
    assert (r["kappa_dd"], r["kappa_dp"]) == (DIS["kappa_dd"], DIS["kappa_dp"])
    assert r["t1"] == modelled_step_time(step_counts(S.SMOL, [(1, 64, True)]))
    out = capsys.readouterr().out
    assert f"慢 {(DIS['kappa_dd'] - 1) * 100:.0f}%" in out and f"只慢 {(DIS['kappa_dp'] - 1) * 100:.0f}%" in out
    assert ("拖慢得多" in out) == (DIS["kappa_dd"] > DIS["kappa_dp"])
    with open(os.path.join(os.path.dirname(__file__), "..", "lecture05", "cpu_calibration.json"), encoding="utf-8") as f:
        mach = json.load(f)["sections"]["disaggregation"]["machine"]
    flat = out.replace("\n", "")
    assert ("机器上还有别人在跑" in flat) == bool(mach["loaded"])      # 说的负载和文件里记的一致
    assert ("没有别的任务" in flat) == (not mach["loaded"])


def test_demo3_metrics_attainment_goodput_and_the_claims_recomputed(d3):
    res = d3["res"]
    for (rate, d), m in res.items():
        assert len(m["ttft"]) == S.N_REQ and min(m["ttft"]) > 0 and min(m["tpot"]) > 0
        ok = [(a <= 1.0) and (b <= 0.080) for a, b in zip(m["ttft"], m["tpot"])]
        assert m["att"] == sum(ok) / len(ok)
        ok_b = [(a <= 0.5) and (b <= 0.150) for a, b in zip(m["ttft"], m["tpot"])]
        assert m["att_b"] == sum(ok_b) / len(ok_b)
        assert m["ttft99"] == float(np.percentile(m["ttft"], 99)) and m["tpot50"] == float(np.median(m["tpot"]))
        assert [t[0] - a for a, t in m["times"]] == m["ttft"]
        assert [(t[-1] - t[0]) / (len(t) - 1) for _, t in m["times"]] == m["tpot"]
        assert m["stall"] == max(b - a for _, t in m["times"] for a, b in zip(t, t[1:]))
        assert [len(t) for _, t in m["times"]] == [int(o) for o in S.OUT_LENS]
    for d in S.DEPLOYS:
        for att, key in (("att", "goodput"), ("att_b", "goodput_b")):
            meets = [r for r in S.RATES if res[(r, d)][att] >= 0.9]
            assert d3[key][d] == (max(meets) if meets else 0.0)
    for key, best in (("goodput", "best_a"), ("goodput_b", "best_b")):
        top = max(d3[key].values())
        assert d3[best] == "、".join(d for d in S.DEPLOYS if d3[key][d] == top)
    assert d3["best_a"] != d3["best_b"], "两对 SLO 下赢的部署不同：观察 4 的要点"
    mid = S.RATES[1]
    w, c, pd = (res[(mid, d)] for d in S.DEPLOYS)
    assert d3["stall_order"] == (w["stall"] > c["stall"] and w["stall"] > pd["stall"])
    assert d3["tpot_pd"] == all(res[(r, S.DEPLOYS[2])]["tpot99"] < min(res[(r, S.DEPLOYS[0])]["tpot99"],
                                                                       res[(r, S.DEPLOYS[1])]["tpot99"]) for r in S.RATES)
    # 这个工作负载上 SLO 这一对是"选择要紧"的：部署之间 goodput 不同
    assert len(set(d3["goodput"].values())) > 1


def test_demo3_one_request_alone_pd_ttft_is_prefill_plus_transfer_and_runs_repeat_exactly():
    """单独一个请求走 1P + 1D：TTFT = 它 prefill 一步的模型时间 + 字节 / 存下的共享内存速率；同一个部署跑两遍，每个时刻相同。
    这两种部署只用 deploy_workers 的前两个 worker（整段的预算）：只起这两个。"""
    from worker_lab import spawn_worker, wait_all
    ws = wait_all([spawn_worker(S.REPLAY, max_num_batched_tokens=S.WHOLE, clock="model", **S.ENGINE_KW)
                   for _ in range(2)])
    try:
        p = S.PROMPTS[0]
        m = S.run_deploy(S.DEPLOYS[2], ws, [(0.5, p, 3)])
        want = modelled_step_time(step_counts(S.SMOL, [(len(p), 0, True)])) + SMOL_TOK * len(p) / DIS["shm_bytes_per_s"]
        assert m["ttft"][0] == pytest.approx(want, rel=1e-9)
        tr = S.trace_at(3.0, 12)
        assert S.run_deploy(S.DEPLOYS[0], ws, tr) == S.run_deploy(S.DEPLOYS[0], ws, tr)
    finally:
        for w in ws:
            w.close()


def test_demo4_hits_plus_prefill_is_the_prompt_and_prefix_beats_round_robin(res):
    r = res["demo4"]
    trace = S.shared_prefix_workload()
    total = sum(len(p) for _, p, _ in trace)
    m = {p: r[("model", p)] for p in ("round_robin", "least_loaded", "prefix")}
    for v in m.values():
        assert v["hit"] + v["prefill"] == v["total"] == total
        assert v["hit"] % 16 == 0                                        # 只按整块命中
    assert m["prefix"]["hit"] > m["round_robin"]["hit"]
    assert m["prefix"]["hit"] >= m["least_loaded"]["hit"]
    assert m["prefix"]["ttft_mean"] < m["round_robin"]["ttft_mean"]
