"""Run every shell command that README.md and docs/ show, in a checkout, and print a Markdown table of what happened.

    python scripts/dev/doc_commands.py --root /tmp/fresh-clone              # run them all there, 60 s each at most
    python scripts/dev/doc_commands.py --root /tmp/fresh-clone --only make  # only the commands containing "make"
    python scripts/dev/doc_commands.py --list                               # the commands and what would run

tests/test_docs.py checks that the docs name paths and options that exist; only running the commands shows that
they work as a reader types them. The commands are the lines of the ```bash (sh, console) blocks of README.md, then
of docs/**/*.md in sorted order (continuation lines joined, comments dropped, each command once). They run in the
checkout (``--root``, normally a scratch clone: what they write lands there) with ``bash -c``, its ``.venv/bin``
first on PATH so that ``python`` is the checkout's. A command still running at ``--timeout`` is killed, its process
group with it, and counted as started fine. Commands that cannot run on a CPU machine, name a placeholder, serve
forever or take too long for a smoke run are listed with the reason instead (NOT_RUN). The exit status is 1 when a
command failed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agents.cli import fail

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
SHELL_TAGS = {"bash", "sh", "console"}
# (pattern searched in the command, why it is not run); the first match gives the reason, so the reasons a reader
# can do nothing about on a CPU machine come before the placeholders they also name.
NOT_RUN: tuple[tuple[str, str], ...] = (
    (r"\bgit clone\b", "clones a repository (the checkout is the clone)"),
    (r"\btorchrun\b", "multi-GPU launch (torchrun)"),
    (r"\baccelerate launch\b.*configs/accelerate/\S*gpu", "multi-GPU launch (accelerate GPU config)"),
    (r"--backend vllm\b", "vLLM backend: needs a CUDA GPU"),
    (r"pip install .*gagpo-gym\[paper\]", "CUDA extras (vllm)"),
    (r"<[A-Za-z][^<>]*>", "placeholder (<...>)"),
    (r"(?<![$\w])PATH\b|/models/", "placeholder model path"),
    (r"\bmkdocs serve\b", "a server: never ends"),
    (r"-m gagpo_gym\.serve\b", "a server: never ends"),
    (r"\bmake (test|test-vllm|mutate)(?![\w-])", "long: run separately"),
    (r"scripts/dev/doc_commands\.py", "this tool itself"),
)


def strip_comment(line: str) -> str:
    """The line without its comment: a ``#`` that starts a word outside quotes, as bash reads it."""
    quote, escaped = "", False
    for i, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def shell_commands(block: str, console: bool = False) -> list[str]:
    """The commands of one shell block: continuation lines joined, comment-only lines and trailing comments dropped.
    In a console block only the ``$ `` lines are commands (the rest is their output)."""
    commands = []
    for line in re.sub(r"[ \t]*\\\n\s*", " ", block).splitlines():
        if console:
            if not line.startswith("$ "):
                continue
            line = line[2:]
        command = strip_comment(line).strip()
        if command:
            commands.append(command)
    return commands


def doc_commands(root: Path) -> list[tuple[str, str]]:
    """(page relative to root, command) for each shell command of README.md and docs/**/*.md, each command once."""
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    seen: dict[str, str] = {}
    for page in pages:
        if not page.is_file():
            continue
        for tag, block in FENCE.findall(page.read_text(encoding="utf-8")):
            if tag in SHELL_TAGS:
                for command in shell_commands(block, console=tag == "console"):
                    seen.setdefault(command, page.relative_to(root).as_posix())
    return [(page, command) for command, page in seen.items()]


def why_not_run(command: str) -> str | None:
    """Why a command is not run here (NOT_RUN's reason), or None to run it."""
    return next((reason for pattern, reason in NOT_RUN if re.search(pattern, command)), None)


def child_env(root: Path) -> dict[str, str]:
    """This process's environment with the checkout's venv first on PATH: ``python`` in a command is the checkout's."""
    venv = root / ".venv"
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", "VIRTUAL_ENV": str(venv)}
    env.pop("PYTHONHOME", None)
    return env


def last_line(path: Path) -> str:
    lines = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def run_command(command: str, root: Path, timeout: float) -> tuple[str, float]:
    """(outcome, wall seconds) of one command run in root. Its output goes to files, not pipes: a killed command's
    stray descendant cannot keep this waiting on a pipe it still holds."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="doc_commands_") as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        with out.open("wb") as stdout, err.open("wb") as stderr:
            proc = subprocess.Popen(
                ["bash", "-c", command], cwd=root, env=child_env(root), stdin=subprocess.DEVNULL,
                stdout=stdout, stderr=stderr, start_new_session=True,
            )  # fmt: skip
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                kill_group(proc)
                return "running at the limit (started fine)", time.monotonic() - start
        seconds = time.monotonic() - start
        if code == 0:
            return "ok", seconds
        detail = last_line(err) or last_line(out)
        return f"FAILED (rc {code})" + (f": {detail}" if detail else ""), seconds


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the command's whole process group, 5 s to end, then SIGKILL to whatever of the group is left."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:  # the whole group has ended
            break
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)


def cell(text: str, width: int | None = None) -> str:
    """A Markdown table cell: cut to width, pipes escaped."""
    if width is not None and len(text) > width:
        text = text[: width - 3] + "..."
    return text.replace("|", "\\|")


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout: its docs, and where commands run")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a command may run before it is killed")
    parser.add_argument("--only", action="append", default=[], metavar="SUBSTRING", help="run the commands with it")
    parser.add_argument("--list", action="store_true", help="print the commands and what would run; run nothing")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if not root.is_dir():
        fail(f"--root {args.root} is not a directory")
    if args.timeout <= 0:
        fail(f"--timeout must be positive, got {args.timeout}")
    commands = [(page, c) for page, c in doc_commands(root) if not args.only or any(s in c for s in args.only)]
    if not commands:
        fail(f"no commands in {root}'s README.md and docs/" + (f" containing {args.only}" if args.only else ""))
    if args.list:
        rows = [[page, f"`{cell(c)}`", cell(f"not run: {why}" if (why := why_not_run(c)) else "run")]
                for page, c in commands]  # fmt: skip
        print(table(["page", "command", "plan"], rows))
        return 0
    rows, counts = [], {"ok": 0, "FAILED": 0, "running at the limit": 0, "not run": 0}
    for i, (page, command) in enumerate(commands, 1):
        why = why_not_run(command)
        outcome, seconds = (f"not run: {why}", 0.0) if why else run_command(command, root, args.timeout)
        counts[next(key for key in counts if outcome.startswith(key))] += 1
        print(f"[{i}/{len(commands)}] {outcome} ({seconds:.1f} s): {command}", file=sys.stderr, flush=True)
        rows.append([page, f"`{cell(command, 90)}`", cell(outcome, 200), "" if why else f"{seconds:.1f}"])
    print(table(["page", "command", "outcome", "seconds"], rows))
    print()
    print(f"{len(commands)} commands: " + ", ".join(f"{n} {key}" for key, n in counts.items()) + f" (in {root})")
    return 1 if counts["FAILED"] else 0


if __name__ == "__main__":
    sys.exit(main())
