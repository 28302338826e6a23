"""
引用的出处学生要打得开：仓库里的文件不能引用仓库里没有的文档（课程计划、风格指南、开发说明）或讲义的章节号。

两个种子（lecture06/04、lecture05/05）的原文引用讲义的章节，原样保留（README 说明了一次）；这个测试文件自己要写出
这些词才能查它们。其余每个文件都查：脚本、实验模块、tests/ 和 fixtures、README。
"""
import json
import os
import re
import subprocess

from conftest import ROOT

SEEDS = ("lecture06/04_spec_decode_speedup.py", "lecture05/05_heterogeneous_spec_decode.py")
THIS = "tests/test_sources.py"
# 打不开的出处：课程计划、风格指南、开发说明，和讲义的章节号（"论文 §3.3" 这种论文的章节不算）
FORBIDDEN = re.compile(r"CURRICULUM|STYLE(?![a-z])|DEVELOPERS|讲义\s*§|第\s*[0-9一二三四五六七八九十]+\s*讲\s*§")


def repo_files():
    """仓库里的文件（相对路径）：有 git 时是 git 跟踪的文件，没有时（例如下载的压缩包）是目录里除 .git 外的文件。"""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        files = [f for f in out.decode("utf-8").split("\0") if f]
        if files:
            return files
    except (OSError, subprocess.CalledProcessError):
        pass
    found = []
    for d, subdirs, names in os.walk(ROOT):
        subdirs[:] = [s for s in subdirs if not s.startswith(".") and s != "__pycache__"]
        found += [os.path.relpath(os.path.join(d, n), ROOT).replace(os.sep, "/") for n in names]
    return found


def text_to_check(rel, text):
    """
    要查的文本。分词器的参考 fixture 把仓库里几个文件的原文当作输入文本存着（"group": "repo_file:路径"）：
    其中种子的原文照样引用讲义，是种子的一份拷贝，跳过这一条（只跳过种子的，别的文件的照查）。
    """
    if not rel.endswith(".json"):
        return text
    try:
        data = json.loads(text)
    except ValueError:
        return text
    seed_groups = {"repo_file:" + s for s in SEEDS}

    def drop_seed_copies(x):
        if isinstance(x, list):
            return [drop_seed_copies(e) for e in x if not (isinstance(e, dict) and e.get("group") in seed_groups)]
        if isinstance(x, dict):
            return {k: drop_seed_copies(v) for k, v in x.items()}
        return x
    return json.dumps(drop_seed_copies(data), ensure_ascii=False, indent=1)


def offending_lines(rel, text):
    return [f"{rel}:{i + 1}: {line.strip()[:120]}" for i, line in enumerate(text_to_check(rel, text).splitlines())
            if FORBIDDEN.search(line)]


def test_no_file_cites_documents_a_student_cannot_open():
    bad = []
    for rel in repo_files():
        if rel in SEEDS or rel == THIS:
            continue
        path = os.path.join(ROOT, rel)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue                                    # 二进制文件、工作区里删掉还没提交的
        bad += offending_lines(rel, text)
    assert not bad, "这些行引用了学生打不开的文档（换成论文、数据手册、某个提交的文件或本仓库算它的文件）：\n" + "\n".join(bad)


def test_the_pattern_catches_each_form_and_spares_paper_sections():
    for s in ("（CURRICULUM §9）", "见 STYLE.md", '这是 STYLE"随机数"的例外', "DEVELOPERS.md 说", "讲义 §8.3", "第 5 讲 §8.3", "第1讲§6",
              "第 3 讲 §7.6", "讲义§7.6"):
        assert FORBIDDEN.search(s), s
    for s in ("论文 §3.3", "Leviathan §6", "第 6 讲 04 的演示 2", "对照讲义读", "附录 A.3"):
        assert not FORBIDDEN.search(s), s


def test_the_seeds_cite_lecture_notes_and_the_readme_says_so():
    """种子引用讲义的章节（所以它们被排除在外）；README 要说一次：种子提到的讲义不是这套代码的一部分。"""
    for s in SEEDS:
        with open(os.path.join(ROOT, s), encoding="utf-8") as f:
            assert FORBIDDEN.search(f.read()), s
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    assert "种子" in readme and "那份讲义不在这个仓库里" in readme


def test_a_seed_copy_inside_the_tokenizer_fixture_is_skipped_but_other_entries_are_checked():
    entries = {"cases": [{"group": "repo_file:" + SEEDS[0], "text": "讲义 §8.3"},
                         {"group": "repo_file:README.md", "text": "CURRICULUM §5"}]}
    bad = offending_lines("tests/fixtures/x.json", json.dumps(entries, ensure_ascii=False))
    assert len(bad) == 1 and "CURRICULUM" in bad[0]
