"""Training throughput of ``learn()``: env steps/s, where the time goes, and the update's FLOP/s against this CPU.

    python lab/bench/throughput.py                                   # every setting, results/throughput/report.md
    python lab/bench/throughput.py --settings maze minihouse-small --steps 600
    git worktree add /tmp/base <commit>
    python lab/bench/throughput.py --checkout /tmp/base --checkout .  # before / after, in one run

Each setting trains a fresh agent (seed 0, one torch thread, verbose 0, the config defaults unless the setting
says otherwise) with ``learn(--steps)``, in a subprocess of its own whose ``PYTHONPATH`` is the checkout measured
(``--checkout``, repeatable; default this file's checkout). With several checkouts the settings are interleaved
(setting 1 on every checkout, then setting 2...), so that a drift in the machine's load hits all of them, and a
before/after table gives each checkout's speedup over the first. ``agents``, ``wrappers`` and ``gagpo_gym`` must
all come from the checkout given: the child process checks where they were imported from and refuses otherwise
(this file's own folder, ``lab/bench/``, is first on ``sys.path``; it holds none of them).

Columns (times are sums over the run's iterations, in seconds per 1,000 env steps):

* ``steps/s``: env steps of ``learn()`` divided by its wall time (agent construction not included); ``cpu``: the
  process's CPU time over that wall time (well under 100%: other processes took the core, the times are inflated);
* ``rollout``: ``time/rollout_s``, collecting the rollout (acting, env steps, advantages); ``generate`` and
  ``env`` are its two logged parts, ``time/generate_s`` (the policy acting) and ``time/env_s``;
* ``recompute``: ``time/recompute_s``, the behaviour log-probs recomputed with the update's forward (``n/a`` on
  older checkouts, which log no such key: there the recompute is inside ``rollout``);
* ``update``: ``time/update_s``, the clipped-PPO epochs (forward, backward, optimiser);
* ``upd/(roll+rec)``: update time over rollout + recompute time (the issue's goal: at most 1.5);
* ``prompt``: prompt tokens per row, mean/max; ``act tok``: the action's tokens per row, mean (choose mode: all
  admissible candidates with their end token; generate mode: the sampled response); ``width``: the packed
  sequence per row, mean/max (choose: prompt + all candidates; generate: prompt + response), read from
  ``agent.buffer.rows`` at the end of every rollout (a callback's ``_on_rollout_end``: the buffer is reset at the
  start of the next rollout);
* ``fwd MFLOP``: model FLOPs of one forward over one env step's row (below); ``upd MFLOP``: the update's FLOPs per
  env step, ``n_epochs x (forward + backward)``; ``attn``: attention's share of the forward;
* ``upd GFLOP/s``: the update's FLOPs over ``time/update_s``; ``% peak``: that rate against this machine's dense
  fp32 matmul peak on one thread, measured in the same run (``torch.mm`` of square matrices, 512, 1024 and 2048 by
  default, best of several, before and after the settings: the roofline).

What is counted, per row, from its shapes and the model's config (``forward_flops``), with ``W`` the row's width
and ``A`` its action tokens (the tokens the vocabulary head predicts):

* ``2 x M x W``: every matmul weight of the decoder (``M``: the weights of all ``nn.Linear`` modules in
  ``model.get_decoder()``, so attention projections and MLP, with LoRA's adapters included; no embeddings, no
  biases, no norms, no activations, no softmax);
* ``2 x 2 x W x W x d x L``: attention scores and the weighted sum of the values, ``d = heads x head_dim`` (the
  query width), ``L`` layers: a dense square over the whole row, the choose mode's packed row attending with a
  dense 4D mask (what the kernel computes; the masked-out part is counted too) and generate mode's padded batch
  as well; padding to the micro-batch's widest row is not counted;
* ``2 x hidden x vocab x A``: the vocabulary head on the predicted tokens only;
* backward = 2 x forward (with LoRA only the adapters need weight gradients, so there this is an upper bound);
  the update = ``n_epochs x 3 x forward``; the recompute = 1 forward (2 with ``kl_coef > 0``: the reference's);
  every row counted once per pass, though identical (prompt, candidates) rows of a micro-batch are scored once
  (``distinct`` in the JSON: the rollout's share of distinct rows).

The count is a property of the rows and the model, not of the implementation: on the same rows two commits get
the same count, so their achieved FLOP/s differ exactly as their update times do (a kernel that skips the masked
half computes less than is counted, and so does a checkout that packs the candidates as a prefix tree, each
shared first token once, as ``agents.batching.candidate_tree`` does since #24: its rate is then an effective one).

Settings: ``minihouse-small`` (MiniHouse ``{"size": "small", "max_episode_steps": 30}``), ``minihouse-full``
(``{"size": "full"}``, ALFWorld's room statistics), ``maze`` (``gagpo_gym/Maze-v0``'s defaults),
``alfworld-length`` (MiniHouse full with ``history_length=4``: ALFWorld-length prompts), all with the tiny model in
choose mode; ``smollm2-lora-choose`` and ``smollm2-lora-generate``: SmolLM2-135M-Instruct with LoRA (``lora_r=8``)
on small MiniHouse houses, one group of 2 episodes of at most 2 steps (slow on a CPU), skipped with a note when
the model folder is absent (``python scripts/fetch_smollm2.py --cache .cache/smollm2-135m-instruct``). An
iteration is never cut, so every setting runs whole iterations: at least one, whatever ``--steps`` is.

Outputs: the tables on stdout, ``--out`` (default ``results/throughput/report.md``, with the machine and the command
that regenerates it), ``--json FILE`` (everything, per iteration too), ``--readme`` (the block between
``<!-- throughput:start -->`` and ``<!-- throughput:end -->`` in docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checkouts import Recorder, log_to, package_root

ROOT = Path(__file__).resolve().parents[2]
SMOLLM2 = ROOT / ".cache" / "smollm2-135m-instruct"
RESULT_MARK = "BENCH_THROUGHPUT_RESULT "
README_START, README_END = "<!-- throughput:start -->", "<!-- throughput:end -->"
TIMES = ("rollout_s", "recompute_s", "update_s", "generate_s", "env_s")
#: Every setting's agent: the rest are GAGPOConfig's defaults.
COMMON: dict[str, Any] = {"seed": 0, "torch_threads": 1, "device": "cpu"}
#: The resolved hyperparameters a result records.
CONFIG_KEYS = ("action_mode", "num_groups", "group_size", "n_epochs", "minibatch_size", "history_length", "kl_coef",
               "token_budget", "lora_r")  # fmt: skip


@dataclass(frozen=True)
class Setting:
    env: str
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    steps: int = 2000  # learn(steps): whole iterations, at least one
    model: str = "tiny"
    note: str = ""


MINIHOUSE = "gagpo_gym/MiniHouse-v0"
SMOLLM2_CONFIG = {"lora_r": 8, "num_groups": 1, "group_size": 2}
SMOLLM2_ENV = {"size": "small", "max_episode_steps": 2}
SMOLLM2_NOTE = "SmolLM2-135M, LoRA r=8, 1 group x 2 episodes, 2-step limit: one iteration"
ONE = "one iteration"
SETTINGS: dict[str, Setting] = {
    "minihouse-small": Setting(MINIHOUSE, {"size": "small", "max_episode_steps": 30}, steps=1000,
                               note="small houses, 30-step limit"),
    "minihouse-full": Setting(MINIHOUSE, {"size": "full"}, steps=1, note=f"ALFWorld-size houses, 50-step limit: {ONE}"),
    "maze": Setting("gagpo_gym/Maze-v0", {}, steps=1000, note="5x5 mazes with 2 rooms, 50-step limit"),
    "alfworld-length": Setting(MINIHOUSE, {"size": "full"}, {"history_length": 4}, steps=1,
                               note=f"MiniHouse full, history_length=4 (ALFWorld-length prompts): {ONE}"),
    "smollm2-lora-choose": Setting(MINIHOUSE, SMOLLM2_ENV, {**SMOLLM2_CONFIG, "action_mode": "choose"}, steps=1,
                                   model="smollm2", note=SMOLLM2_NOTE),
    "smollm2-lora-generate": Setting(MINIHOUSE, SMOLLM2_ENV, {**SMOLLM2_CONFIG, "action_mode": "generate"},
                                     steps=1, model="smollm2", note=SMOLLM2_NOTE),
}  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
# Counting FLOPs
# ---------------------------------------------------------------------------------------------------------


def forward_flops(
    width: int, predicted: int, *, matmul_params: int, layers: int, attn_dim: int, head_params: int
) -> dict[str, int]:
    """Model FLOPs of one forward over one row of ``width`` tokens, ``predicted`` of them scored by the head.

    ``matmul`` = 2 x matmul_params x width; ``attention`` = 2 x 2 x width^2 x attn_dim x layers (scores and the
    weighted sum of values, a dense square); ``head`` = 2 x head_params x predicted (head_params = hidden x vocab).
    """
    parts = {
        "matmul": 2 * matmul_params * width,
        "attention": 4 * width * width * attn_dim * layers,
        "head": 2 * head_params * predicted,
    }
    return {**parts, "total": sum(parts.values())}


def model_dims(model: Any) -> dict[str, int]:
    """What :func:`forward_flops` needs from a causal LM (a peft model too): decoder matmul weights, layers,
    query width of attention, and the vocabulary head's weights."""
    from torch import nn

    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = int(config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    decoder = model.get_decoder()
    matmul = sum(m.weight.numel() for m in decoder.modules() if isinstance(m, nn.Linear))
    head = model.get_output_embeddings().weight
    return {
        "matmul_params": int(matmul),
        "layers": int(config.num_hidden_layers),
        "attn_dim": int(heads * head_dim),
        "head_params": int(head.numel()),
        "hidden": int(config.hidden_size),
        "vocab": int(head.shape[0]),
    }


def row_shape(row: Any) -> tuple[int, int, int, int]:
    """(prompt tokens, action tokens, width, candidates) of a buffer row (choose: all candidates; generate: the
    response)."""
    prompt = len(row.prompt_ids)
    candidates = list(getattr(row, "candidate_ids", None) or [])
    action = sum(len(c) for c in candidates) if candidates else len(getattr(row, "response_ids", None) or [])
    return prompt, action, prompt + action, len(candidates)


# ---------------------------------------------------------------------------------------------------------
# The roofline
# ---------------------------------------------------------------------------------------------------------


def matmul_peak(sizes: list[int], repeats: int = 5, threads: int = 1) -> dict[str, Any]:
    """Best GFLOP/s of ``torch.mm`` on fp32 square matrices of each size, on ``threads`` threads."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    rates = {}
    for n in sizes:
        gen = torch.Generator().manual_seed(n)
        a, b = torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)
        out = torch.empty(n, n)
        torch.mm(a, b, out=out)  # warm-up
        reps = max(repeats, int(repeats * (1024 / n) ** 3))  # small sizes: more repeats, same total time
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            torch.mm(a, b, out=out)
            best = min(best, time.perf_counter() - t0)
        rates[str(n)] = 2 * n**3 / best / 1e9
    torch.set_num_threads(previous)
    return {"gflops": rates, "peak_gflops": max(rates.values()), "threads": threads}


# ---------------------------------------------------------------------------------------------------------
# The child: one setting, one checkout
# ---------------------------------------------------------------------------------------------------------


def locate_checkout(expected: Path | None) -> Path:
    """The one folder ``agents``, ``wrappers`` and ``gagpo_gym`` are imported from; exits if they come from
    several, or from another folder than ``expected``."""
    root = package_root("bench_throughput")
    if expected is not None and root != expected.resolve():
        sys.exit(f"bench_throughput: asked to measure {expected}, but the packages come from {root}")
    return root


def run_child(name: str, steps: int, config: dict[str, Any], env_kwargs: dict[str, Any], model: str) -> dict:
    """Train one setting in this process (its checkout on PYTHONPATH) and return what was measured."""
    from stable_baselines3.common.callbacks import BaseCallback

    import gagpo_gym  # noqa: F401  (registers the built-in envs)
    from agents import GAGPOAgent

    setting = SETTINGS[name]

    class Shapes(BaseCallback):
        """Every rollout's row shapes, read when the rollout is complete (the next one resets the buffer)."""

        def __init__(self, agent: Any) -> None:
            super().__init__()
            self.agent, self.rows, self.per_iteration, self.distinct = agent, [], [], 0

        def _on_step(self) -> bool:
            return True

        def _on_rollout_end(self) -> None:
            rows = self.agent.buffer.rows
            self.rows += [row_shape(r) for r in rows]
            self.per_iteration.append(len(rows))
            keys = {(tuple(r.prompt_ids), tuple(map(tuple, getattr(r, "candidate_ids", None) or []))) for r in rows}
            self.distinct += len(keys)

    t0 = time.perf_counter()
    agent = GAGPOAgent(setting.env, model, env_kwargs=env_kwargs, verbose=0, **{**COMMON, **config})
    build_s = time.perf_counter() - t0
    times = Recorder(keep=lambda key: key.startswith(("time/", "rollout/prompt")))  # each iteration's timings
    log_to(agent, times)
    shapes = Shapes(agent)
    t0, cpu0 = time.perf_counter(), time.process_time()
    agent.learn(steps, callback=shapes)
    learn_s, learn_cpu_s = time.perf_counter() - t0, time.process_time() - cpu0

    c = agent.config
    dims = model_dims(agent.policy.model)
    fwd = {"matmul": 0, "attention": 0, "head": 0, "total": 0}
    shape = {k: dims[k] for k in ("matmul_params", "layers", "attn_dim", "head_params")}
    for _, action, width, _ in shapes.rows:
        for k, v in forward_flops(width, action, **shape).items():
            fwd[k] += v
    recompute_passes = 2 if c.kl_coef > 0 else 1
    sums = {}
    for key in TIMES:
        values = [d[f"time/{key}"] for d in times.rows if f"time/{key}" in d]
        sums[key] = sum(values) if values else None
    n_rows = len(shapes.rows)
    prompts, actions, widths, cands = (list(x) for x in zip(*shapes.rows)) if n_rows else ([0], [0], [0], [0])
    return {
        "setting": name,
        "env": setting.env,
        "env_kwargs": env_kwargs,
        "model": model if setting.model == "tiny" else "SmolLM2-135M-Instruct",
        "config": {k: getattr(c, k) for k in CONFIG_KEYS},
        "dims": dims,
        "steps_asked": steps,
        "num_timesteps": int(agent.num_timesteps),
        "rows": n_rows,
        "iterations": int(agent.iteration),
        "rows_per_iteration": shapes.per_iteration,
        "build_s": build_s,
        "learn_s": learn_s,
        "learn_cpu_s": learn_cpu_s,
        "steps_per_s": agent.num_timesteps / learn_s,
        "times": sums,
        "per_iteration": times.rows,
        "prompt_mean": sum(prompts) / max(n_rows, 1),
        "prompt_max": max(prompts),
        "action_mean": sum(actions) / max(n_rows, 1),
        "candidates_mean": sum(cands) / max(n_rows, 1),
        "width_mean": sum(widths) / max(n_rows, 1),
        "width_max": max(widths),
        "distinct": shapes.distinct / max(n_rows, 1),
        "prompt_truncations": times.rows[-1].get("rollout/prompt_truncations") if times.rows else None,
        "flops": {
            "forward": fwd,
            "update": c.n_epochs * 3 * fwd["total"],
            "recompute": recompute_passes * fwd["total"],
        },
    }


# ---------------------------------------------------------------------------------------------------------
# The parent: settings x checkouts, tables
# ---------------------------------------------------------------------------------------------------------


def git_label(path: Path) -> str:
    """``<short commit>`` of a checkout (``+`` when its tracked files have changes), or its path's name."""
    try:
        commit = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        return commit + ("+" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return path.name


def spawn(name: str, checkout: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One setting on one checkout in a fresh interpreter; the child's JSON, or ``{"error": ...}``."""
    setting = SETTINGS[name]
    model = setting.model
    if model == "smollm2":
        model = str(args.smollm2)
    env_kwargs = {**setting.env_kwargs, **args.env_kwargs}
    config = {**setting.config, **args.config}
    steps = args.steps if args.steps is not None else setting.steps
    command = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--expect", str(checkout),
               "--steps", str(steps), "--config", json.dumps(config), "--env-kwargs", json.dumps(env_kwargs),
               "--model", model]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        return {"error": f"exit {proc.returncode}: {tail}"}
    result = json.loads(lines[-1][len(RESULT_MARK) :])
    result["process_s"] = time.perf_counter() - t0
    return result


def derive(result: dict[str, Any], peak_gflops: float) -> dict[str, Any]:
    """Per-1k-step times, FLOPs per step and the achieved rates of one child's result."""
    n = max(result["num_timesteps"], 1)
    rows = max(result["rows"], 1)
    t = result["times"]
    per_1k = {k: (None if v is None else 1000 * v / n) for k, v in t.items()}
    collect = (t["rollout_s"] or 0.0) + (t["recompute_s"] or 0.0)
    f = result["flops"]
    update_rate = f["update"] / t["update_s"] / 1e9 if t.get("update_s") else None
    recompute_rate = f["recompute"] / t["recompute_s"] / 1e9 if t.get("recompute_s") else None
    return {
        "per_1k_s": per_1k,
        "update_over_collect": t["update_s"] / collect if collect else None,
        "forward_flops_per_step": f["forward"]["total"] / rows,
        "update_flops_per_step": f["update"] / rows,
        "attention_share": f["forward"]["attention"] / max(f["forward"]["total"], 1),
        "update_gflops": update_rate,
        "recompute_gflops": recompute_rate,
        "update_peak_pct": None if update_rate is None else 100 * update_rate / peak_gflops,
        "recompute_peak_pct": None if recompute_rate is None else 100 * recompute_rate / peak_gflops,
    }


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        if value == 0 or abs(value) >= 100:
            return f"{value:.0f}"
        return f"{value:.{digits}g}"
    return str(value)


def markdown(rows: list[list[str]], header: list[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


MAIN_HEADER = ["setting", "checkout", "env steps", "steps/s", "cpu", "rollout", "generate", "env", "recompute",
               "update", "upd/(roll+rec)", "prompt", "act tok", "width", "fwd MFLOP", "upd MFLOP", "attn",
               "upd GFLOP/s", "% peak"]  # fmt: skip


def main_table(entries: list[dict[str, Any]]) -> str:
    rows = []
    for e in entries:
        r = e["result"]
        if "error" in r or "skipped" in r:
            rows.append([e["setting"], e["label"], r.get("skipped") or "error", *["-"] * (len(MAIN_HEADER) - 3)])
            continue
        d, s = e["derived"], e["derived"]["per_1k_s"]
        rows.append([
            e["setting"], e["label"], str(r["num_timesteps"]), fmt(r["steps_per_s"]),
            f"{100 * r['learn_cpu_s'] / r['learn_s']:.0f}%", fmt(s["rollout_s"]),
            fmt(s["generate_s"]), fmt(s["env_s"]), fmt(s["recompute_s"]), fmt(s["update_s"]),
            fmt(d["update_over_collect"]), f"{r['prompt_mean']:.0f}/{r['prompt_max']}", f"{r['action_mean']:.0f}",
            f"{r['width_mean']:.0f}/{r['width_max']}", fmt(d["forward_flops_per_step"] / 1e6),
            fmt(d["update_flops_per_step"] / 1e6), f"{100 * d['attention_share']:.0f}%", fmt(d["update_gflops"]),
            fmt(d["update_peak_pct"]),
        ])  # fmt: skip
    return markdown(rows, MAIN_HEADER)


def comparison_table(entries: list[dict[str, Any]], labels: list[str]) -> str:
    """Each setting on each checkout against the first checkout: steps/s, update and recompute time, % peak."""
    header = ["setting", "checkout", "steps/s", "speedup", "update s/1k", "update speedup", "recompute s/1k",
              "rollout s/1k", "% peak"]  # fmt: skip
    by_setting: dict[str, dict[str, dict]] = {}
    for e in entries:
        by_setting.setdefault(e["setting"], {})[e["label"]] = e
    rows = []
    for name, runs in by_setting.items():
        base = runs.get(labels[0])
        base_ok = base is not None and "derived" in base
        for label in labels:
            e = runs.get(label)
            if e is None or "derived" not in e:
                rows.append([name, label, *["-"] * (len(header) - 2)])
                continue
            r, s = e["result"], e["derived"]["per_1k_s"]
            speed = r["steps_per_s"] / base["result"]["steps_per_s"] if base_ok else None
            b_upd = base["derived"]["per_1k_s"]["update_s"] if base_ok else None
            upd = b_upd / s["update_s"] if b_upd and s["update_s"] else None
            rows.append([name, label, fmt(r["steps_per_s"]), f"{speed:.2f}x" if speed else "n/a", fmt(s["update_s"]),
                         f"{upd:.2f}x" if upd else "n/a", fmt(s["recompute_s"]), fmt(s["rollout_s"]),
                         fmt(e["derived"]["update_peak_pct"])])  # fmt: skip
    return markdown(rows, header)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def report(
    entries: list[dict], labels: list[str], checkouts: list[Path], peak: dict, argv: list[str], overrides: dict
) -> str:
    import torch

    rates = ", ".join(f"{n}: {r:.1f}" for n, r in peak["gflops"].items())
    command = "python lab/bench/throughput.py" + "".join(" " + shlex.quote(a) for a in argv)
    parts = [
        "# Training throughput (`lab/bench/throughput.py`)",
        "",
        f"- Machine: {cpu_model()}, {os.cpu_count()} logical CPUs; torch {torch.__version__}; one torch thread "
        f"(`torch_threads=1`, `OMP_NUM_THREADS=1`); {datetime.date.today().isoformat()}.",
        f"- Roofline: fp32 `torch.mm` on one thread, best GFLOP/s by size {rates}; peak {peak['peak_gflops']:.1f}.",
        "- Checkouts: " + ", ".join(f"`{label}` ({path})" for label, path in zip(labels, checkouts)) + ".",
        f"- Regenerate: `{command}`.",
        "- cpu: learn()'s process CPU time / wall time (below 100%: the core was shared). "
        "Times in s per 1,000 env steps (rollout = generate + env + bookkeeping; recompute n/a: inside rollout);"
        " prompt and width in tokens, mean/max; act tok: candidate tokens per row (choose) or response tokens"
        " (generate); MFLOP per env step (forward; update = n_epochs x 3 x forward); attn: attention's share of the"
        " forward; % peak: the update's FLOP/s against the roofline. What is counted: the script's docstring.",
        "",
        main_table(entries),
    ]
    if len(labels) > 1:
        against = f"Against `{labels[0]}` (speedup = its time / this one's):"
        parts += ["", against, "", comparison_table(entries, labels)]
    notes = sorted({f"- {e['setting']}: {e['result']['skipped']}" for e in entries if "skipped" in e["result"]})
    notes += [f"- {e['setting']} on `{e['label']}` failed: {e['result']['error']}" for e in entries
              if "error" in e["result"]]  # fmt: skip
    if notes:
        parts += ["", *notes]
    settings = sorted({e["setting"] for e in entries})
    parts += ["", "Settings:", ""] + [f"- `{s}`: {SETTINGS[s].env} {SETTINGS[s].env_kwargs}"
                                      f"{' ' + str(SETTINGS[s].config) if SETTINGS[s].config else ''}; "
                                      f"{SETTINGS[s].note}" for s in settings]  # fmt: skip
    if any(overrides.values()):
        parts.append(f"- Every setting above with the command's overrides: {overrides}")
    return "\n".join(parts) + "\n"


def readme_block(entries: list[dict], labels: list[str], peak: dict, argv: list[str]) -> str:
    """The docs' few lines (docs/benchmarks.md): the machine, the table(s), and where the full report is."""
    import torch

    command = "python lab/bench/throughput.py" + "".join(" " + shlex.quote(a) for a in argv)
    parts = [
        f"Measured on {cpu_model()}, torch {torch.__version__}, one thread; matmul roofline "
        f"{peak['peak_gflops']:.1f} GFLOP/s; `{command}` (columns and settings: `results/throughput/report.md`).",
        "",
        main_table(entries),
    ]
    if len(labels) > 1:
        parts += ["", comparison_table(entries, labels)]
    return "\n".join(parts)


def replace_readme_block(readme: Path, block: str) -> None:
    text = readme.read_text()
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        raise SystemExit(f"bench_throughput: {readme} has no {README_START} ... {README_END} block")
    readme.write_text(text[: start + len(README_START)] + "\n" + block.strip() + "\n" + text[end:])


def json_object(text: str, flag: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise SystemExit(f"bench_throughput: {flag} is not valid JSON: {err}") from None
    if not isinstance(value, dict):
        raise SystemExit(f"bench_throughput: {flag} must be a JSON object, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS), metavar="NAME",
                        help=f"settings to run (default: all): {', '.join(SETTINGS)}")  # fmt: skip
    parser.add_argument("--steps", type=int, help="learn(STEPS) for every setting (default: each setting's own)")
    parser.add_argument("--checkout", type=Path, action="append", help="a checkout to measure (repeatable)")
    parser.add_argument("--config", type=str, default="{}", help="GAGPOConfig overrides for every setting (JSON)")
    parser.add_argument("--env-kwargs", type=str, default="{}", help="env kwargs merged into every setting's (JSON)")
    parser.add_argument("--smollm2", type=Path, default=SMOLLM2, help="the SmolLM2-135M-Instruct folder")
    parser.add_argument("--peak-sizes", type=int, nargs="+", default=[512, 1024, 2048], help="matmul sizes")
    parser.add_argument("--timeout", type=float, help="seconds per setting and checkout")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "results" / "throughput" / "report.md", help="the Markdown report"
    )
    parser.add_argument("--json", type=Path, help="also write every number (per iteration too) as JSON")
    parser.add_argument("--readme", action="store_true", help="put the tables into the docs' throughput block")
    parser.add_argument("--child", choices=list(SETTINGS), help=argparse.SUPPRESS)
    parser.add_argument("--expect", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--model", default="tiny", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.config = json_object(args.config, "--config")
    args.env_kwargs = json_object(args.env_kwargs, "--env-kwargs")

    if args.child:
        root = locate_checkout(args.expect)
        print(f"bench_throughput: {args.child} on the checkout at {root}", file=sys.stderr)
        steps = args.steps if args.steps is not None else SETTINGS[args.child].steps
        result = run_child(args.child, steps, args.config, args.env_kwargs, args.model)
        result["checkout"] = str(root)
        print(RESULT_MARK + json.dumps(result), flush=True)
        return 0

    checkouts = [p.resolve() for p in (args.checkout or [ROOT])]
    for path in checkouts:
        if not (path / "agents" / "__init__.py").is_file():
            raise SystemExit(f"bench_throughput: {path} is not a checkout of this repository (no agents/)")
    labels = [git_label(p) for p in checkouts]
    if len(set(labels)) < len(labels):  # the same commit twice: tell them apart by position
        labels = [f"{label} ({k + 1})" for k, label in enumerate(labels)]
    smollm2_ok = all((args.smollm2 / f).is_file() for f in ("config.json", "model.safetensors", "tokenizer.json"))

    peaks = [matmul_peak(args.peak_sizes)]
    print(f"bench_throughput: matmul peak {peaks[0]['peak_gflops']:.1f} GFLOP/s (one thread)", file=sys.stderr)
    entries = []
    for name in args.settings:
        for path, label in zip(checkouts, labels):
            if SETTINGS[name].model == "smollm2" and not smollm2_ok:
                result = {"skipped": f"skipped: no SmolLM2 folder at {args.smollm2} (scripts/fetch_smollm2.py)"}
            else:
                result = spawn(name, path, args)
            entries.append({"setting": name, "label": label, "checkout": str(path), "result": result})
            status = result.get("skipped") or result.get("error") or (
                f"{result['num_timesteps']} steps, {result['steps_per_s']:.1f} steps/s, learn {result['learn_s']:.0f} s"
            )  # fmt: skip
            print(f"bench_throughput: {name} on {label}: {status}", file=sys.stderr)
    peaks.append(matmul_peak(args.peak_sizes))
    peak = max(peaks, key=lambda p: p["peak_gflops"])
    for e in entries:
        if "num_timesteps" in e["result"]:
            e["derived"] = derive(e["result"], peak["peak_gflops"])

    overrides = {"--steps": args.steps, "--env-kwargs": args.env_kwargs, "--config": args.config}
    text = report(entries, labels, checkouts, peak, argv, overrides)
    print(text, end="")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {"peak": peak, "peaks": peaks, "checkouts": dict(zip(labels, map(str, checkouts))),
                   "entries": entries, "argv": argv}  # fmt: skip
        args.json.write_text(json.dumps(payload, indent=1) + "\n")
    if args.readme:
        replace_readme_block(ROOT / "docs" / "benchmarks.md", readme_block(entries, labels, peak, argv))
    failed = any("error" in e["result"] for e in entries)
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
