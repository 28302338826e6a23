"""
greedy_lab —— T = 0 的投机解码不用跑循环：从"目标的贪心文本上、草稿逐位置猜对了没有"精确地数出每一轮（链、树、prompt lookup）。

【为什么精确】T = 0 时目标每一步取 argmax，投机解码的输出就是目标的贪心序列（decode_lab.speculative_generate 的
【边界】，测试断言）。一轮从文本的第 t 个新 token 开始：草稿的第 i 个猜测以它自己前面的猜测为上下文；只要前面的都
猜对了，这个上下文就是贪心文本本身的前缀，所以"第 i 个猜对了没有"就是在贪心文本上 teacher forcing 得到的
agree[t + i]（草稿的 argmax == 文本的 token）。第一次猜错，这一轮就结束（目标给出修正 token = 贪心 token）；
都猜对了，目标再给一个额外的 token。所以每轮接受的个数 = 从 t 开始连续猜对的个数（最多 γ），下一轮从 t + 接受 + 1
开始——整段文本的轮数、每轮 token、每轮从哪里开始都由 agree 这一个 0/1 序列决定，没有抽样误差。
草稿和目标各前向一次（整段文本），就代替了一次完整的投机解码循环。
【文本的末尾】文本有 n 个新 token（截到 n_new 或停止 token）：最后一轮只能看到文本里还剩的位置；它接受的个数可能
比真实循环少（循环会接着猜文本之外的 token，再截掉）。轮数不受影响。complete 标出"γ + 1 个位置都在文本里"的轮，
算每轮 token 的平均时只用这些轮（和式 (1) 比：式 (1) 是一整轮的期望）。
【同一讲】decode_lab（生成器；测试用真实循环核对这里的每一轮）、lookup_lab（PromptLookup、自适应 γ 的规则）、
correlated_lab（β 的相邻相关、每轮起点）、tree_lab（i.i.d. 候选的树，T = 1 的 SpecInfer 规则）。
"""
import numpy as np

__all__ = ["token_ranks", "greedy_rounds", "lookup_rounds", "tree_rounds", "tree_size", "round_summary"]


def _check_gamma(gamma, gamma_max):
    for name, g in (("gamma", gamma), ("gamma_max", gamma if gamma_max is None else gamma_max)):
        if not (isinstance(g, (int, np.integer)) and not isinstance(g, bool) and g >= 1):
            raise ValueError(f"{name} 必须是 ≥ 1 的整数（收到 {g!r}）")
    if gamma_max is not None and gamma_max < gamma:
        raise ValueError(f"gamma_max = {gamma_max} 不能小于起始的 γ = {gamma}")


def token_ranks(logits, tokens):  # [n, V], [n] -> [n]
    """
    每个位置上，文本里真正的下一个 token 在草稿的 logits 里排第几 -> int 数组（0 = 草稿的 argmax）。

    【推导】排名 = 比它大的 logits 个数 + 和它相等、下标比它小的个数：和 decode_lab.adjust（T = 0 取下标最小的 argmax）
    的并列规则一致，所以 rank == 0 正好是"草稿的贪心猜测 == 文本的 token"。top-k 树用 rank < k。
    """
    logits = np.asarray(logits)
    tokens = np.asarray(tokens, dtype=np.int64)
    if logits.ndim != 2 or tokens.shape != (logits.shape[0],):
        raise ValueError(f"logits 必须是 [n, V]、tokens 必须是 [n]（收到 {logits.shape} 和 {tokens.shape}）")
    own = logits[np.arange(tokens.size), tokens][:, None]
    idx = np.arange(logits.shape[1])[None, :]
    return ((logits > own) | ((logits == own) & (idx < tokens[:, None]))).sum(1)


def _rounds(n, step, gamma, gamma_max):
    """
    通用的贪心轮次模拟：step(t, g) -> (草稿个数 k, 接受个数 r)；一轮从 t 开始，下一轮从 t + r + 1 开始，直到覆盖 n 个 token。
    γ 的规则同 lookup_lab.speculative_generate_adaptive（gamma_max 为 None：固定；否则全接受 +2、有拒绝 −1、没草稿不变）。
    """
    _check_gamma(gamma, gamma_max)
    if not (isinstance(n, (int, np.integer)) and n >= 1):
        raise ValueError(f"文本至少要有 1 个新 token（收到 n = {n!r}）")
    starts, accepted, drafted, gammas = [], [], [], []
    t, g = 0, int(gamma)
    while t < n:
        k, r = step(t, g)
        starts.append(t)
        accepted.append(r)
        drafted.append(k)
        gammas.append(g)
        t += r + 1
        if gamma_max is not None and k > 0:
            g = min(g + 2, gamma_max) if r == k else max(g - 1, 1)
    starts = np.asarray(starts, dtype=np.int64)
    return {"starts": starts, "accepted": np.asarray(accepted, dtype=np.int64),
            "drafted": np.asarray(drafted, dtype=np.int64), "gammas": np.asarray(gammas, dtype=np.int64),
            "complete": starts + np.asarray(gammas) < n, "calls": len(starts), "n": int(n)}


def greedy_rounds(agree, gamma, gamma_max=None):  # [n] 0/1 -> dict
    """
    模型草稿在 T = 0 的每一轮 -> dict：starts（每轮第一个要猜的 token 在新 token 里的下标）、accepted、drafted、gammas、
    complete（γ + 1 个位置都在文本里的轮）、calls（轮数 = 目标的前向次数）、n。

    【推导】见模块说明：从 t 开始连续猜对的个数 r（最多 γ），下一轮从 t + r + 1 开始。
    【参数】agree[t]：在贪心文本上 teacher forcing，草稿在第 t 个新 token 处的 argmax == 文本的 token（token_ranks == 0）；
    gamma_max：给了就用自适应 γ（lookup_lab 的规则，从 gamma 开始）。
    【边界】空的 agree、γ < 1：ValueError。
    """
    agree = np.asarray(agree, dtype=bool)
    n = agree.size

    def step(t, g):
        window = agree[t:t + g]
        miss = np.flatnonzero(~window)
        return g, int(miss[0]) if miss.size else int(window.size)

    return _rounds(n, step, gamma, gamma_max)


def lookup_rounds(prompt, text, lookup, gamma, gamma_max=None):
    """
    prompt lookup 在 T = 0 的每一轮（不用模型）-> dict，字段同 greedy_rounds。

    【推导】一轮从 t 开始：草稿 = lookup.propose(提示 + text[:t], γ)（确定的，最多 γ 个，找不到时 0 个）；
    接受个数 = 草稿和 text[t:] 从头开始相同的个数（T = 0 时目标接受草稿 ⇔ 它等于贪心 token）。
    lookup 一轮的几个草稿是同一处匹配后面的一段，不是逐位置各查一次，所以不能用 agree 数列，要逐轮模拟。
    【参数】lookup：lookup_lab.PromptLookup（或任何有 propose(seq, k) 的对象）；text：目标的贪心新 token。
    """
    prompt = [int(x) for x in prompt]
    text = [int(x) for x in text]

    def step(t, g):
        prop = lookup.propose(prompt + text[:t], g)
        r = 0
        while r < len(prop) and t + r < len(text) and prop[r] == text[t + r]:
            r += 1
        return len(prop), r

    return _rounds(len(text), step, gamma, gamma_max)


def tree_size(widths):
    """
    一棵"每层宽度"为 widths = (k₁, k₂, …, k_d) 的满树有几个节点 -> int：Σ_i k₁·k₂·…·k_i（目标一次前向要打分的草稿位置）。

    【形状】第 1 层是草稿在根处的 top-k₁ 个不同的 token；第 i 层的每个节点下面挂草稿在那个节点处的 top-k_i
    （Medusa / EAGLE 那样按草稿的排名取不同的候选，不是 tree_lab 那样 i.i.d. 地抽）。全是 1 就是长 d 的链。
    【边界】空的 widths、宽度 < 1：ValueError。
    """
    widths = [int(k) for k in widths]
    if not widths or min(widths) < 1:
        raise ValueError(f"每层的宽度必须是 ≥ 1 的整数，至少一层（收到 {widths}）")
    total, level = 0, 1
    for k in widths:
        level *= k
        total += level
    return total


def tree_rounds(ranks, widths):  # [n] -> dict
    """
    top-k 树在 T = 0 的每一轮 -> dict，字段同 greedy_rounds（drafted = 树的深度 d）。

    【推导】T = 0 时被接受的路径只能是贪心路径：树里和贪心路径不同的节点一个也不会被接受，它们的孩子也就无关紧要。
    贪心路径上深度 i 的节点的上下文就是贪心文本的前缀，所以"第 i + 1 层接得上"⇔ 文本在 t + i 的 token 排在草稿的前
    k_{i+1} 名（teacher forcing 的 ranks[t + i] < k_{i+1}）。一轮接受的个数 = 连续接得上的层数（最多 d），再加目标给的 1 个。
    widths 全是 1 时就是 greedy_rounds(ranks == 0, d)（测试断言）。
    """
    ranks = np.asarray(ranks, dtype=np.int64)
    widths = [int(k) for k in widths]
    tree_size(widths)
    d = len(widths)
    n = ranks.size

    def step(t, g):
        r = 0
        while r < d and t + r < n and ranks[t + r] < widths[r]:
            r += 1
        return d, r

    return _rounds(n, step, d, None)


def round_summary(rounds_list):
    """
    几段文本的轮次合在一起 -> dict：calls（总轮数）、tokens（总 token 数）、per_call（只用完整的轮：平均每轮 token）、
    n_complete（完整的轮数）、overall（总 token / 总轮数，含末尾被截短的轮）。

    【边界】没有完整的轮时 per_call 是 nan。
    """
    calls = sum(r["calls"] for r in rounds_list)
    tokens = sum(r["n"] for r in rounds_list)
    full = np.concatenate([r["accepted"][r["complete"]] + 1 for r in rounds_list])
    return {"calls": calls, "tokens": tokens, "overall": tokens / calls, "n_complete": int(full.size),
            "per_call": float(full.mean()) if full.size else float("nan")}
