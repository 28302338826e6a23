"""
block_manager_lab —— 分页的 KV 块：一个固定大小的块池（空闲表 + 引用计数）、每个序列一张块表、自动前缀缓存。

【块池】BlockPool：n 块，每块有一个引用计数；空闲表按"最近最少用"排（最早放回的在前）。take() 从空闲表头拿一块，
incref / decref 改计数，计数降到 0 的块放回空闲表尾。paging_lab 的模拟（lecture05/07）和引擎用同一个块池。
【前缀缓存】（vLLM 的 automatic prefix caching；nano-vllm 的 compute_hash(token_ids, prev_hash)）：一个写满的块用
"父块的键 + 本块的 token"算一个键（链式哈希：键相同就说明整个前缀大概率相同）。本 lab 命中时还要**核对**：这块存的
token 和父块都必须和请求的一样，所以哈希碰撞永远不会把别的提示的 KV 交出去（测试用一个只有 4 个值的哈希强行碰撞）。
核对是一种选择，各家不一样：
  - nano-vllm（nanovllm/engine/block_manager.py，commit 2f352ae）：键是 xxh64(父块的键, 本块的 token)，命中时比较块里
    存的 token（不比父块）。
  - vLLM V1 早期（vllm/v1/core/kv_cache_utils.py 的 BlockHashType，v0.7–v0.8 前后）：键是 (哈希值, 本块的 token,
    额外的键) 这个三元组，查表时 token 和额外的键也要相等，哈希值撞了也不会错拿。
  - vLLM V1 现在（同一个文件，commit 001cabc；vllm/config/cache.py，commit 002f10e）：键只有一个哈希值 =
    hash_fn((父块的哈希, 本块的 token, 额外的键))，额外的键是 LoRA、多模态输入、cache salt 等；hash_fn 由
    --prefix-caching-hash-algo 选：sha256（默认，pickle 序列化）、sha256_cbor、xxhash（128 位）、xxhash_cbor；
    第一块的父哈希是每个进程随机的 NONE_HASH（设了 PYTHONHASHSEED 时由它算）。命中时不比较 token，靠哈希本身够强。
引用计数降到 0 的缓存块仍留在空闲表里、仍能命中；要新块时从表头（最久没用的）拿，拿走时才从缓存里删掉。
所以 num_free_blocks 把它们算作空闲：所有请求都结束后，每一块都空闲。
【预留】（解耦：decode 那边先为一个要交过来的请求留好块，SGLang 的 PD 流程）reserve(n_tokens) -> Reservation：
从空闲表拿够放 n_tokens 个 token 的块（计数 1，不在任何请求的块表里，所以永远不会被挤出）；cancel(r) 还回去；
LLMEngine.import_request(h, r) 把它们用作那个请求的块表。
【出处】Kwon et al., SOSP 2023（PagedAttention）；vLLM 文档 "Automatic Prefix Caching"；nano-vllm engine/block_manager.py。
"""
import numpy as np

__all__ = ["BlockPool", "BlockManager", "Reservation", "chain_hash", "blocks_for"]


def blocks_for(n_tokens, block_size):
    """放 n_tokens 个 token 要几块（向上取整）。"""
    return -(-int(n_tokens) // block_size)


def chain_hash(parent_key, token_ids):
    """一个满块的键 = hash((父块的键, 本块的 token))；第一块的父键是 None。Python 的 hash 对整数元组是确定的。"""
    return hash((parent_key, tuple(token_ids)))


class BlockPool:
    """
    固定的 n_blocks 块：ref[i] = 块 i 的引用计数；空闲表 = 计数为 0 的块，按放回的先后排（最早放回的在前）。

    【做法】空闲表是一个只往尾部追加、从头部取的队列（numpy 数组），每个条目带一个"戳"：块每放回一次换一个新戳。
    一个条目有效 = 块的计数是 0 且戳是它最新的戳。缓存命中的空闲块计数从 0 变 1（incref）时不用从队列中间删掉它：
    它的条目自动失效，取块时跳过（惰性删除）。所以取、放都是整批的数组运算：paging_lab 的模拟一次要分几十万块。
    【不变式】num_free = 计数为 0 的块数 = 队列里有效条目的个数；check() 断言它。
    on_evict(i)：从空闲表拿走一块去重新用之前调用（前缀缓存用它把这块从缓存里删掉）。
    """

    def __init__(self, n_blocks, on_evict=None):
        if not (isinstance(n_blocks, (int, np.integer)) and not isinstance(n_blocks, bool) and n_blocks >= 1):
            raise ValueError(f"块数必须是 ≥ 1 的整数（收到 {n_blocks!r}）")
        n = self.n_blocks = int(n_blocks)
        self.ref = np.zeros(n, dtype=np.int64)
        self._stamp = np.zeros(n, dtype=np.int64)          # 每块最新的戳
        self._q = np.zeros(2 * n, dtype=np.int64)          # 队列：块号
        self._qs = np.zeros(2 * n, dtype=np.int64)         # 队列：条目的戳
        self._q[:n] = np.arange(n)
        self._head, self._tail, self._clock = 0, n, 0
        self.num_free = n
        self.on_evict = on_evict

    def _push(self, ids):  # 计数刚变成 0 的块，按顺序追加到队尾
        k = len(ids)
        if self._tail + k > len(self._q):                  # 先挤掉已经取走的头部；还不够就加倍
            live = slice(self._head, self._tail)
            m = self._tail - self._head
            cap = max(len(self._q), 2 * (m + k))
            q, qs = np.zeros(cap, dtype=np.int64), np.zeros(cap, dtype=np.int64)
            q[:m], qs[:m] = self._q[live], self._qs[live]
            self._q, self._qs, self._head, self._tail = q, qs, 0, m
        stamps = self._clock + 1 + np.arange(k)
        self._clock += k
        self._stamp[ids] = stamps
        self._q[self._tail:self._tail + k] = ids
        self._qs[self._tail:self._tail + k] = stamps
        self._tail += k
        self.num_free += k

    def take_many(self, k):
        """从空闲表头拿 k 块（计数设为 1）-> 块号的数组。【边界】空闲块不够：RuntimeError（调用者应先看 num_free）。"""
        if k > self.num_free:
            raise RuntimeError(f"块池只剩 {self.num_free} 块，要 {k} 块：调用者应先检查 num_free（这是代码的错）")
        got = []
        need = k
        while need > 0:
            seg = slice(self._head, self._head + need)
            ids, st = self._q[seg], self._qs[seg]
            self._head += need
            ok = ids[(self.ref[ids] == 0) & (self._stamp[ids] == st)]
            got.append(ok)
            need -= len(ok)
        out = np.concatenate(got) if len(got) > 1 else got[0]
        if self.on_evict is not None:
            for i in out:
                self.on_evict(int(i))
        self.ref[out] = 1
        self.num_free -= k
        return out

    def take(self):
        """从空闲表头拿一块 -> 块号。"""
        return int(self.take_many(1)[0])

    def incref(self, i):
        """多一个用户；计数从 0 变 1 的块（缓存命中的空闲块）离开空闲表（它的条目失效）。"""
        if self.ref[i] == 0:
            self.num_free -= 1
        self.ref[i] += 1

    def decref_many(self, ids):
        """
        ids 里的每一块各少一个用户；计数降到 0 的按给的顺序放回空闲表尾。

        【边界】计数已经是 0：RuntimeError（重复释放）。ids 里不能有重复的块（一个用户对一块只持一个引用）。
        """
        ids = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids, dtype=np.int64)
        if not len(ids):
            return
        if np.any(self.ref[ids] <= 0):
            bad = [int(i) for i in ids if self.ref[i] <= 0]
            raise RuntimeError(f"块 {bad} 的引用计数已经是 0：重复释放（这是代码的错）")
        self.ref[ids] -= 1
        zero = ids[self.ref[ids] == 0]
        if len(zero):
            self._push(zero)

    def decref(self, i):
        self.decref_many([i])

    @property
    def free(self):
        """空闲表（块号的 list，表头 = 最久没用的）。"""
        ids, st = self._q[self._head:self._tail], self._qs[self._head:self._tail]
        return [int(i) for i in ids[(self.ref[ids] == 0) & (self._stamp[ids] == st)]]

    def check(self):
        """不变式：空闲表里的块计数为 0、各出现一次，计数为 0 的块都在里面；num_free 对得上。"""
        f = self.free
        assert len(f) == len(set(f)) == self.num_free == int(np.sum(self.ref == 0)), "空闲表和计数对不上"
        assert np.all(self.ref >= 0)


class Reservation:
    """
    BlockManager.reserve 留下的块：blocks（块号的 list）、n_tokens（留的时候说要放几个 token）、active（用掉或取消
    之后是 False）。
    """
    __slots__ = ("blocks", "n_tokens", "active", "owner")

    def __init__(self, blocks, n_tokens, owner):
        self.blocks, self.n_tokens, self.active, self.owner = list(blocks), int(n_tokens), True, owner

    def __repr__(self):
        return f"Reservation({len(self.blocks)} 块, {self.n_tokens} token, active={self.active})"


class BlockManager:
    """
    引擎的块管理：一个 BlockPool + 每块的前缀缓存信息（键、token、父块）+ 键 -> 块号的表。

    序列（请求）对象要有 .block_table（块号的 list）和 .n_cached_blocks（它已登记进缓存的满块数）。
    【用法】进来时 match_prefix(token) 找命中的满块，can_allocate 看放不放得下，allocate 拿下命中块并补新块；
    每步之前 append_slots 补足这一步要写的块；每步之后 commit_full(req, tokens, n_computed) 把新写满的块登记进缓存；
    结束、中止、被挤出去时 free；投机解码一轮之后 truncate 把被拒绝的草稿用过的整块还回去。
    hash_fn(parent_key, token_ids)：默认 chain_hash；测试传一个只有几个值的哈希来强行碰撞。
    """

    def __init__(self, n_blocks, block_size, enable_prefix_caching=True, hash_fn=chain_hash):
        if not (isinstance(block_size, int) and not isinstance(block_size, bool) and block_size >= 1):
            raise ValueError(f"块大小必须是 ≥ 1 的整数（收到 {block_size!r}）")
        self.block_size, self.caching, self.hash_fn = block_size, bool(enable_prefix_caching), hash_fn
        self.pool = BlockPool(n_blocks, on_evict=self._evict)
        self.key = [None] * n_blocks          # 登记过的满块的键
        self.tokens = [None] * n_blocks       # 它的 token（核对用）
        self.parent = [None] * n_blocks       # 它的父块号（第一块是 -1）
        self.table = {}                       # 键 -> 块号
        self.hits = 0                         # 命中的块数（累计）
        self.collisions = 0                   # 键在表里、核对却不符的次数（哈希碰撞：没有被当成命中）

    @property
    def num_free_blocks(self):
        return self.pool.num_free

    def _evict(self, i):
        """块 i 要被重新用：从缓存里删掉（键只在指向它自己时删）。"""
        if self.key[i] is not None:
            if self.table.get(self.key[i]) == i:
                del self.table[self.key[i]]
            self.key[i] = self.tokens[i] = self.parent[i] = None

    def match_prefix(self, tokens):
        """
        tokens 开头已经缓存的满块 -> 块号的 list（按顺序）。最多 (len − 1) // block_size 块：最后一个 token 总要算
        （要它的 logits）。一块命中 = 键在表里，且那块存的 token 和父块都与请求的一致（碰撞不算命中）。
        """
        if not self.caching:
            return []
        bs, out, key, parent = self.block_size, [], None, -1
        for j in range((len(tokens) - 1) // bs):
            blk = tuple(tokens[j * bs:(j + 1) * bs])
            key = self.hash_fn(key, blk)
            i = self.table.get(key)
            if i is None:
                break
            if self.tokens[i] != blk or self.parent[i] != parent:
                self.collisions += 1
                break
            out.append(i)
            parent = i
        return out

    def can_allocate(self, hit_blocks, n_tokens):
        """拿下命中的块、再为 n_tokens 个 token 补新块，空闲块够不够。命中块里计数为 0 的本来算在空闲里，要扣掉。"""
        reuse_free = sum(1 for i in hit_blocks if self.pool.ref[i] == 0)
        need = blocks_for(n_tokens, self.block_size) - len(hit_blocks)
        return need + reuse_free <= self.pool.num_free

    def allocate(self, req, hit_blocks, n_tokens):
        """请求进来：拿下命中块（计数 +1），再补到能放 n_tokens 个 token 的块数。"""
        assert not req.block_table
        for i in hit_blocks:
            self.pool.incref(i)
        self.hits += len(hit_blocks)
        req.block_table = list(hit_blocks)
        req.n_cached_blocks = len(hit_blocks)
        self.append_slots(req, n_tokens)

    def slots_needed(self, req, n_tokens):
        """块表要放下 n_tokens 个 token 还差几块。"""
        return max(0, blocks_for(n_tokens, self.block_size) - len(req.block_table))

    def append_slots(self, req, n_tokens):
        """补块，使块表放得下 n_tokens 个 token。调用者先用 slots_needed 和 num_free_blocks 确认够。"""
        k = self.slots_needed(req, n_tokens)
        if k:
            req.block_table.extend(int(i) for i in self.pool.take_many(k))

    def commit_full(self, req, tokens, n_computed):
        """前 n_computed 个 token 的 KV 已写好：把其中新写满的块登记进缓存（键链接着上一块的键）。"""
        if not self.caching:
            return
        bs = self.block_size
        for j in range(req.n_cached_blocks, n_computed // bs):
            i = req.block_table[j]
            prev = req.block_table[j - 1] if j else -1
            blk = tuple(tokens[j * bs:(j + 1) * bs])
            key = self.hash_fn(self.key[prev] if j else None, blk)
            if self.key[i] is None:
                self.key[i], self.tokens[i], self.parent[i] = key, blk, prev
                self.table.setdefault(key, i)          # 同样内容已经有一块缓存着：留旧的（不去重）
            req.n_cached_blocks = j + 1

    def truncate(self, req, n_tokens):
        """
        只留放 n_tokens 个 token 要的块，后面整块还给块池（从尾到头）-> 还回去的块数。投机解码被拒绝的草稿用过的块：
        它们的槽里是作废的 KV，从没登记进前缀缓存（只登记确认过的满块），所以计数是 1、放回去就空闲。
        【边界】要截掉已经登记进缓存的块：RuntimeError（确认过的 token 不能截：这是代码的错）。
        """
        keep = blocks_for(n_tokens, self.block_size)
        if keep < req.n_cached_blocks:
            raise RuntimeError(f"要截到 {keep} 块，可前 {req.n_cached_blocks} 块已经登记进前缀缓存（这是代码的错）")
        extra = req.block_table[keep:]
        if extra:
            self.pool.decref_many(extra[::-1])
            del req.block_table[keep:]
        return len(extra)

    def free(self, req):
        """放掉请求的所有块（从尾到头：尾部的块先被挤掉，开头的共享前缀留得最久）。"""
        self.pool.decref_many(req.block_table[::-1])
        req.block_table = []
        req.n_cached_blocks = 0

    # ---- 预留（解耦：decode 那边先留块）----
    def reserve(self, n_tokens):
        """
        为一个还没到的请求留下放 n_tokens 个 token 的块 -> Reservation；空闲块现在不够：None（调用者稍后再试）。
        留下的块计数是 1、不在任何块表里：不会被挤出，也不算空闲（num_free_blocks 少了这么多块）。
        【边界】n_tokens 不是 ≥ 1 的整数，或整个块池都放不下：ValueError（永远留不成）。
        """
        if not (isinstance(n_tokens, (int, np.integer)) and not isinstance(n_tokens, bool) and n_tokens >= 1):
            raise ValueError(f"reserve 的 n_tokens 必须是 ≥ 1 的整数（收到 {n_tokens!r}）")
        k = blocks_for(n_tokens, self.block_size)
        if k > self.pool.n_blocks:
            raise ValueError(f"要留 {n_tokens} 个 token = {k} 块，整个块池只有 {self.pool.n_blocks} 块：永远留不成")
        if k > self.pool.num_free:
            return None
        return Reservation([int(i) for i in self.pool.take_many(k)], n_tokens, self)

    def cancel(self, reservation):
        """
        取消一个预留：它的块还回块池（已经用掉或取消过的：什么都不做）。
        【边界】不是这个块管理器留的：ValueError。
        """
        if not isinstance(reservation, Reservation) or reservation.owner is not self:
            raise ValueError(f"{reservation!r} 不是这个块管理器的预留")
        if reservation.active:
            reservation.active = False
            self.pool.decref_many(reservation.blocks[::-1])
