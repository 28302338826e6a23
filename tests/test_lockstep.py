"""
齐步走的模型时钟（lockstep_lab）和路由器的 clock="model"：期望的时刻都在测试里按手算写出来（一步单独的模型时间取自同一个
玩具模型在本进程里的引擎，不用被测的函数）。

- bus_finish：prefill 不放慢；decode 在重叠段里慢 κ 倍（部分重叠、两个区间叠在一起取大的）；
- Router（2 个副本）：两个请求同时到，各自 prefill、decode，decode 步全程挨着另一个 decode：每步 × κ_dd；
- PDRouter（1 + 1）：A 的交接在 prefill 结束 + 字节 / 速率时到达；B 的 prefill 和 A 的第一个 decode 部分重叠（κ_dp）。
"""
import json
import math
import os

import numpy as np
import pytest

from engine_lab import LLMEngine
from lockstep_lab import LockstepClock, bus_finish, load_bus, transfer_time
from proc_util import early, foreground
from router_lab import PDRouter, Router
from transformer_lab import LMConfig, init_params
from worker_lab import spawn_worker, wait_all

CFG = LMConfig(max_seq=64)
PARAMS = init_params(CFG, 1)
RECIPE = ("toy", "tiny", 1)
KW = dict(num_blocks=32, block_size=4)
BUS = dict(kappa_dd=2.0, kappa_dp=1.5, pipe_bytes_per_s=1e7, shm_bytes_per_s=4e7)   # 测试用的系数：手算好算
A = [3, 14, 15, 9, 2, 6, 5]
B = [27, 18, 28, 18, 28, 4, 59, 0, 45]


def alone_dts(prompt, n):
    """一个请求单独在引擎里（模型时钟）每一步的 dt：[prefill, decode 1, decode 2, …]。"""
    eng = LLMEngine(PARAMS, CFG, **KW)
    eng.add_request(prompt, n)
    while eng.has_unfinished_requests():
        eng.step()
    return [s["dt"] for s in eng.steps]


# 两个 worker 在收集时就 spawn（proc_util.early：后台）：轮到这个模块时早已装好
_WORKERS = [spawn_worker(RECIPE, **KW) for _ in range(2)]
early(__name__, [w.proc for w in _WORKERS])


@pytest.fixture(scope="module", autouse=True)
def spawned(request):
    """收集时起的两个 worker：这次选中的测试有用它们的 -> 它们（模块结束时关掉）；没有：当场关掉 -> []。"""
    used = any("pair" in it.fixturenames for it in request.session.items if it.module is request.module)
    ws = _WORKERS if used else []
    if not used:
        for w in _WORKERS:
            w.close()
    yield ws
    for w in ws:
        w.close()
    assert not any(w.proc.is_alive() for w in _WORKERS), "没有留下子进程"


@pytest.fixture(scope="module")
def pair(spawned):
    foreground(w.proc.pid for w in spawned)
    return wait_all(spawned)


def test_bus_finish_by_hand():
    kdd, kdp = 1.25, 1.5
    assert bus_finish(1.0, 2.0, "prefill", [(0.0, math.inf, "decode")], kdd, kdp) == 3.0     # prefill 不放慢
    assert bus_finish(1.0, 2.0, "decode", [], kdd, kdp) == 3.0
    assert bus_finish(1.0, 2.0, "decode", [(0.0, math.inf, "decode")], kdd, kdp) == pytest.approx(1.0 + 2.0 * 1.25)
    # 旁边 prefill 到 2：[1, 2) 做 1 / 1.5 的活，剩 1 − 2/3，2 之后不慢
    assert bus_finish(1.0, 1.0, "decode", [(0.0, 2.0, "prefill")], kdd, kdp) == pytest.approx(2.0 + 1.0 / 3.0)
    # 旁边的区间在这一步开始之前就结束了：不慢
    assert bus_finish(2.0, 1.0, "decode", [(0.0, 2.0, "decode")], kdd, kdp) == 3.0
    # 两个区间：decode [0, 3)、prefill [2, 4)，κ_dd = 2：[1,2) 做 0.5，[2,3) 取大的 2 做 0.5，[3,4) 做 2/3，剩 4/3
    assert bus_finish(1.0, 3.0, "decode", [(0.0, 3.0, "decode"), (2.0, 4.0, "prefill")], 2.0, 1.5) == \
        pytest.approx(4.0 + 3.0 - 0.5 - 0.5 - 1.0 / 1.5)
    with pytest.raises(ValueError, match="kind"):
        bus_finish(0.0, 1.0, "mixed", [], kdd, kdp)


def test_transfer_time_and_the_stored_constants():
    assert transfer_time(3_000_000, 1.5e9) == pytest.approx(2e-3)
    with pytest.raises(ValueError):
        transfer_time(10, 0.0)
    with open(os.path.join(os.path.dirname(__file__), "..", "lecture05", "cpu_calibration.json"), encoding="utf-8") as f:
        c = json.load(f)["sections"]["disaggregation"]["constants"]
    b = load_bus()
    assert (b["kappa_dd"], b["kappa_dp"], b["pipe_bytes_per_s"]) == (c["kappa_dd"], c["kappa_dp"], c["pipe_bytes_per_s"])
    clk = LockstepClock(3, BUS)
    clk.t = [0.5, 0.25, 0.25]
    assert clk.pick([0, 1, 2]) == 1 and clk.pick([0]) == 0 and clk.pick([]) is None
    assert clk.transfer(2e6, "pipe") == pytest.approx(0.2) and clk.transfer(2e6, "shm") == pytest.approx(0.05)


def test_two_replicas_decoding_side_by_side_each_step_times_kappa_dd(pair):
    dts = alone_dts(A, 4)
    for w in pair:
        w.call("reset")
    r = Router(pair, "round_robin", clock="model", bus=BUS)
    ids = [r.add_request(A, 4, arrival=0.0), r.add_request(A, 4, arrival=0.0)]
    while r.has_unfinished_requests():
        r.step()
    want = [dts[0]]
    for d in dts[1:]:
        want.append(want[-1] + BUS["kappa_dd"] * d)                # 另一个副本同时在 decode：每步慢 κ_dd 倍
    for g in ids:
        assert r.token_times[g] == pytest.approx(want, rel=1e-12)
        assert r.arrival[g] == 0.0


def test_pd_handoff_arrives_after_the_transfer_and_a_prefill_beside_slows_the_decode(pair):
    da, db = alone_dts(A, 3), alone_dts(B, 2)
    for w in pair:
        w.call("reset")
    per_tok = 2 * CFG.n_layers * CFG.n_kv_heads * CFG.head_dim * 8
    xfer = per_tok * len(A) / BUS["pipe_bytes_per_s"]
    r = PDRouter(pair[:1], pair[1:], via="pipe", clock="model", bus=BUS)
    ga = r.add_request(A, 3, arrival=0.0)
    gb = r.add_request(B, 2, arrival=da[0])                         # B 到的时候 A 的 prefill 刚结束
    while r.has_unfinished_requests():
        r.step()
    h = da[0] + xfer                                                 # A 的交接到达 decode：第一个 token 的时刻
    e = da[0] + db[0]                                                # B 的 prefill [da0, e)
    assert h < e and (e - h) / BUS["kappa_dp"] < da[1], "这个场景要部分重叠"
    a2 = e + (da[1] - (e - h) / BUS["kappa_dp"])                     # 重叠段慢 κ_dp，之后不慢
    assert r.transfer_s[ga] == pytest.approx(xfer, rel=1e-12)
    assert r.token_times[ga][0] == pytest.approx(h, rel=1e-12)
    assert r.token_times[ga][1] == pytest.approx(a2, rel=1e-12)
    hb = e + per_tok * len(B) / BUS["pipe_bytes_per_s"]
    assert r.token_times[gb][0] == pytest.approx(hb, rel=1e-12)
    # B 到 decode 时 A 的第 2 步已开始：decode worker 一次 decode 两个（批的 dt 不再是单独的），这里只核对次序
    assert r.token_times[ga][2] > a2 and r.token_times[gb][1] > hb


def test_arrival_is_refused_on_the_wall_clock_and_clock_must_be_known(pair):
    with pytest.raises(ValueError, match="arrival"):
        Router(pair, "round_robin").add_request(A, 2, arrival=1.0)
    with pytest.raises(ValueError, match="clock"):
        Router(pair, "round_robin", clock="sundial")
    assert np.isfinite(LockstepClock(2).kappa_dd)


@pytest.mark.parametrize("via", ["pipe", "shm"])
def test_abort_before_arrival_and_while_the_handoff_is_on_the_wire_leaves_nothing(pair, via):
    """模型时钟：还没到的请求、交接还在链路上的请求被中止：报告 "abort"，两边不漏块，没有共享内存段留下。"""
    import os as _os
    before = {f for f in _os.listdir("/dev/shm") if f.startswith("psm_")}
    for w in pair:
        w.call("reset")
    slow = dict(BUS, pipe_bytes_per_s=1.0, shm_bytes_per_s=1.0)      # 交接在路上很久
    r = PDRouter(pair[:1], pair[1:], via=via, clock="model", bus=slow)
    ga, gb = r.add_request(A, 3, arrival=0.0), r.add_request(B, 3, arrival=5.0)
    while not r._wire:
        r.step()
    r.abort_request(ga)
    r.abort_request(gb)
    while r.has_unfinished_requests():
        r.step()
    assert r.finished[ga] == "abort" and r.finished[gb] == "abort" and r.n_handoffs == 0
    for w in pair:
        info = w.call("info")
        assert info["num_free_blocks"] == info["num_blocks"]
    assert {f for f in _os.listdir("/dev/shm") if f.startswith("psm_")} == before


def test_bench_engine_calibrate_disaggregation_takes_medians_and_writes_only_its_section(tmp_path, monkeypatch, capsys):
    """bench_engine --calibrate 的解耦一节：每个量取 3 次的中位数，--write 只换 "disaggregation"，别的节原样（量的函数换成假的）。"""
    import sys as _sys
    _sys.path.insert(0, os.path.dirname(__file__))
    import bench_engine
    import hub_lab
    import worker_lab
    buses = iter([{"decode_alone_s": 0.02, "kappa_dd": 1.5, "kappa_dp": 1.1},
                  {"decode_alone_s": 0.04, "kappa_dd": 1.2, "kappa_dp": 1.3},
                  {"decode_alone_s": 0.03, "kappa_dd": 1.3, "kappa_dp": 1.0}])
    links = iter([1e9, 2e9, 9e9, 3e9, 5e9, 4e9])                    # 管道、共享内存交替
    monkeypatch.setattr(worker_lab, "measure_bus", lambda recipe: next(buses))
    monkeypatch.setattr(worker_lab, "measure_link", lambda via: next(links))
    monkeypatch.setattr(hub_lab, "gguf_path", lambda: "model.gguf")
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"schema": 1, "sections": {"engine_step": {"constants": {"x": 1}}}}), encoding="utf-8")
    monkeypatch.setattr(bench_engine, "CALIBRATION_PATH", str(path))
    sec = bench_engine.calibrate_disaggregation(True)
    c = sec["constants"]
    assert (c["decode_alone_s"], c["kappa_dd"], c["kappa_dp"]) == (0.03, 1.3, 1.1)
    assert (c["pipe_bytes_per_s"], c["shm_bytes_per_s"]) == (5e9, 3e9)       # 中位数：管道 1、9、5；共享内存 2、3、4
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["sections"]["engine_step"] == {"constants": {"x": 1}}
    assert load_bus(str(path))["kappa_dd"] == 1.3
    assert "κ_dd = 1.500" in capsys.readouterr().out
