"""
split_clock_lab —— 拆开的投机解码一轮的账：链路上每轮的有效载荷（三种协议）、一轮的模型时间（同一个设备 / 拆开、
重叠与否）、目标验证 n 个位置的时间（量出来的表，存在 cpu_calibration.json 的 "heterogeneous" 一节）。

协议和重叠的规则见 split_worker_lab；链路的单程时间见 link_lab.one_way_s。p = 目标、q = 草稿，同 decode_lab 的约定。
"""
import os
import sys
import time

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from link_lab import COUNT_BYTES, ID_BYTES, RNG_STATE_BYTES  # noqa: E402

__all__ = ["PROTOCOLS", "round_payload_bytes", "modelled_round_s", "measure_verify_ms", "modelled_verify_s"]

PROTOCOLS = ("point_mass", "lazy_q", "full_q")


def round_payload_bytes(protocol, gamma, vocab, itemsize=8, *, rejected, overlap=False):
    """
    一轮在链路上的有效载荷 -> (草稿 → 目标, 目标 → 草稿) 字节（SplitPair 的 payload_* 逐轮加起来就是它，测试断言；
    只差一处：请求的最后一轮若是 lazy_q 的拒绝，它的修正 token 不再过去，少 4 字节）。

    【推导】token id 4 字节、接受的个数 4 字节、q 每个数 itemsize 字节（split_worker_lab 送 float64 = 8；4 是按 float32
    送的变体）、p_n 每个数 8 字节（float64：
    草稿那边算残差要用目标验证时用的那个 p）、PCG64 的状态 32 字节：
    - point_mass：γ 个 id 过去；个数 + 1 个 token 回来（重叠、全部接受时回来的 token 是 −1 占位，一样 4 字节）；
    - full_q：γ 个 id + γ·V 个 q（+ 状态）过去；个数 + token（+ 状态）回来；
    - lazy_q：γ 个 id + γ 个 q_i(x_i)（+ 状态）过去；全部接受时个数 + token（+ 状态）回来；拒绝时个数 + V 个 p_n + 状态
      回来，修正 token（重叠时再加目标那条流的状态）搭下一轮过去，算在这一轮里。
    overlap=False 时状态每条消息都带（一个发生器来回走）；overlap=True 时两条流各在各的一边，只有 lazy_q 的拒绝让目标的
    流过来、再回去。
    【边界】protocol 不认识、γ、V 或 itemsize 不是正整数：ValueError。
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol 只能是 {PROTOCOLS} 之一（收到 {protocol!r}）")
    for name, v in (("gamma", gamma), ("vocab", vocab), ("itemsize", itemsize)):
        if not (isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1):
            raise ValueError(f"{name} 必须是 ≥ 1 的整数（收到 {v!r}）")
    if protocol == "point_mass":
        return gamma * ID_BYTES, COUNT_BYTES + ID_BYTES
    st = 0 if overlap else RNG_STATE_BYTES
    if protocol == "full_q":
        return gamma * ID_BYTES + gamma * vocab * itemsize + st, COUNT_BYTES + ID_BYTES + st
    if not rejected:
        return gamma * (ID_BYTES + itemsize) + st, COUNT_BYTES + ID_BYTES + st
    return (gamma * (ID_BYTES + itemsize) + st + ID_BYTES + (RNG_STATE_BYTES if overlap else 0),
            COUNT_BYTES + vocab * 8 + RNG_STATE_BYTES)


def modelled_round_s(gamma, t_draft_s, t_verify_s, *, split, overlap=False, to_target_s=0.0, to_draft_s=0.0,
                     all_accepted=False):
    """
    一轮的模型时间（秒）。t_draft_s：草稿一个 token；t_verify_s：目标一次前向验证 γ + 1 个位置；to_target_s、to_draft_s：
    两个方向各一程（one_way_s）。

    【推导】
    - 同一个设备上（split=False）：两个模型轮流用它，γ·t_d + t_v（没有链路）；
    - 拆开、不重叠：γ·t_d + 过去 + t_v + 回来（种子 05 的 round_time 的形状，链路的两程用量到的）；
    - 拆开、重叠：草稿发出第 r 轮之后马上预先草稿 γ 个，和"过去 + t_v + 回来"同时进行：一轮 = max(γ·t_d, 过去 + t_v + 回来)；
      有拒绝时预先草稿的作废，再草稿 γ 个：再加 γ·t_d（全部接受时 all_accepted=True，不加）。
    【边界】split=False 时不能重叠（同一个设备一次只做一件事）：ValueError；γ < 1：ValueError。
    """
    if not (isinstance(gamma, (int, np.integer)) and not isinstance(gamma, bool) and gamma >= 1):
        raise ValueError(f"γ 必须是 ≥ 1 的整数（收到 {gamma!r}）")
    if not split:
        if overlap:
            raise ValueError("同一个设备上（split=False）两个模型轮流用它，不能重叠（overlap=True 只对拆开的有意义）")
        return gamma * t_draft_s + t_verify_s
    link = to_target_s + t_verify_s + to_draft_s
    if not overlap:
        return gamma * t_draft_s + link
    return max(gamma * t_draft_s, link) + (0.0 if all_accepted else gamma * t_draft_s)


def measure_verify_ms(target_recipe="split:0", max_positions=9, context=64, repeats=5):
    """
    目标一次前向喂 n 个新位置（投机解码的验证：γ + 1 个）要多久 -> {"verify_ms": [n = 1..max_positions 各自的中位数毫秒], …}。

    【为什么是一张表，不是一条直线】numpy 的矩阵乘 M = 1 行走 GEMV（从内存流一遍权重），M ≥ 2 行走 GEMM（先打包权重）：
    在这台机器上 n = 2 的一次前向比 n = 1 贵好几倍，之后才大致随 n 慢慢涨——所以按 n 查表（modelled_verify_s）。
    【做法】一个会话先喂 context 个 token；然后每个 n：喂 n 个、计时、truncate 回去；n 轮流量，每个 n 量 repeats 次取中位数。
    在调用它的进程的 BLAS 线程数下量（tests/bench_engine.py 和 worker 都是 1 个）。
    【边界】max_positions、context、repeats < 1，上下文装不下：ValueError。
    """
    from split_models_lab import build_split_model
    for name, v in (("max_positions", max_positions), ("context", context), ("repeats", repeats)):
        if not (isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1):
            raise ValueError(f"{name} 必须是 ≥ 1 的整数（收到 {v!r}）")
    model = build_split_model(target_recipe)
    V, cap = model.cfg.vocab, model.cfg.max_seq
    if context + max_positions > cap:
        raise ValueError(f"context + max_positions = {context + max_positions} 超过模型的上下文 max_seq = {cap}")
    sess = model.session()
    seq = [i % V for i in range(context)]
    sess.logits(seq)
    extra = [(7 * i + 1) % V for i in range(max_positions)]
    ts = [[] for _ in range(max_positions)]
    for _ in range(repeats):
        for n in range(1, max_positions + 1):
            t0 = time.perf_counter()
            sess.logits(seq + extra[:n])
            ts[n - 1].append(time.perf_counter() - t0)
            sess.truncate(context)
    return {"verify_ms": [float(np.median(t)) * 1e3 for t in ts], "target_recipe": target_recipe,
            "context": int(context), "repeats": int(repeats)}


def modelled_verify_s(n_positions, constants):
    """
    目标一次前向验证 n 个位置的模型时间（秒）= 标定表 constants["verify_ms"] 的第 n 个 / 1000（measure_verify_ms 量的）。
    【边界】n 不是 ≥ 1 的整数、超出表（γ + 1 > 表长）：ValueError。
    """
    table = constants["verify_ms"]
    if not (isinstance(n_positions, (int, np.integer)) and not isinstance(n_positions, bool)
            and 1 <= n_positions <= len(table)):
        raise ValueError(f"位置数必须是 1..{len(table)} 的整数（标定表只量到这里；收到 {n_positions!r}）")
    return table[n_positions - 1] / 1e3
