"""
README 的第 3 讲和第 3 讲预备的几行：运行时间的倍数和脚本自己的【运行】一致（每次重量都要两边一起改）。
"""
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme_row(name):
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        rows = [l for l in f if l.startswith(f"| `{name}`")]
    assert len(rows) == 1, name
    return rows[0]


@pytest.mark.parametrize("rel", ["lecture03/07_real_model_quantization.py", "lecture03/08_rotations_and_llm_int8.py"])
def test_readme_runtime_multiple_matches_the_scripts_own_run_note(rel):
    """
    回归：README 写 07 "约 3.5 倍"、08 "约 3.4–4 倍，在负载重的机器上量的"，两个脚本的【运行】都写"比值中位数
    3.4 倍"（背靠背三对，各自的范围）。
    """
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        doc = f.read().split('"""')[1].replace("\n", "")
    m = re.search(r"比值中位数 ([\d.]+) 倍（([\d.]+)–([\d.]+)", doc)
    assert m, rel
    row = _readme_row(os.path.basename(rel))
    r = re.search(r"种子 04 的约 ([\d.]+) 倍：背靠背三对的中位数，([\d.]+)–([\d.]+)）", row)
    assert r, row
    assert r.groups() == m.groups()
