"""
参照生成器用的"只算读到的行"的模型：真实模型的 lm_head 每行 2.8e7 次乘加（SmolLM2 只用前几层时是一次前向的
大头），而 decode_lab 的生成器每次调用只读 logits 的最后几行（提示那一遍只读最后一行）。
"""
import copy

import numpy as np


def rows_read(model, k):
    """
    model 的浅拷贝（同一份权重）：每次 forward 只给最后 k 行乘 lm_head，前面的行是 NaN。
    lm_head 对每一行是独立的一次矩阵乘，留下的行和整段算完再切出来的只差 BLAS 分块的舍入（smollm2_models.logits_at
    同理）。调用者要是读了 NaN 的行，抽出来的 token 就不是参照该有的（和被测的一比就红），不会悄悄算对。
    """
    m = copy.copy(model)
    head, V = model.lm_head, model.cfg.vocab

    def lm_head(h):
        out = np.full(h.shape[:-1] + (V,), np.nan)
        out[:, -k:] = head(h[:, -k:])
        return out
    m.lm_head = lm_head
    return m
