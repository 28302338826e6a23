"""
block_manager_lab —— 分页的 KV 块：一个固定大小的块池（空闲表 + 引用计数）、每个序列一张块表、自动前缀缓存。

【块池】BlockPool：n 块，每块有一个引用计数；空闲表按"最近最少用"排（最早放回的在前）。take() 从空闲表头拿一块，
incref / decref 改计数，计数降到 0 的块放回空闲表尾。paging_lab 的模拟（lecture05/07）和引擎用同一个块池。
【前缀缓存】（vLLM 的 automatic prefix caching；nano-vllm 的 compute_hash(token_ids, prev_hash)）：一个写满的块用
"父块的键 + 本块的 token"算一个键（链式哈希：键相同就说明整个前缀大概率相同）。命中时还要**核对**：这块存的 token
和父块都必须和请求的一样，所以哈希碰撞永远不会把别的提示的 KV 交出去（测试用一个只有 4 个值的哈希强行碰撞）。
引用计数降到 0 的缓存块仍留在空闲表里、仍能命中；要新块时从表头（最久没用的）拿，拿走时才从缓存里删掉。
所以 num_free_blocks 把它们算作空闲：所有请求都结束后，每一块都空闲。
【出处】Kwon et al., SOSP 2023（PagedAttention）；vLLM 文档 "Automatic Prefix Caching"；nano-vllm engine/block_manager.py。
"""
from collections import OrderedDict

__all__ = ["BlockPool", "BlockManager", "chain_hash", "blocks_for"]


def blocks_for(n_tokens, block_size):
    """放 n_tokens 个 token 要几块（向上取整）。"""
    return -(-int(n_tokens) // block_size)


def chain_hash(parent_key, token_ids):
    """一个满块的键 = hash((父块的键, 本块的 token))；第一块的父键是 None。Python 的 hash 对整数元组是确定的。"""
    return hash((parent_key, tuple(token_ids)))


class BlockPool:
    """
    固定的 n_blocks 块：ref[i] = 块 i 的引用计数；空闲表 = 计数为 0 的块，按放回的先后排（最早放回的在前）。

    【不变式】一块要么在空闲表里（计数 0），要么不在（计数 ≥ 1）；check() 断言它。
    on_evict(i)：从空闲表拿走一块去重新用之前调用（前缀缓存用它把这块从缓存里删掉）。
    """

    def __init__(self, n_blocks, on_evict=None):
        if not (isinstance(n_blocks, int) and not isinstance(n_blocks, bool) and n_blocks >= 1):
            raise ValueError(f"块数必须是 ≥ 1 的整数（收到 {n_blocks!r}）")
        self.n_blocks = n_blocks
        self.ref = [0] * n_blocks
        self.free = OrderedDict.fromkeys(range(n_blocks))   # 有序：表头 = 最久没用的
        self.on_evict = on_evict

    @property
    def num_free(self):
        return len(self.free)

    def take(self):
        """从空闲表头拿一块（计数设为 1）-> 块号。【边界】没有空闲块：RuntimeError（调用者应先看 num_free）。"""
        if not self.free:
            raise RuntimeError("块池空了：调用者应先检查 num_free（这是代码的错）")
        i, _ = self.free.popitem(last=False)
        if self.on_evict is not None:
            self.on_evict(i)
        self.ref[i] = 1
        return i

    def incref(self, i):
        """多一个用户；计数从 0 变 1 的块（缓存命中的空闲块）离开空闲表。"""
        if self.ref[i] == 0:
            del self.free[i]
        self.ref[i] += 1

    def decref(self, i):
        """少一个用户；计数降到 0 的块放回空闲表尾。【边界】计数已经是 0：RuntimeError（重复释放）。"""
        if self.ref[i] <= 0:
            raise RuntimeError(f"块 {i} 的引用计数已经是 0：重复释放（这是代码的错）")
        self.ref[i] -= 1
        if self.ref[i] == 0:
            self.free[i] = None

    def check(self):
        """不变式：空闲表里的块计数为 0，不在里面的计数 ≥ 1。"""
        for i in range(self.n_blocks):
            assert (i in self.free) == (self.ref[i] == 0) and self.ref[i] >= 0, f"块 {i}：计数 {self.ref[i]}"


class BlockManager:
    """
    引擎的块管理：一个 BlockPool + 每块的前缀缓存信息（键、token、父块）+ 键 -> 块号的表。

    序列（请求）对象要有 .block_table（块号的 list）和 .n_cached_blocks（它已登记进缓存的满块数）。
    【用法】进来时 match_prefix(token) 找命中的满块，can_allocate 看放不放得下，allocate 拿下命中块并补新块；
    每步之前 append_slots 补足这一步要写的块；每步之后 commit_full(req, tokens, n_computed) 把新写满的块登记进缓存；
    结束、中止、被挤出去时 free。
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
        for _ in range(self.slots_needed(req, n_tokens)):
            req.block_table.append(self.pool.take())

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

    def free(self, req):
        """放掉请求的所有块（从尾到头：尾部的块先被挤掉，开头的共享前缀留得最久）。"""
        for i in reversed(req.block_table):
            self.pool.decref(i)
        req.block_table = []
        req.n_cached_blocks = 0
