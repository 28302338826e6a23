"""
split_worker_lab —— 拆开的投机解码：草稿模型在一个进程里、目标模型在另一个进程里，每一轮的消息穿过两者之间的
一条链路（link_lab.Link：管道 + 可加的延迟和带宽）。

【外观】split_speculative_generate(draft_recipe, target_recipe, prompt, n_new, *, num_speculative_tokens, T, seed,
protocol="lazy_q", overlap=False, link_delay_s=0.0, link_bytes_per_s=None, stop=None, timed=False) -> (tokens, stats)；
多个请求用 SplitPair(draft_recipe, target_recipe).generate(...)。配方是字符串，两个进程各自 build_split_model。
【三种协议】（p = 目标、q = 草稿，同 decode_lab）
- "point_mass"：草稿取 argmax（vLLM V1 的 EAGLE / MTP）：γ 个 id 过去，接受的个数 + 1 个 token 回来；x 以概率 p(x)
  被接受（distinct_lab.topk_draft_verify）。随机数只在目标那边用。
- "lazy_q"：γ 个 id + γ 个标量 q_i(x_i) 过去；全部接受时回来个数 + 额外的 token；第一个拒绝的位置 n 上 **p_n 回到草稿
  那边**，草稿从 norm(max(0, p_n − q_n)) 抽修正 token（decode_lab.residual_distribution）：p_n 搭在本来就要回来的消息上，
  不多一次穿越；修正 token 搭下一轮的草稿过去。
- "full_q"：γ 个 id + γ × V 个 q 过去（朴素的做法，看它的代价）；目标那边就是 decode_lab.verify_chain。
q 和 p_n 以 float64 过去（adjust 的输出，草稿正是从它抽的）：float64 的模型就是模型的 dtype；float32 的模型也照样精确，
只是字节翻倍（按 float32 送就得让草稿从舍入、再归一化的 q 抽，这里没有做；split_clock_lab 的 itemsize 给 4 是它的字节数）。
【一个随机数发生器】overlap=False：一个 default_rng(seed)，状态跟着消息走（草稿抽完 → 目标；验证完 → 草稿），消耗顺序
和 decode_lab.speculative_generate 一样（每轮都草稿 γ 个，最后一轮也是）：full_q、lazy_q 逐 token 等于它；point_mass
等于 tree_lab.dynamic_tree_generate(…, budget=γ, top_k=1, depth=γ)。
【重叠】overlap=True：目标验证第 r 轮时，草稿假设全部接受、预先草稿 γ 个；进程内的参照是 overlap_spec_lab 的
overlap_speculative_generate（两条随机数流 SeedSequence(seed).spawn(2)，规则见那里），worker 这一对逐 token 等于它。
【进程】每个 worker 一个 BLAS 线程（学生设了的环境变量不动）；忽略 SIGINT（Ctrl-C 由父进程处理）；控制管道一关就退出
（父进程被杀、SIGTERM 也不留孩子）；一个 worker 死了，请求在限定时间里以 WorkerDied 结束（说是哪个），两个都关掉。
"""
import os
import signal
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
from link_lab import Link, TapeRng, _check_link, rng_from_state  # noqa: E402
from overlap_spec_lab import overlap_streams  # noqa: E402
from split_clock_lab import PROTOCOLS  # noqa: E402
from transformer_lab import sample_inverse_cdf  # noqa: E402
from worker_lab import BLAS_VARS, WorkerDied  # noqa: E402

__all__ = ["PROTOCOLS", "SplitPair", "split_speculative_generate", "WorkerDied"]


# ---------------------------------------------------------------------------
# 两个 worker 的身体
# ---------------------------------------------------------------------------
def _build(recipe):
    from split_models_lab import build_split_model
    return build_split_model(recipe)


def _info(model):
    cfg = getattr(model, "cfg", None)
    vocab = cfg.vocab if cfg is not None else model.table.shape[-1]
    return {"pid": os.getpid(), "vocab": int(vocab), "name": getattr(model, "name", ""),
            "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS")}


def _ready(ctrl, model):
    """建好了，告诉父进程（info）-> True；父进程在这之前就关了这一对（管道断了）-> False：安静地退出。"""
    try:
        return ctrl.send(("ok", _info(model))) or True
    except OSError:
        return False


def _point_mass_token(row, T, overlap):
    """点质量的草稿取第一名，和各自的参照一样算：不重叠时同 tree_lab._grow_tree（T = 1 的 log softmax 的前 1 名），
    重叠时同 overlap_spec_lab（argmax adjust(row, T)）。两者只在并列时可能不同。"""
    if overlap:
        return int(np.argmax(adjust(row, T)))
    from tree_lab import _log_softmax
    return int(topk_candidates(_log_softmax(row), 1)[0])


def _draft_request(model, link, ctrl, a):
    """草稿那边跑一个请求（它决定什么时候结束）-> (新 token 的 list, 统计)。"""
    gamma, T, protocol, overlap = a["gamma"], a["T"], a["protocol"], a["overlap"]
    stop = _stop_set(a["stop"])
    seq = _check_generation(a["prompt"], a["n_new"], [model], 2 * gamma if overlap else gamma)   # 预先草稿多 γ 个
    n0, n_new = len(seq), a["n_new"]
    sess = model.session()
    rng = overlap_streams(a["seed"])[0] if overlap else np.random.default_rng(a["seed"])
    t_wait, rounds, accepted, pending = 0.0, 0, [], []

    def draft_chain(base):                  # base：已确定的序列（+ 还在验证的草稿）-> (γ 个草稿, 它们的 q)
        drafts, qs = [], []
        for _ in range(gamma):
            row = sess.logits(base + drafts)[-1]
            if protocol == "point_mass":
                drafts.append(_point_mass_token(row, T, overlap))
            else:
                q = adjust(row, T)
                drafts.append(int(sample_inverse_cdf(q, rng.random())))
                qs.append(q)
        return drafts, qs

    def message(drafts, qs):
        ids = np.asarray(drafts, dtype=np.int32)
        state = None if (overlap or protocol == "point_mass") else rng.bit_generator.state
        if protocol == "full_q":
            return ("v", list(pending), ids, np.stack(qs), state)
        if protocol == "lazy_q":
            return ("v", list(pending), ids, np.asarray([q[x] for q, x in zip(qs, drafts)]), state)
        return ("v", ids)

    t0 = time.perf_counter()
    drafts, qs = draft_chain(seq)
    t_draft = time.perf_counter() - t0
    while True:
        if ctrl.poll():                     # 请求进行中父进程不发消息：可读 = 它的管道关了（父进程死了），别再算
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
                t_rng = rng_from_state(state)
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
    if a["timed"]:
        stats["draft_s"], stats["wait_s"] = t_draft, t_wait
    return [int(t) for t in _finish(seq, n0, n_new, stop)], stats


def _draft_main(ctrl, link_conn, recipe):
    """草稿 worker：建模型，回答 ready；然后每条 ("run", 参数) 跑一个请求，回答 ("ok", (token, 统计))。管道关了就退出。"""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    model = _build(recipe)
    link = Link(link_conn)
    if not _ready(ctrl, model):
        return
    while True:
        try:
            op, args = ctrl.recv()
        except (EOFError, OSError):
            return
        try:
            if op != "run":
                raise ValueError(f"不认识的消息 {op!r}")
            link.configure(args["link_delay_s"], args["link_bytes_per_s"])
            res = _draft_request(model, link, ctrl, args)
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
            self.seq = _check_generation(a["prompt"], a["n_new"], [model], a["gamma"] * (2 if a["overlap"] else 1))
        except ValueError as e:
            self.error = str(e)
        self.sess = model.session()
        self.t_verify = 0.0
        if a["overlap"]:
            self.rng = overlap_streams(a["seed"])[1]
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
            self.rng = rng_from_state(state) if self.rng is None else self.rng
            self.rng.bit_generator.state = state
        self.seq += pending
        L = len(self.seq)
        ps = adjust(self.sess.logits(self.seq + drafts)[-(gamma + 1):], T)
        rng = self.rng
        p_n, tok = None, None
        if protocol == "point_mass" and not overlap:   # 参照是 dynamic_tree_generate：distinct_lab 的点质量规则
            n = 0
            while n < gamma:
                i, tok = topk_draft_verify(ps[n], [drafts[n]], rng)
                if i < 0:
                    break
                n += 1
            if n == gamma:
                tok = int(sample_inverse_cdf(ps[gamma], rng.random()))
        else:
            if protocol == "full_q":
                qs = qpart
            else:                           # lazy_q：只有 q_i(x_i)，放进全 0 的行里（verify_chain 只读这一格）；
                qs = np.zeros((gamma, ps.shape[-1]))                # 点质量重叠：q = one-hot（同 overlap_spec_lab）
                qs[np.arange(gamma), drafts] = 1.0 if protocol == "point_mass" else qpart
            tape = TapeRng(rng)
            n, tok = verify_chain(ps, qs, drafts, tape)
            if n == gamma and overlap:      # 重叠、全部接受：额外的 token 不抽（预先草稿的第一个对着 p_{γ+1} 验证）
                rng.bit_generator.state = tape.before
                tok = -1
            elif n < gamma and protocol == "lazy_q":
                rng.bit_generator.state = tape.before   # 最后一个均匀数留给草稿那边抽修正 token
                p_n, tok = ps[n], None       # float64：残差要用目标验证时用的那个 p
        if n == gamma and overlap:
            self.seq += drafts
        else:
            self.seq += drafts[:n] + ([tok] if tok is not None else [])
        self.sess.truncate(len(self.seq) - (0 if tok is None else 1))   # 最后一个 token 下一轮再喂
        ship = protocol != "point_mass" and (not overlap or p_n is not None)     # 状态跟着回答回到草稿那边
        return ("r", n, tok, p_n, rng.bit_generator.state if ship else None)


def _target_main(ctrl, link_conn, recipe):
    """目标 worker：建模型，回答 ready；("run", 参数) 开一个请求，之后链路上每条草稿消息验证一次、回答；
    ("end", None) 结束请求、回答统计。管道关了就退出。"""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    model = _build(recipe)
    link = Link(link_conn)
    if not _ready(ctrl, model):
        return
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
            st = _TargetState(model, args)
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
    for name, v, lo in (("num_speculative_tokens", gamma, 1), ("seed", seed, 0), ("n_new", n_new, 1)):
        if not (isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= lo):
            raise ValueError(f"{name} 必须是 ≥ {lo} 的整数（收到 {v!r}）")
    if not isinstance(overlap, bool):
        raise ValueError(f"overlap 必须是 True 或 False（收到 {overlap!r}）")
    adjust(np.zeros(1), T)                  # T < 0：ValueError
    _check_link(delay_s, bytes_per_s)
    return [int(t) for t in np.asarray(prompt).ravel()]


class SplitPair:
    """
    一个草稿 worker 和一个目标 worker，中间一条链路（管道），父进程和每个 worker 各一条控制管道。
    .draft_info、.target_info：{"pid", "vocab", "name", "blas_threads"}；.procs：两个进程（草稿、目标）。
    generate(...)：一个请求（参数同 split_speculative_generate）。close()、with：结束两个进程。
    wait=False：起了两个进程就返回，不等它们建好模型（同 worker_lab.spawn_worker：调用的进程趁这段时间做别的事）；
    wait_ready() 等它们（generate 第一次也会等），之后才有 draft_info、target_info。
    【边界】配方不是字符串：ValueError（不起进程）；一个 worker 在 timeout 秒里没回答或不在了：WorkerDied，两个都关掉。
    """

    def __init__(self, draft_recipe, target_recipe, timeout=120.0, *, wait=True):
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
        self.ready = False
        if wait:
            self.wait_ready()

    def wait_ready(self):
        """等两个 worker 建好模型（它们的第一个回答）-> self；已经等过：直接返回。"""
        if self.ready:
            return self
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
        self.ready = True
        return self

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
        self.wait_ready()
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
                 "rounds": st["rounds"], "accepted": st["accepted"]}
        for side in ("to_target", "to_draft"):
            stats.update({f"{k}_{side}": st[side][k] for k in ("messages", "bytes", "payload")})
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
    一个请求穿过一个草稿 worker 和一个目标 worker -> (新 token 的 list, 统计)；起一对、跑完、关掉（多个请求用 SplitPair）。

    统计：rounds（轮数 = 目标前向的次数）、accepted（每轮接受的个数）；链路每个方向（_to_target、_to_draft）的 messages
    （每轮各一条）、bytes（线上：交付时刻 8 字节 + pickle 的正文）、payload（有效载荷，公式是
    split_clock_lab.round_payload_bytes）；timed=True 时再加墙钟 wall_s（整个请求）、draft_s（草稿在算）、wait_s（草稿在等）、
    verify_s（目标在算），不进默认的输出。
    【参数】num_speculative_tokens = γ（vLLM speculative_config 的键名）；link_delay_s：链路的单程延迟（秒）；
    link_bytes_per_s：链路带宽（None = 只有管道自己的）；stop：停止 token，同 decode_lab.speculative_generate。
    【边界】参数不合规矩：ValueError（起进程之前）；模型那边查出的错（提示太长……）：ValueError，说是哪个 worker；
    worker 死了：WorkerDied。
    """
    _check_request(prompt, n_new, num_speculative_tokens, T, seed, protocol, overlap, link_delay_s, link_bytes_per_s)
    with SplitPair(draft_recipe, target_recipe) as pair:
        return pair.generate(prompt, n_new, num_speculative_tokens=num_speculative_tokens, T=T, seed=seed,
                             protocol=protocol, overlap=overlap, link_delay_s=link_delay_s,
                             link_bytes_per_s=link_bytes_per_s, stop=stop, timed=timed)
