"""
metrics_lab —— 引擎跑完之后的量：每个请求的 TTFT、TPOT、token 间隔（ITL）、端到端；p50 / p90 / p99；吞吐；
SLO 达标率（goodput_lab 的定义）。

【定义】（vLLM benchmarks/benchmark_serving.py 的口径）TTFT = 第一个 token 的时间 − 到达；
TPOT = (最后一个 token − 第一个 token) / (token 数 − 1)（不含第一个；只有 1 个 token 的请求记 0，同 goodput_lab）；
ITL = 相邻两个 token 的间隔（每个间隔一个样本）；端到端 = 最后一个 token − 到达。
一个 token 的时间 = 抽出它的那一步结束的时刻（引擎的时钟：默认是模型时间）。
分位数用 numpy 的默认（线性插值）。
"""
import numpy as np

from goodput_lab import find_goodput, slo_attainment

__all__ = ["request_metrics", "percentiles", "summarize", "engine_goodput"]

QUANTILES = (50, 90, 99)


def request_metrics(req):
    """一个结束的请求 -> dict ttft、tpot、itl（list）、e2e、n（秒；n = 生成的 token 数）。没有 token 的（中止的）-> None。"""
    t = req.token_times
    if not t:
        return None
    itl = list(np.diff(t))
    return {"ttft": t[0] - req.arrival, "tpot": (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else 0.0,
            "itl": itl, "e2e": t[-1] - req.arrival, "n": len(t)}


def percentiles(values, qs=QUANTILES):
    """values 的 p50 / p90 / p99 -> dict {50: …, 90: …, 99: …}。【边界】没有值：全是 nan。"""
    v = np.asarray(values, dtype=np.float64)
    return {q: float(np.percentile(v, q)) if v.size else float("nan") for q in qs}


def summarize(requests, ttft_slo=None, tpot_slo=None):
    """
    一串结束的请求 -> dict：ttft、tpot、itl、e2e 各自的分位数，output_tokens，makespan（第一个到达到最后一个 token），
    throughput（输出 token / makespan），attainment（给了两个 SLO 时：goodput_lab.slo_attainment）。
    """
    ms = [m for m in (request_metrics(r) for r in requests) if m is not None]
    if not ms:
        raise ValueError("没有生成过 token 的请求：没有东西可以统计")
    out = {k: percentiles([m[k] for m in ms]) for k in ("ttft", "tpot", "e2e")}
    out["itl"] = percentiles([x for m in ms for x in m["itl"]])
    n = sum(m["n"] for m in ms)
    t0 = min(r.arrival for r in requests)
    t1 = max(r.token_times[-1] for r in requests if r.token_times)
    out.update(output_tokens=n, makespan=t1 - t0, throughput=n / (t1 - t0) if t1 > t0 else float("nan"))
    if ttft_slo is not None and tpot_slo is not None:
        out["attainment"] = slo_attainment({"ttft": [m["ttft"] for m in ms], "tpot": [m["tpot"] for m in ms]},
                                           ttft_slo, tpot_slo)
    return out


def engine_goodput(serve_at_rate, rates, ttft_slo, tpot_slo, goal=0.9, n_refine=4):
    """
    引擎的 goodput（DistServe 的定义，goodput_lab.find_goodput）：TTFT ≤ ttft_slo 且 TPOT ≤ tpot_slo 的请求占比
    ≥ goal 的最高到达率 -> find_goodput 的 dict（goodput、upper、tested）。

    【参数】serve_at_rate(rate) -> 跑完的请求的 list（例如按 workload_lab.poisson_arrivals 的到达时刻 run_trace 一个
    重放的引擎）；rates：递增的到达率网格（每秒请求数）。
    """
    return find_goodput(lambda r: summarize(serve_at_rate(r), ttft_slo, tpot_slo)["attainment"], rates,
                        n_refine=n_refine, goal=goal)
