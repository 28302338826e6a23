"""
overlap_spec_lab —— 草稿和目标同时干活的投机解码（PEARL 的 post-verify，Liu et al., ICLR 2025, arXiv 2408.11850）：
进程内的参考生成器，和它在小词表上的精确枚举。两个 worker（草稿一个进程、目标一个进程）跑的重叠投机解码
必须和这里的 overlap_speculative_generate 逐个 token 相同（float64）。

【p 和 q】同 decode_lab：p = 目标（target_probs），q = 草稿（draft_probs）。

【算法（精确地说，worker 对必须一模一样）】
  rng_d, rng_t = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2)]
  草稿一条链 draft_chain(ctx)：γ 个 token，每个 q = decode_lab.adjust(草稿的 logits, T)，
      token = sample_inverse_cdf(q, rng_d.random())；point_mass 时 token = argmax q（不抽随机数），
      验证时 q 换成这个 token 的 one-hot（vLLM 的"没有草稿概率"的拒绝采样，接受概率 p(x)）。
  x = draft_chain(seq)
  直到有 n_new 个新 token：
    1. y = draft_chain(seq + x)：**总是**预先草稿 γ 个（消耗 rng_d），这时还不知道 x 的验证结果——
       这就是重叠：目标验证 x 的同时，草稿在另一台设备上接着往下写；
    2. 目标一次前向 seq + x，得到 p₁..p_γ；按顺序用 rng_t 验证 x，规则同 decode_lab.verify_chain：
       r·q_i(x_i) < p_i(x_i) 就接受；
    3. 第一次拒绝在第 n 个（从 0 数）：修正 token = sample_inverse_cdf(norm(max(0, p_n − q_n)), rng_t.random())，
       seq += x[:n] + [修正 token]，y 扔掉，x = draft_chain(seq)（重新草稿：也消耗 rng_d）；
    4. 全部接受：seq += x，x = y，**不抽额外的 token**——PEARL 的规则：预先草稿的 y₁ 就在 x 之后的那个位置上
       接受验证，它代替了额外的 token。既抽额外的 token 又把 y 接上去验证，是错的（mutation="bonus"）。
  输出截到 n_new 个；停止 token 同 decode_lab（一轮留下的 token 里出现停止 token 就在它之后截断、不再开新的一轮）。
  和 decode_lab.speculative_generate 不能逐个 token 相同（下一轮的草稿在这一轮验证之前就抽了），
  所以这里用两条随机数流，精确性靠枚举证明：overlap_output_distribution 算出输出的精确分布，测试断言它等于目标
  自己的自回归分布。

【只写一遍：两种"原语"】一轮的算法（_round）只通过四个原语用随机性：draw_draft(dist)、draw_target(dist)、
draw_residual(p, q)（从残差 norm(max(0, p − q)) 抽）-> token，accept(p_x, q_x) -> bool。_Sampler 用两条随机数流
实现它们（生成器）；_Replay 按给定的选择重放、记下每个分支和它的概率（精确枚举）。两者跑的是同一段代码。

【为什么这样是精确的】Leviathan 附录 A.1 的证明只要求：被验证的草稿 token 是从一个已知的 q 抽出来的，且和验证用的
随机数独立。y 是在 seq + x 之后抽的；全部接受时 seq + x 正好是新的已确定序列，y 的 q 就是那些位置上草稿的分布。

【两个故意的错误（mutation，只给测试用）】
  "stale"：拒绝之后不扔 y，下一轮拿 y 当草稿，而且按它被草稿出来的上下文（旧的 seq + x，其中有被拒绝的 token）
          验证，再接到修正过的序列后面——"提交了过时的草稿"；
  "bonus"：全部接受时先从 p_{γ+1} 抽一个额外的 token 接上，再拿 y（它是为额外 token 那个位置草稿的）按旧的上下文
          验证、接在额外的 token 后面——"额外的 token 和预先的草稿都要"。
  两个都改变枚举出来的分布（测试断言）。注意：只是"拒绝后留着 y、但在新的上下文里重新验证"并不改变分布
  （y 仍然是从已知的 q 抽的），它只降低接受率（mutation="keep_y"，测试也断言它精确）；同理，抽了额外的 token、
  再把 y 放到新的上下文里验证，分布也不变（y 是为错的位置草稿的，只是接受得少），但和上面的规则逐 token 不同——
  worker 对要逐 token 等于这里，所以测试拿一份逐字转写的参照核对生成器。

【出处】PEARL 的代码（github.com/smart-lty/ParallelSpeculativeDecoding，src/engine.py @1e61cc3 的
parallel_speculative_decoding）post-verify 的一支：全部接受时把草稿那边已经接着写出的 γ 个 token 接到前缀上，
不抽额外的 token；有拒绝时抽修正 token、草稿回滚。PEARL 还有 pre-verify（草稿时先验证第一个 token）和两者之间的
切换（自适应的草稿长度），这里只做固定 γ 的 post-verify。论文摘要报告比自回归最多快 4.43×、比普通投机解码最多
快 1.50×（他们的模型对、他们的硬件）；这里不和它比。
"""
import os
import sys

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
for _sub in ("lecture01", "lecture02", "lecture06"):
    _p = os.path.join(_HERE, "..", _sub)
    if _p not in sys.path:
        sys.path.insert(0, _p)

from decode_lab import _check_generation, _finish, _stop_set, _stopped, adjust, residual_distribution  # noqa: E402
from transformer_lab import sample_inverse_cdf  # noqa: E402

__all__ = ["overlap_speculative_generate", "overlap_output_distribution", "target_joint_distribution",
           "overlap_streams", "MUTATIONS"]

MUTATIONS = (None, "stale", "bonus", "keep_y")
ENUM_MAX_VOCAB, ENUM_MAX_NEW = 4, 3


# ---------------------------------------------------------------------------
# 行：会话（生成器，带 KV cache）或记住整段前向的结果（枚举）
# ---------------------------------------------------------------------------
class _SessionRows:
    """一个模型的增量会话 + 它喂过的 token：rows(seq, k) = seq 最后 k 个位置的 adjust(logits, T)
    （KV cache 回滚到公共前缀）。"""

    def __init__(self, model, T):
        self.sess, self.fed, self.T = model.session(), [], T

    def rows(self, seq, k):  # -> [k, V]
        m = 0
        for a, b in zip(self.fed, seq):
            if a != b:
                break
            m += 1
        self.sess.truncate(min(m, len(seq) - k))
        self.fed = list(seq)
        return adjust(self.sess.logits(list(seq))[-k:], self.T)


class _MemoRows:
    """整段前向、adjust 过的概率按序列记住（枚举时同一个前缀会被重放很多次）。"""

    def __init__(self, model, T):
        self.model, self.memo, self.T = model, {}, T

    def rows(self, seq, k):
        key = tuple(seq)
        if key not in self.memo:
            if hasattr(self.model, "full_logits"):
                self.memo[key] = adjust(self.model.full_logits([list(seq)])[0], self.T)
            else:
                self.memo[key] = adjust(self.model.table[np.asarray(seq)], self.T)
        return self.memo[key][-k:]


# ---------------------------------------------------------------------------
# 原语：抽样（两条随机数流）或重放（枚举）
# ---------------------------------------------------------------------------
def overlap_streams(seed):
    """重叠时的两条随机数流 -> (草稿的, 目标的)：SeedSequence(seed).spawn(2) 的第 0、1 条（split_worker_lab 的两个 worker 也用它）。"""
    sd, st = np.random.SeedSequence(seed).spawn(2)
    return np.random.default_rng(sd), np.random.default_rng(st)


class _Sampler:
    def __init__(self, seed):
        self.rng_d, self.rng_t = overlap_streams(seed)

    def draw_draft(self, dist):
        return int(sample_inverse_cdf(dist, self.rng_d.random()))

    def draw_target(self, dist):
        return int(sample_inverse_cdf(dist, self.rng_t.random()))

    def draw_residual(self, p, q):
        return self.draw_target(residual_distribution(p, q))

    def accept(self, p_x, q_x):
        return self.rng_t.random() * q_x < p_x


class _Replay:
    """按 prefix 里的选择重放；prefix 之后每个选择点取第 0 个分支，并记下所有分支（选项, 概率）。
    last_round=True：这一轮之后输出已经够了，草稿的抽样（预先草稿 y、拒绝后的新草稿）进不了输出：它们只取第 0 个
    选项、概率记 1，不分支（见 overlap_output_distribution 的【做法】）。"""

    def __init__(self, prefix, memo, last_round=False):
        self.prefix, self.i, self.prob, self.points, self.memo = prefix, 0, 1.0, [], memo
        self.last_round = last_round

    def _choose(self, options):  # options: [(值, 概率)]，概率 > 0
        if self.i < len(self.prefix):
            k = self.prefix[self.i]
        else:
            k = 0
            self.points.append(len(options))
        self.i += 1
        value, pr = options[k]
        self.prob *= pr
        return value

    def _draw_options(self, dist, key):
        s = dist.sum()
        self.memo[key] = [(int(t), float(dist[t] / s)) for t in np.flatnonzero(dist > 0)]

    def _draw(self, dist):
        key = dist.tobytes()                      # 同一个分布的分支只算一次（memo 在一次枚举里共用）
        if key not in self.memo:
            self._draw_options(dist, key)
        return self._choose(self.memo[key])

    draw_target = _draw

    def draw_draft(self, dist):
        if self.last_round:
            key = dist.tobytes()
            if key not in self.memo:
                self._draw_options(dist, key)
            return self.memo[key][0][0]
        return self._draw(dist)

    def draw_residual(self, p, q):
        key = (p.tobytes(), q.tobytes())          # 残差只取决于 (p, q)：每对只算一次
        if key not in self.memo:
            self.memo[key] = residual_distribution(p, q)
        return self._draw(self.memo[key])

    def accept(self, p_x, q_x):
        key = (p_x, q_x)                          # 接受 / 拒绝两个分支的概率只取决于这两个数：每对只算一次
        if key not in self.memo:
            a = min(1.0, p_x / q_x)
            self.memo[key] = [(v, pr) for v, pr in ((True, a), (False, 1.0 - a)) if pr > 0]
        return self._choose(self.memo[key])


# ---------------------------------------------------------------------------
# 一轮（只写一遍）
# ---------------------------------------------------------------------------
def _draft_chain(d_rows, ctx, gamma, T, point_mass, prims):
    """草稿一条链 -> (γ 个 token, γ 个验证用的 q)。"""
    toks, qs, cur = [], [], list(ctx)
    for _ in range(gamma):
        q = d_rows.rows(cur, 1)[-1]
        if point_mass:
            t = int(np.argmax(q))
            q = np.zeros_like(q)
            q[t] = 1.0
        else:
            t = prims.draw_draft(q)
        toks.append(t)
        cur.append(t)
        qs.append(q)
    return toks, qs


def _round(state, t_rows, d_rows, gamma, T, point_mass, prims, mutation):
    """
    一轮 -> (新状态, 这一轮接受的个数 n, 这一轮用的草稿是不是预先草稿的)。
    state = (seq, ctx, x, qx, pre)：已确定的序列、x 被草稿出来（也被验证）的上下文、x、它的 q、x 是不是预先草稿的。
    正确的算法里 ctx == seq 总成立；两个 mutation 让它们分开。
    """
    seq, ctx, x, qx, pre = state
    y, qy = _draft_chain(d_rows, ctx + x, gamma, T, point_mass, prims)            # 1. 预先草稿：总是 γ 个
    ps = t_rows.rows(ctx + x, gamma + 1)                                # 2. p₁..p_{γ+1}
    n = 0
    while n < gamma and prims.accept(ps[n][x[n]], qx[n][x[n]]):
        n += 1
    if n < gamma:                                                                  # 3. 拒绝
        tok = prims.draw_residual(ps[n], qx[n])
        new_seq = seq + x[:n] + [tok]
        if mutation == "stale":
            return (new_seq, ctx + x, y, qy, True), n, pre
        if mutation == "keep_y":
            return (new_seq, new_seq, y, qy, True), n, pre
        nx, nq = _draft_chain(d_rows, new_seq, gamma, T, point_mass, prims)
        return (new_seq, new_seq, nx, nq, False), n, pre
    new_seq = seq + x                                                              # 4. 全部接受：x = y，没有额外的 token
    if mutation == "bonus":
        new_seq = new_seq + [prims.draw_target(ps[gamma])]
        return (new_seq, ctx + x, y, qy, True), n, pre
    return (new_seq, new_seq, y, qy, True), n, pre


def _check(gamma, T, mutation):
    if not (isinstance(gamma, (int, np.integer)) and not isinstance(gamma, bool) and gamma >= 1):
        raise ValueError(f"草稿长度 γ 必须是 ≥ 1 的整数（收到 {gamma!r}）")
    adjust(np.zeros(1), T)
    if mutation not in MUTATIONS:
        raise ValueError(f"mutation 只能是 {MUTATIONS} 之一（收到 {mutation!r}）")


# ---------------------------------------------------------------------------
# 生成器与精确枚举
# ---------------------------------------------------------------------------
def overlap_speculative_generate(target, draft, prompt, n_new, gamma, T, seed, *, point_mass=False, stop=None,
                                 mutation=None):
    """
    重叠的投机解码（PEARL 的 post-verify；算法见模块说明）-> (新 token 的 int 数组 [n_new], stats)。

    stats：target_calls（目标前向次数 = 轮数）；accepted（每轮接受的个数）；predraft_used（用预先草稿的 y 当草稿的轮数）；
    draft_tokens（草稿一共抽了几个 token，含最后一轮预先草稿、没用上的）；draft_wasted（其中没进输出的）。
    【参数】seed：整数，两条随机数流从 SeedSequence(seed).spawn(2) 来（草稿一条、目标一条）；point_mass：草稿取 argmax、
    验证不用草稿的概率；stop：停止 token；mutation：只给测试用的故意错误（模块说明），默认 None。
    【边界】γ < 1、T < 0、提示 + n_new − 1 + 2γ 超过模型的上下文（预先草稿要多 γ 个位置）：ValueError。
    """
    _check(gamma, T, mutation)
    stop = _stop_set(stop)
    seq = _check_generation(prompt, n_new, [target, draft], 2 * gamma)
    n0 = len(seq)
    prims = _Sampler(seed)
    t_rows, d_rows = _SessionRows(target, T), _SessionRows(draft, T)
    x, qx = _draft_chain(d_rows, seq, gamma, T, point_mass, prims)
    state = (seq, seq, x, qx, False)
    stats = {"target_calls": 0, "accepted": [], "predraft_used": 0, "draft_tokens": gamma, "draft_wasted": 0}
    while len(state[0]) - n0 < n_new and not _stopped(state[0], n0, stop):
        state, n, pre = _round(state, t_rows, d_rows, gamma, T, point_mass, prims, mutation)
        stats["target_calls"] += 1
        stats["accepted"].append(n)
        stats["predraft_used"] += int(pre)
        stats["draft_tokens"] += gamma if (n == gamma or mutation in ("stale", "keep_y")) else 2 * gamma
    out = _finish(state[0], n0, n_new, stop)
    stats["draft_wasted"] = stats["draft_tokens"] - sum(stats["accepted"])
    return out, stats


def overlap_output_distribution(target, draft, prompt, n_new, gamma, T, *, point_mass=False, stop=None,
                                mutation=None):
    """
    overlap_speculative_generate 输出的精确分布 -> {新 token 的元组: 概率}（不抽样，把每个分支按概率走一遍）。

    【做法】状态 = (已确定的序列, 上下文, 当前的草稿 x)；按已确定序列的长度从短到长，每个状态把一轮（_round，和生成器
    同一段代码）的所有分支重放一遍（_Replay：深度优先，每个选择点的每个分支），相同的状态合并概率；
    到了 n_new 个（或停止 token）的状态按输出（_finish）累加。第一条草稿链也一样分支。
    概率 0 的分支不走（sample_inverse_cdf 抽不到概率 0 的 token；接受概率 1 时没有拒绝分支）。
    最后一轮（已确定的 token 再加 1 个就够 n_new：每轮至少出 1 个）里草稿的抽样——预先草稿 y、拒绝后的新草稿——只影响
    下一轮，进不了输出：它们只走第 0 个选项、概率记 1（各自的选项概率和本来就是 1，输出的分布不变，只少了成倍的分支；
    如果哪个错误让它们进了输出，固定成一个 token 会让分布明显不对，照样看得出）。
    【边界】词表 > 4 或 n_new > 3（分支太多）、其他参数同生成器：ValueError。
    """
    _check(gamma, T, mutation)
    for m in (target, draft):
        V = m.cfg.vocab if hasattr(m, "cfg") else m.table.shape[-1]
        if V > ENUM_MAX_VOCAB:
            raise ValueError(f"精确枚举只给词表 ≤ {ENUM_MAX_VOCAB} 的玩具用（收到 {V}）")
    if isinstance(n_new, (int, np.integer)) and n_new > ENUM_MAX_NEW:
        raise ValueError(f"精确枚举只给 n_new ≤ {ENUM_MAX_NEW} 用（收到 {n_new}）")
    stop = _stop_set(stop)
    seq = _check_generation(prompt, n_new, [target, draft], 2 * gamma)
    n0 = len(seq)
    t_rows, d_rows = _MemoRows(target, T), _MemoRows(draft, T)

    def branches(step, last_round=False):  # step(prims) -> 结果；-> [(结果, 概率)]
        out, stack, memo = [], [[]], {}
        while stack:
            prefix = stack.pop()
            r = _Replay(prefix, memo, last_round)
            res = step(r)
            out.append((res, r.prob))
            for j in range(len(prefix), len(prefix) + len(r.points)):
                for k in range(1, r.points[j - len(prefix)]):
                    stack.append(list(prefix) + [0] * (j - len(prefix)) + [k])
        return out

    def key(st):  # q 也在键里：mutation="keep_y" 的 q 取决于被扔掉的 token，不由 (上下文, x) 决定
        return (tuple(st[0]), tuple(st[1]), tuple(st[2]), tuple(q.tobytes() for q in st[3]), st[4])

    live = {}
    for (x, qx), pr in branches(lambda p: _draft_chain(d_rows, seq, gamma, T, point_mass, p)):
        st = (seq, seq, x, qx, False)
        live.setdefault(key(st), [st, 0.0])[1] += pr
    result = {}
    while live:
        L = min(len(k[0]) for k in live)
        now = [v for k, v in live.items() if len(k[0]) == L]
        live = {k: v for k, v in live.items() if len(k[0]) != L}
        for st, pr in now:
            if len(st[0]) - n0 >= n_new or _stopped(st[0], n0, stop):
                out = tuple(int(t) for t in _finish(st[0], n0, n_new, stop))
                result[out] = result.get(out, 0.0) + pr
                continue
            last = len(st[0]) - n0 + 1 >= n_new           # 每轮至少出 1 个 token：这一轮之后输出就够了
            for (nst, _, _), pb in branches(lambda p: _round(st, t_rows, d_rows, gamma, T, point_mass, p, mutation),
                                            last):
                live.setdefault(key(nst), [nst, 0.0])[1] += pr * pb
    return result


def target_joint_distribution(target, prompt, n_new, T, *, stop=None):
    """
    目标模型自己自回归采样 n_new 个 token 的精确联合分布 -> {元组: 概率}（把每一步的 p 连乘；停止 token 之后不再走）。

    【做法】每个前缀做一次整段前向（full_logits），和生成器、枚举用的行无关——测试拿它当独立的参照。
    """
    adjust(np.zeros(1), T)
    stop = _stop_set(stop)
    prompt = [int(t) for t in np.asarray(prompt).ravel()]
    out, frontier = {}, [((), 1.0)]
    while frontier:
        toks, pr = frontier.pop()
        if len(toks) == n_new or (toks and toks[-1] in stop):
            out[toks] = out.get(toks, 0.0) + pr
            continue
        p = adjust(target.full_logits([prompt + list(toks)])[0][-1], T)
        for t in np.flatnonzero(p > 0):
            frontier.append((toks + (int(t),), pr * float(p[t])))
    return out
