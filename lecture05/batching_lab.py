"""
batching_lab —— 静态批 vs 连续批：slots 个位置的 decode 引擎一次一次迭代地处理一串请求，返回时间、吞吐、TPOT。

【约定】每次迭代的时间是 iteration_lab.iteration_time（roofline 下界）；请求都在 t = 0 到达、提示已经 prefill 好，
只模拟 decode。prefill 和 decode 同机 / 解耦的模拟在 disagg_lab。
"""
from collections import deque

from iteration_lab import iteration_time

__all__ = ["simulate_batching"]


def simulate_batching(model, chip, prompt_len, out_lens, slots, continuous, w_bits=16.0, kv_bits=16.0):
    """
    slots 个位置的 decode 引擎处理一串请求（都在 t = 0 到达、提示已经 prefill 好），返回 dict：
    time（总秒数）、tokens（生成的 token 总数）、steps（迭代次数）、mean_active（平均每步在算的序列数）、
    throughput（tokens / time）、tpot（平均每步时间 = 每个序列的 TPOT，每步算一次）、
    tpot_token（按 token 加权的每步时间：每个生成的 token 记下产出它的那一步的时间，再对所有 token 平均
    = Σ 步时间 × 这步在算的序列数 / tokens）、finish（每个请求最后一个 token 出来的时刻，按请求编号的元组；
    请求都在 t = 0 到达，所以它就是请求的完成时间）。

    【推导】每一步：所有在算的序列各生成一个 token，时间 = iteration_time（上下文 = 提示 + 已生成）。
    continuous=True（连续批）：一个序列生成完，下一步就把队列里的下一个请求放进它的位置。
    continuous=False（静态批）：按顺序 slots 个一组，整组最长的那个生成完才换下一组；
    组里先完成的位置空着（这里假设空位置不计算——对静态批有利的假设）。
    【参数】out_lens：每个请求要生成的 token 数（≥ 1）。
    【边界】没有请求、生成数 < 1、slots < 1 抛 ValueError。每一步至少生成一个 token，所以迭代次数不超过
    Σ out_lens；超过了说明模拟卡住了（代码的错），抛 RuntimeError 而不是一直转下去。
    """
    out_lens = [int(x) for x in out_lens]
    if not out_lens:
        raise ValueError("至少要有一个请求")
    if min(out_lens) < 1 or slots < 1:
        raise ValueError("每个请求至少生成 1 个 token，位置至少 1 个")
    queue = deque(range(len(out_lens)))
    max_steps = sum(out_lens)
    active = {}                                     # 请求编号 -> 已生成的 token 数
    t, tokens, steps, active_sum, token_time = 0.0, 0, 0, 0, 0.0
    finish = [0.0] * len(out_lens)
    while queue or active:
        if continuous or not active:
            while queue and len(active) < slots:
                active[queue.popleft()] = 0
        ctx_sum = sum(prompt_len + g for g in active.values())
        dt = iteration_time(model, chip, len(active), ctx_sum, w_bits=w_bits, kv_bits=kv_bits)
        t += dt
        steps += 1
        if steps > max_steps:
            raise RuntimeError(f"simulate_batching：{steps} 次迭代还没做完（每步至少生成一个 token，"
                               f"最多 Σ 生成数 = {max_steps} 次）：模拟卡住了（这是代码的错，不是参数的错）")
        active_sum += len(active)
        tokens += len(active)
        token_time += dt * len(active)
        for r in list(active):
            active[r] += 1
            if active[r] == out_lens[r]:
                finish[r] = t
                del active[r]
    return {"time": t, "tokens": tokens, "steps": steps, "mean_active": active_sum / steps,
            "throughput": tokens / t, "tpot": t / steps, "tpot_token": token_time / tokens,
            "finish": tuple(finish)}
