"""
link_lab —— 进程之间的一条链路：管道加上延迟和带宽（"不早于这个时刻交付"），数每个方向的消息、线上的字节和有效载荷；
量往返（measure_round_trip）；一条消息的单程时间（one_way_s）。

【交付】一条消息 = 8 字节的交付时刻（发的一边的 time.perf_counter() + 延迟 + 字节 / 带宽；两个进程在同一台 Linux 上
读同一个 CLOCK_MONOTONIC）+ pickle 的正文；收的一边收到后等到那个时刻。所以单程时间 = max(管道自己的单程时间,
延迟 + 字节 / 带宽)。time.sleep 做不到 10 µs 量级（这台机器上 sleep(10e-6) 睡 65–83 µs），所以最后一段忙等；
10 µs 的链路只在模型时钟里算（split_clock_lab）。
【有效载荷】token id 4 字节（int32：49,152 和 128k 的词表都放得下）、接受的个数 4 字节、数组按 nbytes（q、p 按 dtype）、
随机数发生器的状态 32 字节（PCG64：128 位的状态 + 128 位的增量）；线上的字节另算（pickle 的框架、状态的 dict 的键名）。
"""
import multiprocessing as mp
import pickle
import signal
import struct
import time

import numpy as np

__all__ = ["Link", "measure_round_trip", "one_way_s", "ID_BYTES", "COUNT_BYTES", "RNG_STATE_BYTES", "TapeRng",
           "rng_from_state"]

ID_BYTES = 4            # 一个 token id：int32
COUNT_BYTES = 4         # 接受的个数
RNG_STATE_BYTES = 32    # PCG64 的状态：128 位的状态 + 128 位的增量


class TapeRng:
    """包着一个 Generator：记下最后一次 random() 之前的状态（split_worker_lab 的 lazy_q 在拒绝时把最后一个均匀数
    连同这个状态送回草稿那边）。"""

    def __init__(self, rng):
        self.rng, self.before = rng, None

    def random(self):
        self.before = self.rng.bit_generator.state
        return self.rng.random()


def rng_from_state(state):
    """从链路上收到的 bit_generator.state 重建一个 Generator（随机数发生器的状态跟着消息走）。"""
    g = np.random.default_rng()
    g.bit_generator.state = state
    return g


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
        _wait_until(due)
        obj = pickle.loads(memoryview(data)[8:])
        self.received["messages"] += 1
        self.received["bytes"] += len(data)
        self.received["payload"] += _payload(obj)
        return obj


def _wait_until(due):
    """等到 time.perf_counter() ≥ due：离得远（> 0.3 ms）先睡到差 0.2 ms，剩下的忙等（time.sleep 会多睡 65–83 µs，
    只用它睡掉大头，交付的时刻由忙等定）。"""
    left = due - time.perf_counter()
    if left > 3e-4:
        time.sleep(left - 2e-4)
    while time.perf_counter() < due:
        pass


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


def one_way_s(nbytes, pipe_one_way_s, delay_s=0.0, link_bytes_per_s=None):
    """
    链路上一条 nbytes 字节的消息的单程时间（秒）= max(管道自己的单程, 延迟 + nbytes / 带宽)。

    【推导】Link 把交付时刻定在"发的时刻 + 延迟 + 字节 / 带宽"，消息先到了就忙等：两者取大的。管道自己的单程取量到的往返的
    一半（measure_round_trip 的中位数 / 2；大消息再加 nbytes / 管道的带宽，由调用者算进 pipe_one_way_s）。
    link_bytes_per_s=None：只有延迟。
    """
    wire = nbytes / link_bytes_per_s if link_bytes_per_s else 0.0
    return max(pipe_one_way_s, delay_s + wire)
