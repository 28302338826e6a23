"""
tree_lab —— 树形投机解码：一次目标前向验证一棵草稿树。

SpecInfer（Miao et al. 2024，arXiv 2305.09781）的多步投机采样：一个位置上有 k 个候选（从草稿分布 q 独立同分布地抽），
依次检查；目标模型一次前向用树形注意力（transformer_lab.tree_mask）给整棵草稿树打分，被接受的路径留在 KV cache 里
（KVCache.keep，经会话的 keep）。p = 目标、q = 草稿，同 decode_lab 的约定。
不同的候选（无放回地抽、草稿的前 k 名）的验证规则在 distinct_lab，这里导入 distinct_draft_step_probs、
distinct_draft_verify 两个名字；dynamic_tree_generate 按 EAGLE-2 的规则长一棵动态的树（见它的说明）。
"""
import functools

import numpy as np

from decode_lab import _check_generation, _finish, _stop_set, _stopped, acceptance_beta, adjust, residual_distribution  # noqa: E402
from distinct_lab import (distinct_draft_step_probs, distinct_draft_verify, topk_candidates,  # noqa: E402
                          topk_draft_verify)
from transformer_lab import NumpyTransformer, sample_inverse_cdf, tree_mask  # noqa: E402

__all__ = ["multi_draft_verify", "multi_draft_step_probs", "multi_draft_acceptance", "tree_expected_tokens",
           "tree_parents", "tree_speculative_generate", "distinct_draft_step_probs", "distinct_draft_verify",
           "dynamic_tree_generate", "dynamic_tree_expected", "EAGLE2_TOP_K", "EAGLE2_DEPTH"]


@functools.lru_cache(maxsize=128)
def _tree_mask_of(parents, n_past):
    """tree_mask(parents, n_past)，parents 是元组：同一棵树、同样多的已缓存位置每轮都一样，只算一次（数组只读）。"""
    mask, pos = tree_mask(list(parents), n_past)
    mask.flags.writeable = pos.flags.writeable = False
    return mask, pos


def _tree_mask(parents, n_past):
    return _tree_mask_of(tuple(int(a) for a in parents), int(n_past))


# EAGLE 仓库（SafeAILab/EAGLE，commit cb7e084）的 EaModel.from_pretrained 默认 total_token = 60、depth = 7、top_k = 10；
# cnets.py 的 Model 默认 total_tokens = 63、depth = 5、top_k = 8。这里的默认取 top_k = 10、depth = 6（两者之间），
# 预算（total_token）由调用者给。
EAGLE2_TOP_K, EAGLE2_DEPTH = 10, 6


def _check_k(k):
    if not (isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k >= 1):
        raise ValueError(f"候选个数 k 必须是 ≥ 1 的整数（收到 {k!r}）")


def multi_draft_verify(target_probs, draft_probs, candidates, rng):
    """
    多候选验证（SpecInfer 的多步投机采样）抽一次 -> (i, token)：i = 被接受的候选的下标（0..k−1），全部拒绝时 i = -1。

    【推导】p₁ = p；依次检查候选 x_i（都从 q 抽）：r·q(x_i) < p_i(x_i) 就接受 x_i（概率 min(1, p_i(x_i)/q(x_i))），
    否则 p_{i+1} = norm(max(0, p_i − q))；k 个都被拒绝时从 p_{k+1} 抽。输出的分布正好是 p（multi_draft_step_probs 精确枚举）。
    k = 1 就是普通的一步规则（speculative_generate 里的那一步）。
    【随机数】每检查一个候选用一个均匀数（接受就停）；全部拒绝时再用一个抽残差。
    【边界】candidates 为空抛 ValueError；p_i == q（舍入后）时残差用 p_i（residual_distribution 的兜底），那时不会拒绝。
    """
    _check_k(len(candidates))
    p = np.asarray(target_probs, dtype=np.float64)
    q = np.asarray(draft_probs, dtype=np.float64)
    for i, x in enumerate(candidates):
        if rng.random() * q[x] < p[x]:
            return i, int(x)
        p = residual_distribution(p, q)
    return -1, int(sample_inverse_cdf(p, rng.random()))


def multi_draft_step_probs(target_probs, draft_probs, k):  # [V], [V] -> [V]
    """
    k 个候选的多候选验证一步的输出分布，用精确枚举算（不抽样）-> [V]。

    【推导】第 i 轮（还没有候选被接受的概率为 s_i，s₁ = 1）：对每个 q(x) > 0 的 x，以 s_i·q(x)·min(1, p_i(x)/q(x)) 输出 x；
    拒绝的概率 s_{i+1} = s_i·Σ_x q(x)(1 − min(1, p_i(x)/q(x)))，p_{i+1} = norm(max(0, p_i − q))；
    k 轮之后剩下的 s_{k+1} 从 p_{k+1} 抽。结果应该正好是 p（测试断言）。k = 1 就是 speculative_step_probs。
    【边界】k < 1 抛 ValueError。
    """
    _check_k(k)
    p = np.asarray(target_probs, dtype=np.float64)
    q = np.asarray(draft_probs, dtype=np.float64)
    out = np.zeros_like(p)
    still = 1.0
    for _ in range(k):
        reject = 0.0
        for x in np.flatnonzero(q > 0):
            acc = min(1.0, p[x] / q[x])
            out[x] += still * q[x] * acc
            reject += q[x] * (1.0 - acc)
        still *= reject
        p = residual_distribution(p, q)
    return out + still * p


def multi_draft_acceptance(target_probs, draft_probs, k):  # [..., V], [..., V] -> [...]
    """
    k 个候选里有一个被接受的概率 = 1 − Π_{i=1..k} (1 − β_i)，β_i = Σ min(p_i, q)，p_i 同 multi_draft_verify -> [...]。

    【推导】第 i 个候选被拒绝的概率是 1 − β_i（Leviathan 定理 3.5 用在 p_i 上），各候选独立地从 q 抽。k = 1 时就是 β。
    对所有位置取平均得到 α_k（k 个候选时每层的接受率；α₁ = α）。
    【边界】k < 1 抛 ValueError；残差的和为 0 时用 p_i（同 residual_distribution）。
    """
    _check_k(k)
    p = np.asarray(target_probs, dtype=np.float64)
    q = np.asarray(draft_probs, dtype=np.float64)
    all_rejected = np.ones(p.shape[:-1])
    for i in range(k):
        all_rejected = all_rejected * (1.0 - acceptance_beta(p, q))
        if i + 1 < k:
            r = np.maximum(p - q, 0.0)
            s = r.sum(-1, keepdims=True)
            p = np.divide(r, s, out=p.copy(), where=s > 0)
    return 1.0 - all_rejected


def tree_expected_tokens(level_alphas):
    """
    树每轮（每次目标前向）平均产出的 token 数 E = 1 + Σ_{d=1..D} Π_{j≤d} a_j，a_j = 第 j 层的接受率 -> float。

    【推导】走到第 d 层的概率是前 d 层都有候选被接受的概率之积（各层独立时）；产出 1 + 走到的深度。
    第 j 层有 k_j 个候选时 a_j = α_{k_j}（multi_draft_acceptance 的平均）。链（每层 1 个，a_j = α）就是式 (1)。
    【边界】空的 level_alphas（没有草稿）是 1；a_j 不在 [0, 1] 里抛 ValueError。
    """
    a = np.asarray(level_alphas, dtype=np.float64)
    if np.any(~((a >= 0) & (a <= 1))):
        raise ValueError(f"每层的接受率必须在 [0, 1] 之间（收到 {list(a)}）")
    return float(1.0 + np.cumprod(a).sum())


def tree_parents(branching):
    """
    按层分叉的草稿树 -> 每个节点的父节点（list，-1 = 接在已确定的序列后面），节点按层、同层按父节点的顺序排。

    【参数】branching[d] = 第 d + 1 层每个节点有几个孩子，例如 (3, 2, 1, 1)：深 4 层，3 + 6 + 6 + 6 = 21 个节点。
    【边界】空的 branching、不是正整数的分叉数抛 ValueError。
    """
    if isinstance(branching, (str, bytes)) or not hasattr(branching, "__len__") or len(branching) == 0:
        raise ValueError(f"branching 必须是非空的正整数元组，例如 (3, 2, 1, 1)（收到 {branching!r}）")
    for b in branching:
        if not (isinstance(b, (int, np.integer)) and not isinstance(b, bool) and b >= 1):
            raise ValueError(f"branching 的每一层必须是 ≥ 1 的整数（收到 {tuple(branching)!r}）")
    parents, prev = [], [-1]
    for b in branching:
        level = []
        for a in prev:
            for _ in range(b):
                level.append(len(parents))
                parents.append(a)
        prev = level
    return parents


def tree_speculative_generate(target, draft, prompt, n_new, branching, T, rng, counter_t=None, stop=None):
    """
    树形投机解码 -> (新 token 的 int 数组 [n_new], stats)，约定同 speculative_generate：
    stats["target_calls"] = 轮数 = 目标模型的前向次数；stats["accepted"] = 每轮被接受的深度（0..len(branching)）的列表。

    【每一轮】
      1. 草稿按层长一棵树（tree_parents(branching)）：第 d 层的每个节点从它父节点的草稿分布 q 独立地抽 branching[d] 个孩子；
         草稿每层前向一次（树形注意力：每个节点只看已确定的序列和自己的祖先），最后一层（叶子）不用再算；
      2. 目标模型一次前向给整棵树打分（还没喂的已确定 token + 所有节点），得到每个节点的 p；
      3. 从根往下：一个节点的孩子们用多候选规则（multi_draft_verify）验证；接受了就走到那个孩子，
         全部拒绝就从残差抽修正 token、结束；走到叶子就从叶子的 p 抽额外的 token；
      4. 两个模型的缓存都只留下被接受的路径（KVCache.keep），和从头喂这条路径一样。
    【随机数】每轮：每个节点一个（按节点顺序抽草稿）；验证时每检查一个候选一个；最后一个抽修正 / 额外的 token。
    branching 全是 1（一条链）时和 speculative_generate 用随机数的顺序完全一样。
    stop：停止 token，规则同 decode_lab.speculative_generate。
    【边界】目标模型必须是 TransformerLM（要树形注意力）；branching 不合规矩（见 tree_parents）、提示 + 新 token − 1 + 树的
    节点数超过上下文都抛 ValueError。T = 0 时草稿的候选全一样（q 是 one-hot），输出正好是目标模型的贪心序列。
    """
    parents = tree_parents(branching)
    if not isinstance(target, NumpyTransformer):
        raise ValueError("树形投机解码的目标模型必须是 TransformerLM（要用树形注意力一次给整棵树打分）")
    adjust(np.zeros(1), T)
    N, D = len(parents), len(branching)
    seq = _check_generation(prompt, n_new, [target, draft], N)
    n0 = len(seq)
    starts, size = [0], 1                            # 第 d + 1 层的节点是 starts[d]..starts[d + 1] − 1
    for b in branching:
        size *= b
        starts.append(starts[-1] + size)
    children = [[] for _ in range(N + 1)]            # children[a + 1] = 节点 a 的孩子（a = -1 是根）
    for i, a in enumerate(parents):
        children[a + 1].append(i)
    t_sess, d_sess = target.session(), draft.session()
    calls, accepted = 0, []
    stop = _stop_set(stop)
    while len(seq) - n0 < n_new and not _stopped(seq, n0, stop):
        L = len(seq)
        # 1. 草稿按层长树：qs[a + 1] = 节点 a 的孩子们的草稿分布
        qs = [adjust(d_sess.logits(seq)[-1], T)] + [None] * N
        toks = []
        mask, pos = _tree_mask(parents, L)
        for d in range(D):
            for i in range(starts[d], starts[d + 1]):
                toks.append(int(sample_inverse_cdf(qs[parents[i] + 1], rng.random())))
            if d + 1 < D:
                lv = slice(starts[d], starts[d + 1])
                rows = d_sess.tree_logits(toks[lv], mask[lv, :L + starts[d + 1]], pos[lv])
                qs[starts[d] + 1:starts[d + 1] + 1] = list(adjust(rows, T))
        # 2. 目标模型一次前向：还没喂的已确定 token（一条链）+ 整棵树
        pend = seq[t_sess.fed:]
        par = list(range(-1, len(pend) - 1)) + [len(pend) - 1 if a < 0 else len(pend) + a for a in parents]
        t_mask, t_pos = _tree_mask(par, t_sess.fed)
        ps = adjust(t_sess.tree_logits(pend + toks, t_mask, t_pos, counter_t)[len(pend) - 1:], T)
        calls += 1
        # 3. 从根往下验证
        a, path = -1, []
        while True:
            kids = children[a + 1]
            if not kids:                             # 叶子：额外的 token
                tok = int(sample_inverse_cdf(ps[a + 1], rng.random()))
                break
            i, tok = multi_draft_verify(ps[a + 1], qs[a + 1], [toks[c] for c in kids], rng)
            if i < 0:
                break
            a = kids[i]
            path.append(a)
        seq += [toks[c] for c in path] + [tok]
        accepted.append(len(path))
        # 4. 缓存只留下被接受的路径（草稿没喂过叶子）
        t_sess.keep(L, path)
        d_sess.keep(L, [c for c in path if c < starts[D - 1]])
    return _finish(seq, n0, n_new, stop), {"target_calls": calls, "accepted": accepted}


def _log_softmax(logits):  # [..., V] -> [..., V]，每个值 ≤ 0
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _top(logq, k):
    """前 k 名的下标（从大到小，并列时下标小的在前）：distinct_lab.topk_candidates。"""
    return topk_candidates(logq, k)


def _check_count(name, v):
    if not (isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1):
        raise ValueError(f"{name} 必须是 ≥ 1 的整数（收到 {v!r}）")


def _grow_tree(d_sess, seq, top_k, depth):
    """
    EAGLE-2 的长树（cnets.py 的 topK_genrate）-> (toks, par, score, feed)：所有候选节点（按生成的顺序，父节点在前）、
    父节点（-1 = 根）、路径的对数概率（草稿 T = 1 的 log softmax 之和）、喂过草稿的节点 -> 它在草稿缓存里的序号。
    根的前 top_k 名是第 1 层，全部喂进草稿；之后每一步：把这一层要展开的（≤ top_k 个）一次喂进草稿（树形注意力），
    每个的前 top_k 名都成为候选（top_k² 个），其中路径概率最大的 top_k 个是下一步要展开的。一共喂 depth 次。
    """
    L = len(seq)
    root = _log_softmax(d_sess.logits(seq)[-1])
    toks, par, score, feed, feed_par = [], [], [], {}, []
    for c in _top(root, top_k):
        toks.append(int(c)), par.append(-1), score.append(float(root[c]))
    frontier = list(range(len(toks)))
    for _ in range(depth):
        lo = len(feed_par)
        for n in frontier:
            feed[n] = len(feed_par)
            feed_par.append(-1 if par[n] < 0 else feed[par[n]])
        mask, pos = _tree_mask(feed_par, L)
        rows = _log_softmax(d_sess.tree_logits([toks[n] for n in frontier], mask[lo:], pos[lo:]))
        new = []
        for n, lq in zip(frontier, rows):
            for c in _top(lq, top_k):
                new.append(len(toks))
                toks.append(int(c)), par.append(n), score.append(score[n] + float(lq[c]))
        frontier = sorted(new, key=lambda j: (-score[j], j))[:top_k]
    return toks, par, score, feed


def dynamic_tree_generate(target, draft, prompt, n_new, budget, T, rng, stop=None, *, top_k=EAGLE2_TOP_K,
                          depth=EAGLE2_DEPTH):
    """
    动态树的投机解码（EAGLE-2，Li et al. 2024，arXiv 2406.16858）-> (新 token 的 int 数组 [n_new], stats)。

    stats["target_calls"] = 轮数 = 目标的前向次数；stats["accepted"] = 每轮被接受的深度；stats["nodes"] = 每轮验证的
    树的节点数（≤ budget）；stats["positions"] = 每轮目标前向打分的位置数（还没喂的已确定 token + 节点）。
    【每一轮】
      1. 长树（_grow_tree）：按草稿在 T = 1 的路径概率（即使 T = 0 也用 T = 1 的 softmax：T = 0 的 adjust 把 q 变成
         one-hot，排不出名次）展开最可能的节点，depth 次草稿前向、每次 ≤ top_k 个节点；
      2. 重排：所有候选里路径概率最大的 budget 个组成要验证的树。孩子的路径概率 = 父节点的 + log q ≤ 父节点的，
         并列时父节点（生成得早）排在前面，所以选出来的节点的祖先都在树里；
      3. 目标一次前向给整棵树打分（树形注意力）；从根往下，一个节点的孩子（按草稿的概率从大到小）用点质量规则
         （distinct_lab.topk_draft_verify）验证，接受就走下去，全部拒绝就从剩下的 p 抽、结束；到了叶子从叶子的 p 抽额外的
         token。点质量规则精确，所以 T > 0 时输出的分布和目标自己采样一样；T = 0 时输出就是目标的贪心序列；
      4. 两个模型的缓存只留下被接受的路径（草稿只喂过展开过的节点：路径上喂过的是一个前缀）。
    【参数】budget：每轮最多验证几个节点（EAGLE 的 total_token）；top_k、depth：长树的宽和步数（默认见 EAGLE2_TOP_K、
    EAGLE2_DEPTH）。stop：停止 token，同 decode_lab.speculative_generate。
    【随机数】只在第 3 步：每检查一个候选一个，最后一个抽修正 / 额外的 token（T = 0 时抽到的就是 argmax）。
    【边界】budget、top_k、depth 不是 ≥ 1 的整数，目标不是 TransformerLM，提示 + 新 token − 1 + budget 超过目标的上下文、
    + top_k·depth 超过草稿的上下文：ValueError。候选总数（top_k + depth·top_k²）比 budget 少时全部验证。
    """
    for name, v in (("budget", budget), ("top_k", top_k), ("depth", depth)):
        _check_count(name, v)
    if not isinstance(target, NumpyTransformer):
        raise ValueError("动态树的目标模型必须是 TransformerLM（要用树形注意力一次给整棵树打分）")
    adjust(np.zeros(1), T)
    seq = _check_generation(prompt, n_new, [target], budget)
    _check_generation(prompt, n_new, [draft], top_k * depth)
    n0 = len(seq)
    t_sess, d_sess = target.session(), draft.session()
    stats = {"target_calls": 0, "accepted": [], "nodes": [], "positions": []}
    stop = _stop_set(stop)
    while len(seq) - n0 < n_new and not _stopped(seq, n0, stop):
        L = len(seq)
        # 1–2. 长树、留下路径概率最大的 budget 个节点（按生成的顺序：父节点在前）
        toks, par, score, feed = _grow_tree(d_sess, seq, top_k, depth)
        chosen = sorted(sorted(range(len(toks)), key=lambda j: (-score[j], j))[:budget])
        idx = {j: i for i, j in enumerate(chosen)}
        tree_par = [-1 if par[j] < 0 else idx[par[j]] for j in chosen]     # 祖先都在：idx 里查得到
        tree_tok = [toks[j] for j in chosen]
        children = [[] for _ in range(len(chosen) + 1)]                    # 同一个父节点的孩子按 q 从大到小
        for i, a in enumerate(tree_par):
            children[a + 1].append(i)
        # 3. 目标一次前向：还没喂的已确定 token（一条链）+ 整棵树
        pend = seq[t_sess.fed:]
        full = list(range(-1, len(pend) - 1)) + [len(pend) - 1 if a < 0 else len(pend) + a for a in tree_par]
        t_mask, t_pos = _tree_mask(full, t_sess.fed)
        ps = adjust(t_sess.tree_logits(pend + tree_tok, t_mask, t_pos)[len(pend) - 1:], T)
        stats["target_calls"] += 1
        stats["nodes"].append(len(chosen))
        stats["positions"].append(len(pend) + len(chosen))
        a, path = -1, []
        while True:
            kids = children[a + 1]
            if not kids:                                                   # 叶子：额外的 token
                tok = int(sample_inverse_cdf(ps[a + 1], rng.random()))
                break
            i, tok = topk_draft_verify(ps[a + 1], [tree_tok[c] for c in kids], rng)
            if i < 0:
                break
            a = kids[i]
            path.append(a)
        seq += [tree_tok[c] for c in path] + [tok]
        stats["accepted"].append(len(path))
        # 4. 缓存只留下被接受的路径
        t_sess.keep(L, path)
        d_sess.keep(L, [feed[chosen[c]] for c in path if chosen[c] in feed])
    return _finish(seq, n0, n_new, stop), stats


def dynamic_tree_expected(target, draft, prompt, text, n_pos, budgets, temps, *, top_k=EAGLE2_TOP_K,
                          depth=EAGLE2_DEPTH):  # -> [n_pos, len(budgets), len(temps)]
    """
    在一段文本的前 n_pos 个位置上各长一棵动态树，算"如果一轮从这里开始，每次目标调用平均产出几个 token"-> 数组。

    【推导】点质量规则等于"按 p 抽一个 token，它在孩子里就走过去"（distinct_lab.topk_draft_verify），所以一轮走到节点 v
    的概率就是目标的路径概率 P(v) = Π_{沿路径} p_父(v 那一层的 token)；一轮产出 1 + 走到的深度 = 1 + Σ_v 1[走到 v]，
    期望 E = 1 + Σ_{v ∈ 树} P(v)（T = 0 时 P(v) ∈ {0, 1}：1 + 树里贪心路径的长度）。不抽样：每个位置一个精确的条件期望。
    预算小的树是预算大的树按路径概率排的前 b 个：每个位置只长一次树、目标只前向一次（最大的预算），各个预算、各个温度
    都从这一次里算。位置 t 的上下文 = 提示 + text[:t]（和 dynamic_tree_generate 的一轮从这里开始时一样：
    测试在 T = 0 逐轮核对，在 T = 1 用抽样核对）。
    【参数】budgets：预算的元组；temps：验证用的温度（长树总是用草稿 T = 1 的 softmax）。
    【边界】n_pos 不在 1..len(text)、预算不是 ≥ 1 的整数：ValueError；目标要是 TransformerLM。
    """
    for b in budgets:
        _check_count("budget", b)
    if not (isinstance(n_pos, (int, np.integer)) and 1 <= n_pos <= len(text)):
        raise ValueError(f"n_pos 必须在 1..{len(text)} 之间（收到 {n_pos!r}）")
    if not isinstance(target, NumpyTransformer):
        raise ValueError("目标模型必须是 TransformerLM（要用树形注意力一次给整棵树打分）")
    for T in temps:
        adjust(np.zeros(1), T)
    prompt = _check_generation(prompt, n_pos, [target], max(budgets))
    _check_generation(prompt, n_pos, [draft], top_k * depth)
    t_sess, d_sess = target.session(), draft.session()
    out = np.zeros((n_pos, len(budgets), len(temps)))
    for t in range(n_pos):
        seq = prompt + [int(x) for x in text[:t]]
        L = len(seq)
        toks, par, score, _ = _grow_tree(d_sess, seq, top_k, depth)
        order = sorted(range(len(toks)), key=lambda j: (-score[j], j))[:max(budgets)]
        chosen = sorted(order)
        idx = {j: i for i, j in enumerate(chosen)}
        tree_par = [-1 if par[j] < 0 else idx[par[j]] for j in chosen]
        pend = seq[t_sess.fed:]
        full = list(range(-1, len(pend) - 1)) + [len(pend) - 1 if a < 0 else len(pend) + a for a in tree_par]
        t_mask, t_pos = _tree_mask(full, t_sess.fed)
        rows = t_sess.tree_logits(pend + [toks[j] for j in chosen], t_mask, t_pos)[len(pend) - 1:]
        for m, T in enumerate(temps):
            ps = adjust(rows, T)                                           # 第 0 行 = 根，第 i + 1 行 = 节点 i
            reach = np.zeros(len(chosen))
            for i, a in enumerate(tree_par):                               # 父节点在前
                reach[i] = (1.0 if a < 0 else reach[a]) * ps[a + 1][toks[chosen[i]]]
            for n, b in enumerate(budgets):
                out[t, n, m] = 1.0 + sum(reach[idx[j]] for j in order[:b])
        t_sess.keep(L, [])
        d_sess.keep(L, [])
    return out
