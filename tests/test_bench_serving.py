"""
lecture05/bench_serving.py（压测工具）：对着一个延迟已知的桩服务器、用一个假时钟量（不是计时的测试：没有一个数取决于
这台机器多快）。桩服务器每写一行 data: 之前把假时钟拨快这一行的延迟，并等客户端读过一次时钟（客户端每收到一行读一次）
才写下一行：所以客户端量到的 TTFT、ITL、TPOT、端到端正好是桩给的延迟，分位数正好是手算的线性插值。
"""
import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from conftest import load_script
from workload_lab import poisson_arrivals

bench = load_script("lecture05/bench_serving.py")


class LockstepClock:
    """假时钟：clock() 读数（并记下读了几次），sleep(dt) 直接拨快；桩服务器用 advance_after_read 和客户端一步一步走。"""

    def __init__(self):
        self.t, self.reads, self.cv = 0.0, 0, threading.Condition()

    def __call__(self):
        with self.cv:
            self.reads += 1
            self.cv.notify_all()
            return self.t

    def sleep(self, dt):
        with self.cv:
            self.t += max(dt, 0.0)

    def advance_after_read(self, since, dt):
        """等到读数次数 > since（客户端读过了上一行），再拨快 dt -> 现在的读数次数。"""
        with self.cv:
            assert self.cv.wait_for(lambda: self.reads > since, timeout=10), "客户端没有读时钟"
            self.t += dt
            return self.reads


# 桩的剧本：每个请求（按 max_tokens 认）→ (TTFT, [之后每个 token 的间隔])；每行一个 token，最后报 usage
SCRIPT = {3: (0.5, [0.1, 0.1, 0.2]), 4: (1.0, [0.05, 0.05, 0.05, 0.05]), 5: (2.0, [0.3, 0.3, 0.3, 0.3, 0.3])}


def stub_server(clock, script=SCRIPT):
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            data = json.dumps({"data": [{"id": "stub"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            assert body["stream"] and body["stream_options"] == {"include_usage": True} and body["ignore_eos"]
            ttft, gaps = script[body["max_tokens"]]
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            seen = clock.reads - 1                      # 客户端发出前读过一次
            lines = [({"choices": [{"index": 0, "text": f"t{k}", "finish_reason": None}]}, d)
                     for k, d in enumerate([ttft] + gaps)]
            lines.append(({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}, 0.0))
            lines.append(({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": len(gaps) + 1}}, 0.0))
            for obj, d in lines:
                seen = clock.advance_after_read(seen, d)
                self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
            clock.advance_after_read(seen, 0.0)
            self.wfile.write(b"data: [DONE]\n\n")

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    httpd.daemon_threads = True
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    return httpd, t


@pytest.fixture
def stub():
    clock = LockstepClock()
    httpd, t = stub_server(clock)
    yield clock, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    t.join(5)


REQS = [{"prompt": "a", "max_tokens": m} for m in (3, 4, 5)]


def test_measured_latencies_equal_the_delays_the_stub_served(stub):
    clock, url = stub
    res = bench.run_benchmark(url, REQS, math.inf, model="stub", max_concurrency=1, clock=clock, sleep=clock.sleep,
                              timeout=20)
    recs = res["records"]
    assert all(r["error"] is None for r in recs)
    ms = [bench.request_metrics(r) for r in recs]
    # 手算：TTFT 是第一个间隔；TPOT = 后面的间隔之和 / (token 数 − 1)；端到端 = 所有间隔之和（后面几行没有延迟）
    assert [m[0] for m in ms] == [0.5, 1.0, 2.0]
    assert [m[1] for m in ms] == pytest.approx([0.4 / 3, 0.2 / 4, 1.5 / 5], abs=1e-12)
    assert [m[2] for m in ms] == pytest.approx([0.9, 1.2, 3.5], abs=1e-12)
    assert [m[3] for m in ms] == [pytest.approx(g, abs=1e-12) for g in ([0.1, 0.1, 0.2], [0.05] * 4, [0.3] * 5)]
    assert [r["n_out"] for r in recs] == [4, 5, 6] and [r["prompt_tokens"] for r in recs] == [7, 7, 7]
    # 一次一个（max_concurrency=1）、一起到达：一个接一个，整个压测 = 三个端到端之和
    assert res["duration"] == pytest.approx(0.9 + 1.2 + 3.5, abs=1e-12)


def test_percentiles_throughputs_and_attainment_by_hand(stub):
    clock, url = stub
    res = bench.run_benchmark(url, REQS, math.inf, model="stub", max_concurrency=1, clock=clock, sleep=clock.sleep,
                              timeout=20)
    s = bench.summarize(res, ttft_slo=1.0, tpot_slo=0.2)
    # 线性插值：排好序的 x，位置 q·(n − 1)
    assert s["ttft"]["p50"] == pytest.approx(1.0) and s["ttft"]["p90"] == pytest.approx(1.0 + 0.8 * 1.0)
    assert s["ttft"]["p99"] == pytest.approx(1.0 + 0.98 * 1.0) and s["ttft"]["mean"] == pytest.approx(3.5 / 3)
    itl = sorted([0.1, 0.1, 0.2] + [0.05] * 4 + [0.3] * 5)           # 12 个间隔放在一起
    assert s["itl"]["p50"] == pytest.approx((itl[5] + itl[6]) / 2)
    assert s["itl"]["p90"] == pytest.approx(itl[9] + 0.9 * (itl[10] - itl[9]))
    assert s["e2e"]["p50"] == pytest.approx(1.2)
    dur = 5.6
    assert s["request_throughput"] == pytest.approx(3 / dur) and s["output_throughput"] == pytest.approx(15 / dur)
    assert s["total_throughput"] == pytest.approx((15 + 21) / dur)
    # 达标：TTFT ≤ 1 且 TPOT ≤ 0.2：第 1 个（0.5, 0.133）和第 2 个（1.0, 0.05）；第 3 个 TTFT 2.0 不达标
    assert s["attainment"] == pytest.approx(2 / 3) and s["good_throughput"] == pytest.approx(2 / dur)


def test_poisson_dispatch_starts_each_request_at_its_arrival():
    """桩不加延迟时，一次一个的请求也各自在泊松到达的时刻发出（假的 sleep 拨到那一刻）。"""
    clock = LockstepClock()
    httpd, t = stub_server(clock, {3: (0.0, [0.0, 0.0])})
    try:
        reqs = [{"prompt": "a", "max_tokens": 3}] * 5
        res = bench.run_benchmark(f"http://127.0.0.1:{httpd.server_address[1]}", reqs, 2.0, model="stub", seed=7,
                                  max_concurrency=1, clock=clock, sleep=clock.sleep, timeout=20)
    finally:
        httpd.shutdown()
        httpd.server_close()
        t.join(5)
    want = poisson_arrivals(2.0, 5, 7)
    assert [r["start"] for r in res["records"]] == pytest.approx(list(want), abs=1e-12)
    assert [r["arrival"] for r in res["records"]] == list(want)


def test_failed_requests_count_against_attainment():
    recs = [{"start": 0.0, "stamps": [0.1, 0.2], "end": 0.2, "n_out": 2, "prompt_tokens": 1, "error": None},
            {"start": 0.0, "stamps": [], "end": 0.1, "n_out": 0, "prompt_tokens": None, "error": "HTTP 503: busy"}]
    s = bench.summarize({"records": recs, "duration": 1.0, "rate": 1.0}, 1.0, 1.0)
    assert s["completed"] == 1 and s["failed"] == 1 and s["attainment"] == 0.5


def test_goodput_is_the_highest_tested_rate_meeting_the_goal():
    sums = [{"rate": r, "attainment": a} for r, a in ((0.5, 1.0), (1.0, 0.95), (2.0, 0.6), (4.0, 0.1))]
    assert bench.goodput_over(sums, 0.9)["goodput"] == 1.0
    assert bench.goodput_over(sums, 0.99)["goodput"] == 0.5


def test_requests_are_seeded_and_lengths_in_range():
    a = bench.make_requests(30, (5, 9), (2, 4), seed=3)
    assert a == bench.make_requests(30, (5, 9), (2, 4), seed=3)
    assert a != bench.make_requests(30, (5, 9), (2, 4), seed=4)
    assert all(len(r["prompt"].split()) == r["input_words"] and 5 <= r["input_words"] < 9 for r in a)
    assert {r["max_tokens"] for r in a} == {2, 3}
    with pytest.raises(ValueError, match="input_range"):
        bench.make_requests(3, (5, 5), (2, 4))
    with pytest.raises(ValueError, match="base_url"):
        bench.run_benchmark("localhost:8000", a, 1.0, model="x")
    with pytest.raises(ValueError, match="到达率"):
        bench.run_benchmark("http://127.0.0.1:1", a, 0.0, model="x")


def test_against_the_real_server_over_http_with_the_wall_clock():
    """真的服务器（小模型）、真的时钟、并发：每个请求都完成，输出 token 数 = max_tokens（ignore_eos），文字 == 服务器的。"""
    serve = load_script("lecture05/serve.py")
    from test_serve import start
    h = start()
    try:
        reqs = bench.make_requests(6, (2, 6), (3, 8), seed=1)
        res = bench.run_benchmark(h.url, reqs, 50.0, timeout=20)
    finally:
        h.close()
    assert serve.MAX_QUEUE >= 6
    assert all(r["error"] is None for r in res["records"])
    assert [r["n_out"] for r in res["records"]] == [q["max_tokens"] for q in reqs]
    s = bench.summarize(res, 10.0, 10.0)
    assert s["completed"] == 6 and np.isfinite(s["ttft"]["p99"])
