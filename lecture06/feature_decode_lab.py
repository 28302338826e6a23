"""
feature_decode_lab —— 草稿要目标特征的投机解码：medusa_generate、eagle_generate（精确：输出的分布是目标的），和它们在
T = 0 的精确轮次（medusa_ranks、medusa_rounds、eagle_rounds：不跑循环，按贪心文本数）。

decode_lab.speculative_generate 不给草稿目标的特征；这里的生成器每次目标前向同时拿 logits 和特征
（trained_draft_lab.forward_with_features），草稿是 trained_draft_lab.DraftHead。p = 目标、q = 草稿，同 decode_lab。
"""
import numpy as np

from decode_lab import _check_generation, _finish, _stop_set, _stopped, adjust, verify_chain  # noqa: E402
from distinct_lab import topk_candidates, topk_draft_verify  # noqa: E402
from trained_draft_lab import forward_with_features  # noqa: E402
from transformer_lab import NumpyTransformer, sample_inverse_cdf, tree_mask  # noqa: E402
from tree_lab import tree_parents  # noqa: E402

__all__ = ["medusa_generate", "eagle_generate", "medusa_ranks", "medusa_rounds", "eagle_rounds"]


# ---------------------------------------------------------------------------
# 生成
# ---------------------------------------------------------------------------
def _prefill(target, seq, T, rng):
    """提示一次前向 -> (cache, 第一个新 token, 抽它的那一行的特征)。"""
    cache = target.new_cache(1)
    logits, feats = forward_with_features(target, seq, cache)
    tok = int(sample_inverse_cdf(adjust(logits[-1], T), rng.random()))
    return cache, tok, feats[-1]


def _check_target(target, head):
    if not isinstance(target, NumpyTransformer):
        raise ValueError("目标模型必须是 NumpyTransformer / TransformerLM（要它的特征和树形注意力）")
    if head.model is not target:
        raise ValueError("草稿必须接在同一个目标模型上（DraftHead(kind, target, …)：共用它的 lm_head）")


def medusa_generate(target, heads, prompt, n_new, T, rng, widths=None, stop=None):
    """
    Medusa 头 + 固定树的投机解码 -> (新 token 的 int 数组 [n_new], stats)。stats["target_calls"] = 目标的前向次数
    （含提示的那一次）；stats["accepted"] = 每轮被接受的深度。

    【每一轮】已确定的序列最后一个 token x 刚从 f 的 p 抽出、还没喂给目标：
      1. 头 i 在 f 上给第 i 层的 top-w_i 个候选（按草稿的 logits 排；温度不改变次序）；树 = 各层候选的笛卡儿积
         （tree_lab.tree_parents(widths)）；
      2. 目标一次前向：x + 整棵树（树形注意力），得到 x 和每个节点的 p 和特征；
      3. 从 x 往下：一个节点的孩子们按点质量规则验证（distinct_lab.topk_draft_verify）；接受就走下去，全部拒绝时那个规则
         已经从剩下的 p 抽了一个 token；走到叶子就从叶子的 p 抽额外的 token；
      4. 缓存只留 x 和被接受的路径（KVCache.keep）；新抽的 token 成为下一轮的 x，走到的最后一个节点的特征是下一轮的 f。
    【参数】heads：DraftHead("medusa", target, …)；widths：每层几个候选，默认 (1,) × k（一条链）；长度 ≤ k。
    【随机数】提示之后的第一个 token 一个；每轮验证时每检查一个候选一个，最后一个抽修正 / 额外的 token。
    【边界】widths 长度超过头数、不是正整数（见 tree_parents）、上下文不够：ValueError。
    """
    _check_target(target, heads)
    if heads.kind != "medusa":
        raise ValueError("medusa_generate 要 Medusa 头（DraftHead('medusa', …)）")
    widths = tuple([1] * heads.k if widths is None else widths)
    parents = tree_parents(widths)
    if len(widths) > heads.k:
        raise ValueError(f"树有 {len(widths)} 层，只有 {heads.k} 个头")
    adjust(np.zeros(1), T)
    stop = _stop_set(stop)
    N = len(parents)
    seq = _check_generation(prompt, n_new, [target], N + 1)
    n0 = len(seq)
    level = np.zeros(N, dtype=np.int64)              # 每个节点在第几层、是父节点的第几个孩子
    sib = np.zeros(N, dtype=np.int64)
    children = [[] for _ in range(N + 1)]            # children[a + 1] = 节点 a 的孩子（a = -1 是 x）
    for i, a in enumerate(parents):
        level[i] = 0 if a < 0 else level[a] + 1
        sib[i] = len(children[a + 1])
        children[a + 1].append(i)
    cache, tok, f = _prefill(target, seq, T, rng)
    seq.append(tok)
    calls, accepted = 1, []
    while len(seq) - n0 < n_new and not _stopped(seq, n0, stop):
        # 1. 候选：头 i 的 top-w_i
        cand = [topk_candidates(row, w) for row, w in zip(heads.medusa_logits(f), widths)]
        toks = [int(cand[level[i]][sib[i]]) for i in range(N)]
        # 2. 目标一次前向：x + 树
        L = cache.pos
        par = [-1] + [0 if a < 0 else a + 1 for a in parents]
        mask, pos = tree_mask(par, L)
        logits, feats = forward_with_features(target, [seq[-1]] + toks, cache, mask, pos)
        ps = adjust(logits, T)
        calls += 1
        # 3. 从 x 往下验证
        a, path = -1, []
        while True:
            kids = children[a + 1]
            if not kids:
                tok = int(sample_inverse_cdf(ps[a + 1], rng.random()))
                break
            i, tok = topk_draft_verify(ps[a + 1], [toks[c] for c in kids], rng)
            if i < 0:
                break
            a = kids[i]
            path.append(a)
        f = feats[a + 1]
        # 4. 缓存只留 x 和路径
        cache.keep(L, [0] + [c + 1 for c in path])
        seq += [toks[c] for c in path] + [tok]
        accepted.append(len(path))
    return _finish(seq, n0, n_new, stop), {"target_calls": calls, "accepted": accepted}


def eagle_generate(target, draft, prompt, n_new, gamma, T, rng, stop=None):
    """
    EAGLE 式特征草稿的投机解码（一条链）-> (新 token 的 int 数组 [n_new], stats)，stats 同 medusa_generate。

    【每一轮】x 刚从特征 f 的 p 抽出、还没喂给目标：
      1. 草稿在特征空间里自回归 γ 步：(u, q_j) = 草稿(u_{j−1}, 上一个 token)，u_0 = f，上一个 token 先是 x、之后是
         草稿自己抽的 d_j；d_j 从 q_j 抽（温度 T）；
      2. 目标一次前向：x, d_1..d_γ，得到 p_1..p_{γ+1} 和特征；
      3. verify_chain（Leviathan 的规则：接受 n 个，再抽修正 / 额外的 token）；
      4. 缓存回滚到 x, d_1..d_n；第 n 行（d_n 的位置，n = 0 时是 x 的）的特征是下一轮的 f。
    【随机数】提示之后的第一个 token 一个；每轮 γ 个草稿各一个，verify_chain 的（每检查一个一个，最后一个抽 token）。
    【边界】γ < 1、上下文不够：ValueError。
    """
    _check_target(target, draft)
    if draft.kind != "eagle":
        raise ValueError("eagle_generate 要 EAGLE 式草稿（DraftHead('eagle', …)）")
    if not (isinstance(gamma, (int, np.integer)) and not isinstance(gamma, bool) and gamma >= 1):
        raise ValueError(f"草稿长度 γ 必须是 ≥ 1 的整数（收到 {gamma!r}）")
    adjust(np.zeros(1), T)
    stop = _stop_set(stop)
    seq = _check_generation(prompt, n_new, [target], gamma + 1)
    n0 = len(seq)
    cache, tok, f = _prefill(target, seq, T, rng)
    seq.append(tok)
    calls, accepted = 1, []
    while len(seq) - n0 < n_new and not _stopped(seq, n0, stop):
        # 1. 草稿 γ 个
        u, prev, drafts, qs = f, seq[-1], [], []
        for _ in range(gamma):
            u, z = draft.eagle_step(u, prev)
            q = adjust(z, T)
            prev = int(sample_inverse_cdf(q, rng.random()))
            drafts.append(prev)
            qs.append(q)
        # 2. 目标一次前向
        logits, feats = forward_with_features(target, [seq[-1]] + drafts, cache)
        calls += 1
        # 3. 验证
        n, tok = verify_chain(adjust(logits, T), qs, drafts, rng)
        # 4. 回滚
        cache.rollback(gamma - n)
        f = feats[n]
        seq += drafts[:n] + [tok]
        accepted.append(n)
    return _finish(seq, n0, n_new, stop), {"target_calls": calls, "accepted": accepted}


# ---------------------------------------------------------------------------
# T = 0 的精确轮次（不跑循环；同 greedy_lab 的道理）
# ---------------------------------------------------------------------------
def _feature_rounds(n, accept, depth):
    """
    一轮从第 t 个新 token（已抽出、还没喂）开始，accept(t) = 这一轮接受的草稿个数 r，下一轮从 t + r + 1 开始 -> dict
    （字段同 greedy_lab.greedy_rounds：starts、accepted、drafted、complete、calls、n）。
    complete：草稿的 depth 个位置和额外的那个都在文本里（t + depth + 1 < n），greedy_lab.round_summary 只用这些轮。
    """
    starts, acc = [], []
    t = 0
    while t < n:
        r = int(accept(t))
        starts.append(t)
        acc.append(r)
        t += r + 1
    starts = np.asarray(starts, dtype=np.int64)
    return {"starts": starts, "accepted": np.asarray(acc, dtype=np.int64),
            "drafted": np.full(len(acc), depth, dtype=np.int64), "gammas": np.full(len(acc), depth, dtype=np.int64),
            "complete": starts + depth + 1 < n, "calls": len(acc), "n": int(n)}


def medusa_ranks(heads, feats, text):  # [n, d], [n] -> [k, n]
    """
    ranks[i, t] = 文本的第 t + i + 1 个新 token 在头 i 于特征 f_t 上的 logits 里排第几（0 = 头的 argmax；
    并列规则同 greedy_lab.token_ranks）；超出文本的位置是 V（永远不算猜中）。
    【参数】feats[t]：抽出文本第 t 个新 token 的那一行的特征（target_features 在提示 + 文本上，从提示的最后一行起）。
    """
    text = np.asarray(text, dtype=np.int64)
    n, V = text.size, heads.model.cfg.vocab
    out = np.full((heads.k, n), V, dtype=np.int64)
    for t in range(n):
        z = heads.medusa_logits(feats[t])
        for i in range(heads.k):
            j = t + i + 1
            if j < n:
                own = z[i, text[j]]
                out[i, t] = int(np.sum(z[i] > own) + np.sum(z[i, :text[j]] == own))
    return out


def medusa_rounds(ranks, widths):  # [k, n] -> dict
    """
    medusa_generate 在 T = 0 的每一轮 -> dict（同 _feature_rounds）。

    【推导】T = 0 时被接受的只能是贪心路径；轮从 t 开始（文本的第 t 个 token 是待喂的 x），第 i 层接得上 ⇔
    文本的第 t + i 个 token 排在头 i 于 f_t 上的前 w_i 名（ranks[i − 1, t] < w_i），连续接得上的层数就是接受的个数。
    下一轮的 f 是最后一个被接受的节点的特征——也就是贪心文本上那个位置的特征，所以 ranks 一次算完就够。
    """
    widths = [int(w) for w in widths]
    d = len(widths)

    def accept(t):
        r = 0
        while r < d and ranks[r, t] < widths[r]:
            r += 1
        return r

    return _feature_rounds(ranks.shape[1], accept, d)


def eagle_rounds(draft, feats, text, gamma):  # -> dict
    """
    eagle_generate 在 T = 0 的每一轮 -> dict（同 _feature_rounds）。

    【推导】轮从 t 开始：草稿从 (f_t, 文本第 t 个 token) 出发自回归；前 i 个草稿都等于文本时，第 i + 1 步的输入是
    草稿自己预测的特征和文本的第 t + i 个 token（它自己的草稿），所以要按轮真的跑草稿（不能用一个 0/1 序列）。
    第一次猜错就停。目标的特征只在每轮的起点用到：f_t 是贪心文本上 teacher forcing 的特征。
    """
    text = [int(x) for x in text]
    n = len(text)

    def accept(t):
        u, prev, r = feats[t], text[t], 0
        while r < gamma and t + r + 1 < n:
            u, z = draft.eagle_step(u, prev)
            prev = text[t + r + 1]
            if int(np.argmax(z)) != prev:
                break
            r += 1
        return r

    return _feature_rounds(n, accept, gamma)
