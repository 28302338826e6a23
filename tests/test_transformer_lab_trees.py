"""
transformer_lab 的树形注意力：一次前向算整棵 token 树，每个节点的 logits == 把它的路径当普通序列喂（float64，< 1e-12）；
留下一条路径（KVCache.keep）之后的缓存 == 从头喂"前缀 + 路径"；不给遮罩时的默认路径一位不差；坏参数抛 ValueError。
"""
import numpy as np
import pytest

from transformer_lab import LMConfig, NumpyTransformer, init_params
from ledger_lab import ATTN_CORE_OPS, Counter
from kvcache_lab import tree_mask

CONFIGS = [LMConfig(name="gqa"), LMConfig(name="mha", n_kv_heads=4),
           LMConfig(name="odd", vocab=37, d_model=24, n_layers=3, n_heads=6, n_kv_heads=3, head_dim=4, d_ff=40)]
TOL = 1e-12
# 节点按层排的树：-1 = 接在缓存的前缀后面
TREES = {
    "分叉 (3, 2, 1)": [-1, -1, -1, 0, 0, 1, 1, 2, 2, 3, 4, 5, 6, 7, 8],
    "不规则": [-1, 0, 0, -1, 1, 2, 2, 4, 3, 8],
    "一条链": [-1, 0, 1, 2, 3],
    "只有一层": [-1, -1, -1, -1],
}


def _model(cfg, seed=0):
    return NumpyTransformer(init_params(cfg, seed), cfg)


def _toks(cfg, B, n, seed=1):
    return (np.random.default_rng(seed).random((B, n)) * cfg.vocab).astype(int)


def _path(parents, i):
    """节点 i 的路径（从第一层到 i 的节点下标），沿着父节点往回走——和 tree_mask 无关的第二种写法。"""
    out = []
    while i >= 0:
        out.append(i)
        i = parents[i]
    return out[::-1]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("tree", list(TREES))
def test_every_tree_node_equals_feeding_its_path(cfg, tree):
    m = _model(cfg)
    parents = TREES[tree]
    B, n_prefix = 2, 7
    prefix = _toks(cfg, B, n_prefix)
    nodes = _toks(cfg, B, len(parents), seed=2)
    cache = m.new_cache(B)
    m.forward(prefix, cache)
    mask, pos = tree_mask(parents, n_prefix)
    out = m.forward(nodes, cache, attn_mask=mask, positions=pos)
    assert cache.pos == n_prefix + len(parents)
    for i in range(len(parents)):
        path = _path(parents, i)
        plain = m.forward(np.concatenate([prefix, nodes[:, path]], axis=1))
        assert np.abs(out[:, i] - plain[:, -1]).max() < TOL, (tree, i)


def test_tree_without_a_cached_prefix():
    """n_past = 0：第一层的节点是几个互不相干的"第一个 token"（位置都是 0）。"""
    cfg = CONFIGS[0]
    m = _model(cfg)
    parents = [-1, -1, 0, 1, 1]
    nodes = _toks(cfg, 1, 5)
    mask, pos = tree_mask(parents, 0)
    out = m.forward(nodes, m.new_cache(1), attn_mask=mask, positions=pos)
    for i in range(5):
        plain = m.forward(nodes[:, _path(parents, i)])
        assert np.abs(out[:, i] - plain[:, -1]).max() < TOL


def test_tree_mask_hand_worked():
    mask, pos = tree_mask([-1, -1, 0, 0, 1, 2], 2)
    T, F = True, False
    expected = np.array([
        # 缓存 0 1 | 节点 0 1 2 3 4 5
        [T, T, T, F, F, F, F, F],
        [T, T, F, T, F, F, F, F],
        [T, T, T, F, T, F, F, F],
        [T, T, T, F, F, T, F, F],
        [T, T, F, T, F, F, T, F],
        [T, T, T, F, T, F, F, T],
    ])
    assert np.array_equal(mask, expected)
    assert list(pos) == [2, 2, 3, 3, 3, 4]


def test_tree_mask_of_a_chain_is_the_causal_mask():
    mask, pos = tree_mask([-1, 0, 1, 2], 3)
    causal = np.arange(7)[None, :] <= (3 + np.arange(4))[:, None]
    assert np.array_equal(mask, causal)
    assert list(pos) == [3, 4, 5, 6]


@pytest.mark.parametrize("cfg", CONFIGS[:2], ids=lambda c: c.name)
def test_explicit_causal_mask_gives_bit_identical_default_path(cfg):
    """遮罩和位置都给成默认的那一套时，结果和不给一位不差（默认路径的算术没有变）。"""
    m = _model(cfg)
    toks = _toks(cfg, 2, 12)
    c1, c2 = m.new_cache(2), m.new_cache(2)
    m.forward(toks[:, :5], c1)
    m.forward(toks[:, :5], c2)
    default = m.forward(toks[:, 5:], c1)
    mask, pos = tree_mask(list(range(-1, 6)), 5)
    explicit = m.forward(toks[:, 5:], c2, attn_mask=mask, positions=pos)
    assert np.array_equal(default, explicit)
    assert np.array_equal(c1.k, c2.k) and np.array_equal(c1.v, c2.v)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
def test_keeping_a_path_equals_a_fresh_pass(cfg):
    m = _model(cfg)
    parents = TREES["分叉 (3, 2, 1)"]
    n_prefix = 6
    prefix = _toks(cfg, 1, n_prefix)
    nodes = _toks(cfg, 1, len(parents), seed=3)
    cache = m.new_cache(1)
    m.forward(prefix, cache)
    mask, pos = tree_mask(parents, n_prefix)
    m.forward(nodes, cache, attn_mask=mask, positions=pos)
    path = _path(parents, 11)                      # 第 3 层的一个叶子：节点 1 → 5 → 11（不相邻的槽）
    assert path == [1, 5, 11]
    cache.keep(n_prefix, path)
    assert cache.pos == n_prefix + len(path)
    seq = np.concatenate([prefix, nodes[:, path]], axis=1)
    fresh = m.new_cache(1)
    m.forward(seq, fresh)
    S = cache.pos
    assert np.abs(cache.k[:, :, :, :S] - fresh.k[:, :, :, :S]).max() < TOL
    assert np.abs(cache.v[:, :, :, :S] - fresh.v[:, :, :, :S]).max() < TOL
    # 接着往下喂：和一次算完整个序列一样
    more = _toks(cfg, 1, 4, seed=4)
    got = m.forward(more, cache)
    full = m.forward(np.concatenate([seq, more], axis=1))
    assert np.abs(got - full[:, -4:]).max() < TOL


def test_keep_moves_the_chosen_slots_in_order():
    """手算：位置 start 以后的槽 [a, b, c, d, e] 留下 offsets (1, 3, 4) -> [b, d, e]。"""
    cfg = CONFIGS[0]
    cache = _model(cfg).new_cache(1)
    vals = np.arange(8.0)
    cache.k[:, :, :, :8] = vals[None, None, None, :, None]
    cache.v[:, :, :, :8] = -vals[None, None, None, :, None]
    cache.pos = 8
    cache.keep(3, [1, 3, 4])
    assert cache.pos == 6
    assert list(cache.k[0, 0, 0, :6, 0]) == [0, 1, 2, 4, 6, 7]
    assert list(cache.v[0, 0, 0, :6, 0]) == [0, -1, -2, -4, -6, -7]
    cache.keep(4, [])                              # 空的 offsets = 回滚
    assert cache.pos == 4


@pytest.mark.parametrize("start,offsets", [(-1, [0]), (9, [0]), (3, [5]), (3, [-1]), (3, [2, 1]), (3, [1, 1]),
                                           (3, [0.0, 1.0]), (3, [[0, 1]])])
def test_keep_rejects_bad_arguments(start, offsets):
    cache = _model(CONFIGS[0]).new_cache(1)
    cache.pos = 8
    with pytest.raises(ValueError):
        cache.keep(start, offsets)
    assert cache.pos == 8


@pytest.mark.parametrize("parents,n_past", [([], 0), ([0], 0), ([-1, 1], 0), ([-1, -2], 0), ([-1, 0.5], 0),
                                            ([-1], -1), ([[-1, 0]], 0), (-1, 0)])
def test_tree_mask_rejects_malformed_trees(parents, n_past):
    with pytest.raises(ValueError):
        tree_mask(parents, n_past)


def test_forward_rejects_bad_masks_and_positions():
    cfg = CONFIGS[0]
    m = _model(cfg)
    cache = m.new_cache(1)
    m.forward(_toks(cfg, 1, 4), cache)
    toks = _toks(cfg, 1, 3)
    mask, pos = tree_mask([-1, 0, 0], 4)
    bad = {
        "形状不对": dict(attn_mask=mask[:, :-1]),
        "不是布尔": dict(attn_mask=mask.astype(float)),
        "看不到自己": dict(attn_mask=np.where(np.eye(3, 7, 4, dtype=bool), False, mask)),
        "看了后面的位置": dict(attn_mask=np.ones((3, 7), dtype=bool)),
        "位置越界": dict(attn_mask=mask, positions=np.array([4, 5, cfg.max_seq])),
        "位置个数不对": dict(attn_mask=mask, positions=pos[:2]),
        "位置不是整数": dict(attn_mask=mask, positions=pos.astype(float)),
    }
    for name, kw in bad.items():
        with pytest.raises(ValueError):
            m.forward(toks, cache, **kw)
        assert cache.pos == 4, name


def test_tree_pass_ledger_counts_only_visible_pairs_as_useful():
    """账本的 useful：注意力核心只算遮罩放行的 (query, key) 对（每层打分和加权和各 2·B·H·对数·hd）。"""
    cfg = CONFIGS[0]
    m = _model(cfg)
    cache = m.new_cache(1)
    m.forward(_toks(cfg, 1, 5), cache)
    parents = TREES["分叉 (3, 2, 1)"]
    c = Counter()
    m.forward(_toks(cfg, 1, len(parents)), cache, c, *tree_mask(parents, 5))
    pairs = 5 * len(parents) + sum(len(_path(parents, i)) for i in range(len(parents)))
    assert c.total("useful", ATTN_CORE_OPS) == cfg.n_layers * 2 * (2 * cfg.n_heads * pairs * cfg.head_dim)
