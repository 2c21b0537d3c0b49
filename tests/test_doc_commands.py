"""scripts/dev/doc_commands.py: the commands it finds in the docs, the ones it leaves out, and the outcomes it reports
for a command that succeeds, one that fails and one still running at the time limit."""

from __future__ import annotations

from pathlib import Path

from agent_helpers import script

# The page's path relative to the checkout, built from parts: tests/test_docs.py takes a written docs path for a
# citation of a real page.
PAGE_PATH = Path("docs", "sub", "page.md")
PAGE = """# A page

```bash
python scripts/train.py --env gagpo_gym/Maze-v0 \\
    --total-timesteps 100   # a short run
# a comment-only line
echo "a # in quotes" 'and # here'   # the comment
make lint
```

```python
print("not a shell command")
```

```console
$ python scripts/eval.py --help
usage: eval.py [-h]
```

```bash
make lint
```
"""


def test_commands_are_read_from_the_shell_blocks(tmp_path: Path) -> None:
    (tmp_path / PAGE_PATH).parent.mkdir(parents=True)
    (tmp_path / PAGE_PATH).write_text(PAGE)
    (tmp_path / "README.md").write_text("```sh\nmake lint\nls\n```\n")
    assert script("dev/doc_commands").doc_commands(tmp_path) == [
        ("README.md", "make lint"),  # first seen in the README: listed once, there
        ("README.md", "ls"),
        (PAGE_PATH.as_posix(), "python scripts/train.py --env gagpo_gym/Maze-v0 --total-timesteps 100"),
        (PAGE_PATH.as_posix(), "echo \"a # in quotes\" 'and # here'"),
        (PAGE_PATH.as_posix(), "python scripts/eval.py --help"),
    ]


def test_commands_that_cannot_run_here_are_left_out_with_a_reason() -> None:
    why_not_run = script("dev/doc_commands").why_not_run
    assert "torchrun" in why_not_run("torchrun --nproc_per_node 8 scripts/train.py --model PATH")
    assert "server" in why_not_run("python -m gagpo_gym.serve gagpo_gym/MiniHouse-v0 --port 8000")
    assert "long" in why_not_run("make test") and "long" in why_not_run("make test-vllm")
    assert why_not_run("python scripts/train.py --help") is None
    assert why_not_run("make test-something-quick") is None
    assert why_not_run('echo "$PATH"') is None  # the variable is no placeholder


def test_outcomes_ok_failed_and_running_at_the_limit(tmp_path: Path, capsys) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("```bash\necho hi\nfalse\nsleep 5\ntorchrun x.py\n```\n")
    code = script("dev/doc_commands").main(["--root", str(tmp_path), "--timeout", "1"])
    out = capsys.readouterr().out
    rows = {line.split(" | ")[1].strip("`"): line.split(" | ")[2] for line in out.splitlines() if "page.md" in line}
    assert rows == {
        "echo hi": "ok",
        "false": "FAILED (rc 1)",
        "sleep 5": "running at the limit (started fine)",
        "torchrun x.py": "not run: multi-GPU launch (torchrun)",
    }
    assert code == 1  # a command failed
    assert "4 commands: 1 ok, 1 FAILED, 1 running at the limit, 1 not run" in out
