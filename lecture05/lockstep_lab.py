"""
lockstep_lab —— 几个 worker 进程共用的模型时钟：路由器按模型时间"齐步走"地推它们（每次推 now 最小的那个），
一个交接在发的那一边的时刻 + 模型的传输时间（字节 / 存下来的链路速率）到达，两个核共用一条内存总线（κ 两个系数）。

【为什么】默认运行要每次打印一样的字节，又要真的起进程、送字节：真做的事（调度、块、交接的字节）照做，时间一律按模型算。
【一步的时间】worker 的引擎按 runner_lab.modelled_step_time 给出这一步单独跑要多久（dt，标定文件 "engine_step" 一节的常数）；
这里只加上"旁边的 worker 在干什么"：
- 这一步是 decode（没有 prefill 的 token）时，和另一个 worker 忙着的区间重叠的那一段慢 κ 倍：旁边在 decode，κ = κ_dd；
  旁边在 prefill（或一步里有 prefill 的块），κ = κ_dp；几个同时忙取最大的 κ。重叠段里做的活 = 时长 / κ。
- 这一步有 prefill 的 token：不放慢（**假设**：prefill 的块主要是算，worker_lab.measure_bus 只量了 decode 步被放慢多少）。
- 另一个 worker 忙着的区间：它上一步 [开始, 结束)，再加上——它手上还有活时——从结束起一直忙下去、下一步是它报告的那种
  （所以两个一直在 decode 的 worker，每一步都慢 κ_dd 倍，不论谁先走）。
【常数】κ_dd、κ_dp、pipe_bytes_per_s、shm_bytes_per_s：lecture05/cpu_calibration.json 的 "disaggregation" 一节
（worker_lab.measure_bus、measure_link 量的；python3 tests/bench_engine.py --calibrate 重量）。
"""
import math
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from runner_lab import load_calibration  # noqa: E402

__all__ = ["BUS", "load_bus", "transfer_time", "bus_finish", "LockstepClock"]


def load_bus(path=None):
    """标定文件的 "disaggregation" 一节的常数 -> dict（kappa_dd、kappa_dp、pipe_bytes_per_s、shm_bytes_per_s……）。"""
    return dict(load_calibration("disaggregation", path)["constants"])


BUS = load_bus()


def transfer_time(nbytes, bytes_per_s):
    """
    一个交接在链路上的模型时间（秒）= nbytes / bytes_per_s（没有延迟和协议开销，和 iteration_lab.link_time 一样）。
    【边界】bytes_per_s 不是正数、nbytes 是负数：ValueError。
    """
    if not bytes_per_s > 0 or nbytes < 0:
        raise ValueError(f"链路速率要 > 0、字节 ≥ 0（收到 {bytes_per_s!r}、{nbytes!r}）")
    return nbytes / bytes_per_s


def bus_finish(start, dt, kind, others, kappa_dd, kappa_dp):
    """
    一步从 start 开始、单独跑要 dt 秒 -> 它在共享总线上结束的时刻。

    【推导】kind == "decode" 时，把时间轴按 others 的区间端点切段；每段的 κ = 这一段里忙着的 others 的最大系数
    （旁边 decode：κ_dd，旁边 prefill：κ_dp，没人：1）；一段长 L 做 L / κ 的活，做满 dt 为止。kind == "prefill"：start + dt。
    【参数】others：[(开始, 结束, 种类)]，结束可以是 math.inf（那个 worker 一直忙下去）；种类 "decode" / "prefill"。
    【边界】dt = 0：start；kind 不认识：ValueError。
    """
    if kind not in ("decode", "prefill"):
        raise ValueError(f"kind 只能是 'decode' 或 'prefill'，收到 {kind!r}")
    if kind == "prefill" or dt <= 0:
        return start + max(dt, 0.0)
    kap = {"decode": kappa_dd, "prefill": kappa_dp}
    cuts = sorted({t for s, e, _ in others for t in (s, e) if start < t < math.inf})
    t, left = start, dt
    for edge in cuts + [math.inf]:
        k = max([kap[o] for s, e, o in others if s <= t < e] + [1.0])
        if edge == math.inf or (edge - t) / k >= left:
            return t + left * k
        left -= (edge - t) / k
        t = edge
    return t                                              # 走不到这里：最后一段到 inf


class LockstepClock:
    """
    n 个 worker 的模型时间：t[i]（它下一步最早什么时候开始）、last[i]（上一步的 (开始, 结束, 种类)）、nxt[i]（手上还有活时
    下一步的种类，没活时 None）。路由器推 t 最小的那个（并列取编号小的）；bus 为 None 时用标定文件的常数。
    """

    def __init__(self, n, bus=None):
        b = BUS if bus is None else bus
        self.kappa_dd, self.kappa_dp = float(b["kappa_dd"]), float(b["kappa_dp"])
        self.rate = {"pipe": float(b["pipe_bytes_per_s"]), "shm": float(b["shm_bytes_per_s"])}
        self.t, self.last, self.nxt = [0.0] * n, [None] * n, [None] * n

    def pick(self, busy):
        """busy：有活的 worker 的编号 -> t 最小的那个（并列取编号小的）；没有：None。"""
        return min(busy, key=lambda i: (self.t[i], i)) if busy else None

    def wait_until(self, i, t):
        """worker i 拿到一件 t 时刻才到的活：它的时钟跳到 max(t[i], t)。"""
        self.t[i] = max(self.t[i], t)

    def others(self, i):
        """别的 worker 忙着的区间 -> [(开始, 结束, 种类)]（见模块说明）。"""
        out = []
        for j, (lst, nx) in enumerate(zip(self.last, self.nxt)):
            if j == i:
                continue
            if lst is not None:
                out.append(lst)
            if nx is not None:
                out.append((self.t[j], math.inf, nx))
        return out

    def advance(self, i, dt, kind, nxt):
        """worker i 从 t[i] 起跑了一步（单独要 dt 秒，种类 kind），之后手上的活是 nxt -> 这一步结束的时刻。"""
        start = self.t[i]
        end = bus_finish(start, dt, kind, self.others(i), self.kappa_dd, self.kappa_dp)
        self.t[i], self.last[i], self.nxt[i] = end, (start, end, kind), nxt
        return end

    def transfer(self, nbytes, via):
        """via（"pipe" / "shm"）上 nbytes 字节的模型传输时间。"""
        return transfer_time(nbytes, self.rate[via])
