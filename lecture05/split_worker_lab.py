"""
split_worker_lab —— 拆开的投机解码：草稿模型在一个进程里、目标模型在另一个进程里，每一轮的消息真的穿过进程的边界
（一条管道 = 一条"链路"），链路的延迟和带宽可以加上去；还有一轮的模型时钟（从标定文件里的常数算）。

【外观】split_speculative_generate(draft_recipe, target_recipe, prompt, n_new, *, num_speculative_tokens, T, seed,
protocol="lazy_q", overlap=False, link_delay_s=0.0, link_bytes_per_s=None, stop=None, timed=False) -> (tokens, stats)：
起一对 worker、跑一个请求、关掉。要跑很多个请求时用 SplitPair(draft_recipe, target_recipe) 的 generate(...)（同样的参数），
一对 worker 只起一次；with 或 close() 结束它们。配方是字符串，两个进程各自用 split_models_lab.build_split_model 建模型
（不 pickle 模型对象：spawn 可以在任何地方起它）。
【三种协议】（p = 目标、q = 草稿，同 decode_lab 的约定）
- "point_mass"：草稿取 argmax 提议（vLLM V1 的 EAGLE / MTP 的做法：拒绝采样不用草稿的概率），γ 个 token id 过去，
  接受的个数 + 1 个 token 回来；x 以概率 p(x) 被接受（distinct_lab.topk_draft_verify）。随机数只在目标那边用。
- "lazy_q"：γ 个 token id + γ 个标量 q_i(x_i) 过去；全部接受时回来接受的个数 + 额外的 token；在第一个拒绝的位置 n，
  **p_n 回到草稿那边**，草稿那边从 norm(max(0, p_n − q_n)) 抽修正 token（decode_lab.residual_distribution）——p_n 搭在
  本来就要回来的那条消息上，不多一次穿越；修正 token 搭下一轮的草稿过去（多 4 字节）。
- "full_q"：γ 个 token id + γ × V 个 q 过去（朴素的做法，为了看它的代价），目标那边调 decode_lab.verify_chain。
q 按模型的 dtype 过去：float64 的模型原样；float32 的模型把 q 舍入成 float32 再归一化，草稿从舍入后的 q 抽（否则接受率
用的不是它抽样的那个 q）——那种情况不等于 speculative_generate 的逐 token 结果，等式测试只测 float64。
【一个随机数发生器】overlap=False 时只有一个 np.random.default_rng(seed)，它的状态跟着消息走：草稿抽完 γ 个，状态
随草稿到目标；目标验证完，状态随回答回到草稿。消耗的顺序和 decode_lab.speculative_generate 一样（每轮都草稿 γ 个，
最后一轮也是），所以 full_q、lazy_q 的输出逐 token 等于它；point_mass 等于 tree_lab.dynamic_tree_generate(…, budget=γ,
top_k=1, depth=γ)（那里随机数也只用在验证上）。
【重叠】overlap=True：目标验证第 r 轮的时候，草稿接着假设全部接受、预先草稿 γ 个（overlap_spec_lab 的
overlap_speculative_generate 是进程内的参照：两条随机数流 SeedSequence(seed).spawn(2)，规则见那里）。
【链路】Link：一条消息 = 8 字节的"不早于这个时刻交付"（发的一边的 time.perf_counter() + 延迟 + 字节 / 带宽，两个进程
在同一台 Linux 上读同一个 CLOCK_MONOTONIC）+ pickle 的正文；收的一边收到后忙等到那个时刻。所以链路的单程时间 =
max(管道自己的单程时间, 延迟 + 字节 / 带宽)（one_way_s）。time.sleep 做不到 10 µs 量级（这台机器上 sleep(10e-6) 睡
65–83 µs），所以用忙等；10 µs 的链路只在模型时钟里算。
【进程】每个 worker 一个 BLAS 线程（学生自己设了环境变量的不动）；忽略 SIGINT（Ctrl-C 由父进程处理，它的 close()
结束孩子）；管道一关就退出：父进程被杀、被 SIGTERM 也不留孩子。一个 worker 死了，请求在限定时间里以 WorkerDied
结束（说是哪个 worker），另一个也被关掉。
"""
import os
import pickle
import signal
import struct
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
for _p in (_HERE,) + tuple(os.path.join(_HERE, "..", d) for d in ("lecture01", "lecture02", "lecture06")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import multiprocessing as mp  # noqa: E402
from multiprocessing.connection import wait  # noqa: E402

import numpy as np  # noqa: E402

from decode_lab import (_check_generation, _finish, _stop_set, _stopped, adjust, residual_distribution,  # noqa: E402
                        verify_chain)
from distinct_lab import topk_candidates, topk_draft_verify  # noqa: E402
from transformer_lab import sample_inverse_cdf  # noqa: E402
from worker_lab import BLAS_VARS, WorkerDied  # noqa: E402

__all__ = ["PROTOCOLS", "Link", "SplitPair", "split_speculative_generate", "measure_round_trip", "WorkerDied",
           "ID_BYTES", "COUNT_BYTES", "RNG_STATE_BYTES", "round_payload_bytes", "one_way_s", "modelled_round_s"]

PROTOCOLS = ("point_mass", "lazy_q", "full_q")
ID_BYTES = 4            # 一个 token id：int32（49,152 和 128k 的词表都放得下）
COUNT_BYTES = 4         # 接受的个数
RNG_STATE_BYTES = 32    # PCG64 的状态：128 位的状态 + 128 位的增量


# ---------------------------------------------------------------------------
# 链路
# ---------------------------------------------------------------------------
class Link:
    """
    管道的一头，加上链路的延迟和带宽；数每个方向的消息数、线上的字节（8 字节的交付时刻 + pickle 的正文）和
    有效载荷（_payload：token id 4 字节、标量和分布按 dtype、随机数发生器的状态 32 字节）。
    【交付】send 盖上"不早于"的时刻 t_发 + delay_s + 字节 / bytes_per_s（带宽：同一方向的消息排队，一条发完下一条才开始）；
    recv 收到之后忙等到那个时刻。bytes_per_s=None：只有管道自己的带宽。
    """

    def __init__(self, conn, delay_s=0.0, bytes_per_s=None):
        self.conn = conn
        self.configure(delay_s, bytes_per_s)

    def configure(self, delay_s=0.0, bytes_per_s=None):
        """换链路的参数、计数清零。【边界】延迟 < 0、带宽 ≤ 0：ValueError。"""
        _check_link(delay_s, bytes_per_s)
        self.delay_s, self.bytes_per_s, self.free_at = float(delay_s), bytes_per_s, 0.0
        self.sent = {"messages": 0, "bytes": 0, "payload": 0}
        self.received = {"messages": 0, "bytes": 0, "payload": 0}

    def send(self, obj):
        body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        n = len(body) + 8
        now = time.perf_counter()
        if self.bytes_per_s:
            self.free_at = max(now, self.free_at) + n / self.bytes_per_s
            due = self.free_at + self.delay_s
        else:
            due = now + self.delay_s
        self.conn.send_bytes(struct.pack("<d", due) + body)
        self.sent["messages"] += 1
        self.sent["bytes"] += n
        self.sent["payload"] += _payload(obj)

    def recv(self):
        data = self.conn.recv_bytes()
        (due,) = struct.unpack_from("<d", data)
        while time.perf_counter() < due:            # 忙等：time.sleep 的粒度比这里要模拟的延迟粗
            pass
        obj = pickle.loads(memoryview(data)[8:])
        self.received["messages"] += 1
        self.received["bytes"] += len(data)
        self.received["payload"] += _payload(obj)
        return obj


def _check_link(delay_s, bytes_per_s):
    if not (isinstance(delay_s, (int, float, np.floating, np.integer)) and not isinstance(delay_s, bool)
            and 0.0 <= delay_s < 10.0):
        raise ValueError(f"链路延迟 link_delay_s 必须是 [0, 10) 秒里的数（收到 {delay_s!r}）")
    if bytes_per_s is not None and not (isinstance(bytes_per_s, (int, float, np.floating, np.integer))
                                        and not isinstance(bytes_per_s, bool) and bytes_per_s > 0):
        raise ValueError(f"链路带宽 link_bytes_per_s 必须是正数（字节/秒）或 None（只有管道自己的），收到 {bytes_per_s!r}")


def _payload(obj):
    """一条消息的有效载荷（字节）：数组按 nbytes，整数（token、个数）4 字节，随机数发生器的状态 32 字节，标签和 None 不算。"""
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, dict):
        return RNG_STATE_BYTES
    if isinstance(obj, (tuple, list)):
        return sum(_payload(o) for o in obj)
    if isinstance(obj, (int, np.integer)) and not isinstance(obj, bool):
        return ID_BYTES
    return 0


def _echo(conn, delay_s, bytes_per_s):
    """量往返用的孩子：收到什么就原样发回去（回程同样的延迟和带宽）；管道关了就退出。"""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    link = Link(conn, delay_s, bytes_per_s)
    while True:
        try:
            link.send(link.recv())
        except (EOFError, OSError):
            return


def measure_round_trip(n=2000, delay_s=0.0, bytes_per_s=None, payload_ids=4, warmup=200):
    """
    父进程和一个 spawn 的孩子之间，经 Link 一来一回的时间 -> {"p50_s", "p90_s", "min_s", "n", "delay_s", "wire_bytes"}。
    消息是 payload_ids 个 int32 的 token id 加一个标签（和 point_mass 的一轮差不多大）；先来回 warmup 次不计。
    【边界】加了延迟 d 时每一程都不早于 d 交付，所以 min_s ≥ 2d（测试断言）。
    【命令】python3 -c "import sys; sys.path.insert(0, 'lecture05'); import split_worker_lab as s;
    print(s.measure_round_trip())"
    """
    if not (isinstance(n, (int, np.integer)) and n >= 1):
        raise ValueError(f"次数 n 必须是 ≥ 1 的整数（收到 {n!r}）")
    _check_link(delay_s, bytes_per_s)
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    p = ctx.Process(target=_echo, args=(b, delay_s, bytes_per_s), daemon=True)
    p.start()
    b.close()
    link = Link(a, delay_s, bytes_per_s)
    msg = ("v", np.arange(payload_ids, dtype=np.int32))
    ts = []
    try:
        for i in range(warmup + n):
            t0 = time.perf_counter()
            link.send(msg)
            link.recv()
            if i >= warmup:
                ts.append(time.perf_counter() - t0)
    finally:
        a.close()
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join(2)
    ts = np.asarray(ts)
    return {"p50_s": float(np.percentile(ts, 50)), "p90_s": float(np.percentile(ts, 90)), "min_s": float(ts.min()),
            "n": int(n), "delay_s": float(delay_s), "wire_bytes": link.sent["bytes"] // (warmup + n)}


# ---------------------------------------------------------------------------
# 两个 worker 的身体
# ---------------------------------------------------------------------------
def _build(recipe):
    from split_models_lab import build_split_model
    return build_split_model(recipe)


def _info(model):
    cfg = getattr(model, "cfg", None)
    vocab = cfg.vocab if cfg is not None else model.table.shape[-1]
    dtype = str(getattr(cfg, "dtype", "float64"))
    return {"pid": os.getpid(), "vocab": int(vocab), "dtype": dtype, "name": getattr(model, "name", "")}


def _wire_q(q, dtype):
    """q 按模型的 dtype 过链路：float64 原样；别的 dtype 舍入再归一化（草稿从这个 q 抽，接受率和残差也用它）。"""
    if dtype == "float64":
        return q
    r = q.astype(dtype).astype(np.float64)
    return r / r.sum()


def _argmax_chain_token(row):
    """点质量的草稿：和 tree_lab._grow_tree 一样，按 T = 1 的 log softmax 取第一名（并列时下标小的）。"""
    from tree_lab import _log_softmax
    return int(topk_candidates(_log_softmax(row), 1)[0])


class _Tape:
    """包着一个 Generator：记下最后一次 random() 之前的状态（lazy_q 在拒绝时把最后一个均匀数留给草稿那边）。"""

    def __init__(self, rng):
        self.rng, self.before = rng, None

    def random(self):
        self.before = self.rng.bit_generator.state
        return self.rng.random()


def _rng_from(state):
    g = np.random.default_rng()
    g.bit_generator.state = state
    return g


def _overlap_streams(seed):
    """重叠时的两条随机数流 -> (草稿的, 目标的)：SeedSequence(seed).spawn(2) 的第 0、1 条（同 overlap_spec_lab）。"""
    sd, st = np.random.SeedSequence(seed).spawn(2)
    return np.random.default_rng(sd), np.random.default_rng(st)


def _parent_gone(ctrl):
    """父进程的管道关了吗（请求进行中每轮看一次：父进程死了就别再算下去）。"""
    try:
        if ctrl.poll():
            ctrl.recv()
    except (EOFError, OSError):
        return True
    return False


def _draft_request(model, dtype, link, ctrl, a):
    """草稿那边跑一个请求（它决定什么时候结束）-> (新 token 的 list, 统计)。"""
    gamma, T, protocol, overlap = a["gamma"], a["T"], a["protocol"], a["overlap"]
    stop = _stop_set(a["stop"])
    seq = _check_generation(a["prompt"], a["n_new"], [model], gamma)
    n0, n_new = len(seq), a["n_new"]
    sess = model.session()
    rng = _overlap_streams(a["seed"])[0] if overlap else np.random.default_rng(a["seed"])
    timed = a["timed"]
    t_draft = t_wait = 0.0
    rounds, accepted, pending = 0, [], []

    def draft_chain(base):                  # base：已确定的序列（+ 还在验证的草稿）-> (γ 个草稿, 它们的 q)
        drafts, qs = [], []
        for _ in range(gamma):
            row = sess.logits(base + drafts)[-1]
            if protocol == "point_mass":
                drafts.append(_argmax_chain_token(row))
            else:
                q = _wire_q(adjust(row, T), dtype)
                drafts.append(int(sample_inverse_cdf(q, rng.random())))
                qs.append(q)
        return drafts, qs

    def message(drafts, qs):
        ids = np.asarray(drafts, dtype=np.int32)
        state = None if (overlap or protocol == "point_mass") else rng.bit_generator.state
        if protocol == "full_q":
            return ("v", list(pending), ids, np.stack(qs).astype(dtype), state)
        if protocol == "lazy_q":
            return ("v", list(pending), ids, np.asarray([q[x] for q, x in zip(qs, drafts)], dtype=dtype), state)
        return ("v", ids)

    t0 = time.perf_counter()
    drafts, qs = draft_chain(seq)
    t_draft += time.perf_counter() - t0
    while True:
        if _parent_gone(ctrl):
            raise SystemExit(0)
        link.send(message(drafts, qs))
        pending = []
        rounds += 1
        pre = None
        if overlap:                         # 目标验证的时候，假设全部接受，接着草稿 γ 个
            t0 = time.perf_counter()
            pre = draft_chain(seq + drafts)
            t_draft += time.perf_counter() - t0
        t0 = time.perf_counter()
        reply = link.recv()
        t_wait += time.perf_counter() - t0
        if reply[0] == "err":
            raise ValueError(reply[1])
        _, n, tok, p_n, state = reply
        accepted.append(n)
        if state is not None:
            if overlap:
                t_rng = _rng_from(state)
            else:
                rng.bit_generator.state = state
        if tok is None:                     # lazy_q 的拒绝：p_n 过来了，这边抽修正 token
            g = t_rng if overlap else rng
            tok = int(sample_inverse_cdf(residual_distribution(p_n, qs[n]), g.random()))
            pending = [tok] if not overlap else [tok, g.bit_generator.state]
        if overlap and n == gamma and tok < 0:   # 全部接受：不抽额外的 token，预先草稿的就是下一轮的草稿
            seq += drafts
        else:
            seq += drafts[:n] + [tok]
        if len(seq) - n0 >= n_new or _stopped(seq, n0, stop):
            break
        t0 = time.perf_counter()
        if overlap and n == gamma and tok < 0:
            drafts, qs = pre
        else:
            sess.truncate(len(seq) - 1)
            drafts, qs = draft_chain(seq)
        t_draft += time.perf_counter() - t0
    stats = {"rounds": rounds, "accepted": accepted, "to_target": dict(link.sent), "to_draft": dict(link.received)}
    if timed:
        stats["draft_s"], stats["wait_s"] = t_draft, t_wait
    return [int(t) for t in _finish(seq, n0, n_new, stop)], stats


def _draft_main(ctrl, link_conn, recipe):
    """草稿 worker：建模型，回答 ready；然后每条 ("run", 参数) 跑一个请求，回答 ("ok", (token, 统计))。管道关了就退出。"""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    model = _build(recipe)
    info = _info(model)
    link = Link(link_conn)
    ctrl.send(("ok", info))
    while True:
        try:
            op, args = ctrl.recv()
        except (EOFError, OSError):
            return
        try:
            if op != "run":
                raise ValueError(f"不认识的消息 {op!r}")
            link.configure(args["link_delay_s"], args["link_bytes_per_s"])
            res = _draft_request(model, info["dtype"], link, ctrl, args)
            ctrl.send(("ok", res))
        except (EOFError, OSError):          # 链路断了：目标不在了（父进程看它的 sentinel 说是哪个）
            try:
                ctrl.send(("err", "LinkClosed", "链路断了"))
            except OSError:
                return
        except Exception as e:
            ctrl.send(("err", type(e).__name__, str(e)))


class _TargetState:
    """目标那边一个请求的状态：已确定的序列（它知道的部分）、会话、随机数发生器。"""

    def __init__(self, model, a):
        self.a, self.model, self.error = a, model, None
        try:
            self.seq = _check_generation(a["prompt"], a["n_new"], [model], a["gamma"])
        except ValueError as e:
            self.error = str(e)
        self.sess = model.session()
        self.t_verify = 0.0
        if a["overlap"]:
            self.rng = _overlap_streams(a["seed"])[1]
        elif a["protocol"] == "point_mass":
            self.rng = np.random.default_rng(a["seed"])
        else:
            self.rng = None                 # 状态跟着草稿的消息来

    def verify(self, msg):
        """一条草稿消息 -> 回答 ("r", 接受的个数 n, token 或 None, p_n 或 None, 随机数状态或 None)。"""
        a = self.a
        gamma, T, protocol, overlap = a["gamma"], a["T"], a["protocol"], a["overlap"]
        if protocol == "point_mass":
            pending, drafts, qpart, state = [], msg[1], None, None
        else:
            _, pending, drafts, qpart, state = msg
            if overlap and pending:         # lazy_q 重叠：草稿那边抽过修正 token，目标流的状态跟着回来
                pending, state = pending[:1], pending[1]
        drafts = [int(x) for x in drafts]
        if state is not None:
            self.rng = _rng_from(state) if self.rng is None else self.rng
            self.rng.bit_generator.state = state
        self.seq += pending
        L = len(self.seq)
        ps = adjust(self.sess.logits(self.seq + drafts)[-(gamma + 1):], T)
        rng = self.rng
        p_n, tok = None, None
        if protocol == "point_mass":
            n = 0
            while n < gamma:
                i, tok = topk_draft_verify(ps[n], [drafts[n]], rng)
                if i < 0:
                    break
                n += 1
            if n == gamma:
                tok = -1 if overlap else int(sample_inverse_cdf(ps[gamma], rng.random()))
        else:
            if protocol == "full_q":
                qs = qpart.astype(np.float64)
            else:                           # lazy_q：只有 q_i(x_i)；放进全 0 的行里，verify_chain 只读这一格
                qs = np.zeros((gamma, ps.shape[-1]))
                qs[np.arange(gamma), drafts] = qpart
            tape = _Tape(rng)
            n, tok = verify_chain(ps, qs, drafts, tape)
            if n == gamma and overlap:      # 重叠、全部接受：额外的 token 不抽（预先草稿的第一个对着 p_{γ+1} 验证）
                rng.bit_generator.state = tape.before
                tok = -1
            elif n < gamma and protocol == "lazy_q":
                rng.bit_generator.state = tape.before   # 最后一个均匀数留给草稿那边抽修正 token
                p_n, tok = ps[n].astype(self.a["dtype"]), None
        if n == gamma and overlap:
            self.seq += drafts
        else:
            self.seq += drafts[:n] + ([tok] if tok is not None else [])
        self.sess.truncate(len(self.seq) - (0 if tok is None else 1))   # 最后一个 token 下一轮再喂
        send_state = None
        if protocol != "point_mass" and (not overlap or p_n is not None):
            send_state = rng.bit_generator.state
        return ("r", n, tok, p_n, send_state)


def _target_main(ctrl, link_conn, recipe):
    """目标 worker：建模型，回答 ready；("run", 参数) 开一个请求，之后链路上每条草稿消息验证一次、回答；
    ("end", None) 结束请求、回答统计。管道关了就退出。"""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    model = _build(recipe)
    info = _info(model)
    link = Link(link_conn)
    ctrl.send(("ok", info))
    st = None
    while True:
        try:
            ready = wait([ctrl, link_conn])
            if link_conn in ready and st is not None:
                msg = link.recv()
                t0 = time.perf_counter()
                try:
                    if st.error is not None:
                        raise ValueError(st.error)
                    reply = st.verify(msg)
                except Exception as e:
                    st.error = st.error or f"{type(e).__name__}: {e}"
                    reply = ("err", f"目标那边：{st.error}")
                st.t_verify += time.perf_counter() - t0
                link.send(reply)
                continue
            if ctrl not in ready:
                link.recv()                 # 请求之外来的消息（不该有）：丢掉
                continue
            op, args = ctrl.recv()
        except (EOFError, OSError):
            return
        if op == "run":
            link.configure(args["link_delay_s"], args["link_bytes_per_s"])
            st = _TargetState(model, dict(args, dtype=info["dtype"]))
            ctrl.send(("ok", None))
        elif op == "end":
            res = {"verify_s": st.t_verify} if st is not None else {}
            st = None
            ctrl.send(("ok", res))
        else:
            ctrl.send(("err", "ValueError", f"不认识的消息 {op!r}"))


# ---------------------------------------------------------------------------
# 父进程
# ---------------------------------------------------------------------------
def _spawn(ctx, main, args):
    """spawn 一个孩子，一个 BLAS 线程（学生自己设了的环境变量不动，同 worker_lab.start_worker）。"""
    set_here = [v for v in BLAS_VARS if v not in os.environ]
    for v in set_here:
        os.environ[v] = "1"
    try:
        p = ctx.Process(target=main, args=args, daemon=True)
        p.start()
    finally:
        for v in set_here:
            os.environ.pop(v, None)
    return p


def _check_request(prompt, n_new, gamma, T, seed, protocol, overlap, delay_s, bytes_per_s):
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol 只能是 {PROTOCOLS} 之一（收到 {protocol!r}）")
    if not (isinstance(gamma, (int, np.integer)) and not isinstance(gamma, bool) and gamma >= 1):
        raise ValueError(f"num_speculative_tokens 必须是 ≥ 1 的整数（收到 {gamma!r}）")
    if not (isinstance(T, (int, float, np.floating, np.integer)) and not isinstance(T, bool) and T >= 0):
        raise ValueError(f"温度 T 必须是 ≥ 0 的数（收到 {T!r}）")
    if not (isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and seed >= 0):
        raise ValueError(f"seed 必须是 ≥ 0 的整数（收到 {seed!r}）")
    if not isinstance(overlap, bool):
        raise ValueError(f"overlap 必须是 True 或 False（收到 {overlap!r}）")
    if not (isinstance(n_new, (int, np.integer)) and not isinstance(n_new, bool) and n_new >= 1):
        raise ValueError(f"n_new 必须是 ≥ 1 的整数（收到 {n_new!r}）")
    _check_link(delay_s, bytes_per_s)
    return [int(t) for t in np.asarray(prompt).ravel()]


class SplitPair:
    """
    一个草稿 worker 和一个目标 worker，中间一条链路（管道），父进程和每个 worker 各一条控制管道。
    .draft_info、.target_info：{"pid", "vocab", "dtype", "name"}；.procs：两个进程（草稿、目标）。
    generate(...)：一个请求（参数同 split_speculative_generate）。close()、with：结束两个进程。
    【边界】配方不是字符串：ValueError（不起进程）；一个 worker 在 timeout 秒里没回答或不在了：WorkerDied，两个都关掉。
    """

    def __init__(self, draft_recipe, target_recipe, timeout=120.0):
        for what, r in (("draft_recipe", draft_recipe), ("target_recipe", target_recipe)):
            if not isinstance(r, str) or not r:
                raise ValueError(f"{what} 必须是 split_models_lab.build_split_model 认识的配方字符串（收到 {r!r}）")
        self.timeout, self.closed = float(timeout), False
        ctx = mp.get_context("spawn")
        ld, lt = ctx.Pipe()
        self.ctrl, child = [], []
        for _ in range(2):
            a, b = ctx.Pipe()
            self.ctrl.append(a)
            child.append(b)
        self.procs = [_spawn(ctx, _draft_main, (child[0], ld, draft_recipe)),
                      _spawn(ctx, _target_main, (child[1], lt, target_recipe))]
        for c in child + [ld, lt]:           # 父进程不留链路的两头：一个 worker 死了，另一个才收得到 EOF
            c.close()
        self.names = ["草稿 worker", "目标 worker"]
        try:
            self.draft_info = self._recv(0)
            self.target_info = self._recv(1)
        except BaseException:
            self.close()
            raise
        if self.draft_info["vocab"] != self.target_info["vocab"]:
            v = (self.draft_info["vocab"], self.target_info["vocab"])
            self.close()
            raise ValueError(f"草稿和目标的词表不一样大（{v[0]} 和 {v[1]}）：投机解码要同一个词表")

    def _dead(self):
        for i, p in enumerate(self.procs):
            if not p.is_alive():
                return i
        return None

    def _fail(self, i, why):
        name = self.names[i]
        pid, code = self.procs[i].pid, self.procs[i].exitcode
        self.close()
        raise WorkerDied(f"{name}（pid {pid}）{why}（退出码 {code}）；请求失败，两个 worker 都已关掉")

    def _recv(self, i):
        """等 worker i 的回答；哪个 worker 先不在了就说是哪个。"""
        conn = self.ctrl[i]
        ready = wait([conn] + [p.sentinel for p in self.procs], self.timeout)
        if conn in ready:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                msg = None
            if msg is not None and not (msg[0] == "err" and msg[1] == "LinkClosed"):
                if msg[0] == "err":
                    raise ValueError(f"{self.names[i]}：{msg[1]}: {msg[2]}")
                return msg[1]
        t_end = time.monotonic() + 2.0          # 链路断了或者 sentinel 先到：等一下，看是哪个进程退出了
        while time.monotonic() < t_end:
            d = self._dead()
            if d is not None:
                self._fail(d, "不在了")
            time.sleep(0.01)
        self._fail(i, f"{self.timeout} 秒没回答")

    def _send(self, i, op, args=None):
        try:
            self.ctrl[i].send((op, args))
        except (OSError, EOFError):
            d = self._dead()
            self._fail(i if d is None else d, "不在了")

    def generate(self, prompt, n_new, *, num_speculative_tokens, T, seed, protocol="lazy_q", overlap=False,
                 link_delay_s=0.0, link_bytes_per_s=None, stop=None, timed=False):
        """一个请求穿过这一对 worker -> (新 token 的 list, 统计)；统计见 split_speculative_generate。"""
        if self.closed:
            raise WorkerDied("这一对 worker 已经关掉了：再开一个 SplitPair")
        prompt = _check_request(prompt, n_new, num_speculative_tokens, T, seed, protocol, overlap, link_delay_s,
                                link_bytes_per_s)
        _stop_set(stop)
        args = {"prompt": prompt, "n_new": int(n_new), "gamma": int(num_speculative_tokens), "T": float(T),
                "seed": int(seed), "protocol": protocol, "overlap": overlap, "link_delay_s": float(link_delay_s),
                "link_bytes_per_s": link_bytes_per_s, "stop": stop, "timed": bool(timed)}
        t0 = time.perf_counter()
        self._send(1, "run", args)
        self._recv(1)
        self._send(0, "run", args)
        err = None
        try:
            toks, st = self._recv(0)
        except ValueError as e:
            err = e
        wall = time.perf_counter() - t0
        self._send(1, "end")
        tst = self._recv(1)
        if err is not None:
            raise err
        stats = {"protocol": protocol, "overlap": overlap, "num_speculative_tokens": int(num_speculative_tokens),
                 "rounds": st["rounds"], "accepted": st["accepted"],
                 "messages_to_target": st["to_target"]["messages"], "messages_to_draft": st["to_draft"]["messages"],
                 "bytes_to_target": st["to_target"]["bytes"], "bytes_to_draft": st["to_draft"]["bytes"],
                 "payload_to_target": st["to_target"]["payload"], "payload_to_draft": st["to_draft"]["payload"]}
        if timed:
            stats.update(wall_s=wall, draft_s=st["draft_s"], wait_s=st["wait_s"], verify_s=tst.get("verify_s", 0.0))
        return toks, stats

    def close(self):
        """关控制管道（worker 收到 EOF 就退出）、等它们；5 秒还不走就 terminate，再不走就 kill。"""
        self.closed = True
        for c in self.ctrl:
            try:
                c.close()
            except OSError:
                pass
        for p in self.procs:
            p.join(5.0)
            if p.is_alive():
                p.terminate()
                p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join(2.0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def split_speculative_generate(draft_recipe, target_recipe, prompt, n_new, *, num_speculative_tokens, T, seed,
                               protocol="lazy_q", overlap=False, link_delay_s=0.0, link_bytes_per_s=None, stop=None,
                               timed=False):
    """
    一个请求穿过一个草稿 worker 和一个目标 worker -> (新 token 的 list, 统计)。起一对 worker、跑完、关掉（很多请求用 SplitPair）。

    统计：rounds（轮数 = 目标前向的次数）、accepted（每轮接受的个数）、messages_to_target / messages_to_draft
    （链路上每个方向的消息数：每轮各一条）、bytes_to_target / bytes_to_draft（线上的字节：交付时刻 8 字节 + pickle 的正文）、
    payload_to_target / payload_to_draft（有效载荷：token id 4 字节、q 和 p 按 dtype、随机数状态 32 字节，
    round_payload_bytes 是它的公式）；timed=True 时再加 wall_s（父进程看到的整个请求）、draft_s（草稿在算）、
    wait_s（草稿在等回答）、verify_s（目标在算）——墙钟，不进默认的输出。
    【参数】num_speculative_tokens = γ（vLLM 的 speculative_config 的键名）；protocol、overlap 见模块说明；
    link_delay_s：链路的单程延迟（秒，交付时刻的忙等）；link_bytes_per_s：链路带宽（None = 只有管道自己的）；
    stop：停止 token，规则同 decode_lab.speculative_generate。
    【边界】参数不合规矩：ValueError（起进程之前就查）；提示太长等模型那边查出的错：ValueError（说是哪个 worker）；
    worker 死了：WorkerDied。
    """
    _check_request(prompt, n_new, num_speculative_tokens, T, seed, protocol, overlap, link_delay_s, link_bytes_per_s)
    with SplitPair(draft_recipe, target_recipe) as pair:
        return pair.generate(prompt, n_new, num_speculative_tokens=num_speculative_tokens, T=T, seed=seed,
                             protocol=protocol, overlap=overlap, link_delay_s=link_delay_s,
                             link_bytes_per_s=link_bytes_per_s, stop=stop, timed=timed)


# ---------------------------------------------------------------------------
# 模型时钟：一轮的字节和时间
# ---------------------------------------------------------------------------
def round_payload_bytes(protocol, gamma, vocab, itemsize=8, *, rejected, overlap=False):
    """
    一轮在链路上的有效载荷 -> (草稿 → 目标, 目标 → 草稿) 字节（SplitPair 的 payload_* 逐轮加起来就是它，测试断言）。

    【推导】token id 4 字节、接受的个数 4 字节、q 和 p 每个数 itemsize 字节、PCG64 的状态 32 字节：
    - point_mass：γ 个 id 过去；个数 + 1 个 token 回来（重叠、全部接受时回来的 token 是 −1 占位，一样 4 字节）；
    - full_q：γ 个 id + γ·V 个 q（+ 状态）过去；个数 + token（+ 状态）回来；
    - lazy_q：γ 个 id + γ 个 q_i(x_i)（+ 状态）过去；全部接受时个数 + token（+ 状态）回来，拒绝时个数 + V 个 p_n + 状态回来，
      修正 token 和（重叠时）状态搭下一轮过去，算在这一轮里。
    overlap=False 时状态每条消息都带（一个发生器来回走）；overlap=True 时两条流各在各的一边，只有 lazy_q 的拒绝让目标的
    流过来、再回去。
    【边界】protocol 不认识、γ 或 V 不是正整数：ValueError。
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
            COUNT_BYTES + vocab * itemsize + RNG_STATE_BYTES)


def one_way_s(nbytes, pipe_one_way_s, delay_s=0.0, link_bytes_per_s=None):
    """
    链路上一条 nbytes 字节的消息的单程时间（秒）= max(管道自己的单程, 延迟 + nbytes / 带宽)。

    【推导】Link 把交付时刻定在"发的时刻 + 延迟 + 字节 / 带宽"，消息先到了就忙等：两者取大的。管道自己的单程取量到的往返的
    一半（measure_round_trip 的中位数 / 2；大消息再加 nbytes / 管道的带宽，由调用者算进 pipe_one_way_s）。
    link_bytes_per_s=None：只有延迟。
    """
    wire = nbytes / link_bytes_per_s if link_bytes_per_s else 0.0
    return max(pipe_one_way_s, delay_s + wire)


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
