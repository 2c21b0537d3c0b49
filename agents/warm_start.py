"""A language prior for the tiny model: supervised next-token training on a noisy expert's transcripts.

An instruct model arrives at ALFWorld already reading the task; a tiny model built from a config does not. The
warm start gives it a comparable starting point: it plays training tasks with the env's expert, which takes a
random admissible action with probability ``epsilon``, and trains the model to predict the expert's action at each
step (also where the random one was played) after the exact prompt the agent will show it (same template, history,
memory and admissible list). The result is a folder
that ``GAGPOAgent(env, model=path)`` fine-tunes with :data:`FINE_TUNE`'s settings; its ``prior.json`` records how it
was made, the prompt settings it was trained with and its action mode. A prior for choose mode learns to score the
expert's command; one for generate mode learns to write it, as the tagged answer generate mode parses
(:func:`wrappers.tagged_response`), and may start from a choose-mode prior (``model``) that already knows the commands.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_model, save_model

from agents.callbacks import ProgressBar
from agents.checkpoint import quiet_hub
from agents.demonstrations import Demonstration, policy_demonstrations, read_demonstrations
from agents.env_spec import text_wrapping
from agents.gagpo import GAGPOAgent
from agents.policy import ChooseMode, distinct_actions
from agents.prior import FINE_TUNE, PRIOR_FILE, PROMPT_FIELDS, read_prior
from wrappers import CHOOSE, GENERATE, PlaceMemory, check_action_mode, tagged_response

#: Warm-start losses (:func:`supervised_epochs`).
OBJECTIVES = ("tokens", "choice")


def answer_format(action_mode: str) -> Callable[[str], str]:
    """The text an agent in ``action_mode`` answers to play a command: the tagged answer in generate mode."""
    return tagged_response if action_mode == GENERATE else str


@dataclass
class Transcript:
    """The (prompt, action) pairs of noisy-expert episodes, and how those episodes went."""

    prompts: list[list[int]] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)  # the expert's choice at each prompt: the labels
    played: list[str] = field(default_factory=list)  # what was played there (a random action with prob. epsilon)
    admissible: list[list[str]] = field(default_factory=list)  # the candidates each action was chosen from
    tasks: list[int] = field(default_factory=list)  # each episode's task seed, in play order
    lengths: list[int] = field(default_factory=list)  # each episode's steps (its prompts, in order)
    episodes: int = 0
    won: int = 0
    expert_steps: int = 0


def noisy_expert_transcripts(
    agent: Any,
    episodes: int,
    epsilon: float,
    rng: np.random.Generator,
    expert: str = "oracle",
    progress: Callable[[int], None] | None = None,
) -> Transcript:
    """Play ``episodes`` training tasks (the agent's task pool) with the expert, random with probability epsilon.

    Every step is labelled with the expert's choice, also where a random action is played: the noise spreads the
    states the prior learns from (what a policy of its own will run into), never what it learns to do there.

    ``expert``: ``"oracle"``, the env's ``expert_action()``; another kind is asked for by name
    (``expert_action(kind)``) from envs that list it in their ``EXPERTS`` (MiniHouse: ``"search"``, an expert that
    knows only what the transcript shows, and ``"sweep"``, one that remembers no place). ``progress(1)`` is called
    after each episode.
    """
    env = agent.env_spec.make(text_wrapping(agent.config))
    play = answer_format(agent.config.action_mode)  # the env's wrappers parse the agent's mode's answers
    pool = agent.config.task_pool or 2**31 - 1
    out = Transcript()
    try:
        kinds = getattr(env.unwrapped, "EXPERTS", ()) or ("oracle",)
        if expert != "oracle" and expert not in kinds:  # "oracle": whatever the env's expert_action() plays
            raise ValueError(f"{agent.env_id} has no {expert!r} expert; its experts: {', '.join(kinds)}")
        ask = {} if expert == "oracle" else {"kind": expert}  # "oracle": the env's default expert
        for _ in range(episodes):
            out.tasks.append(int(rng.integers(pool)))
            obs, info = env.reset(seed=out.tasks[-1])
            done, start = False, len(out.actions)
            while not done:
                admissible = list(info.get("admissible_actions", []))
                if not admissible:
                    raise ValueError(f"{agent.env_id}: the warm start needs admissible actions at every step")
                try:
                    label = env.unwrapped.expert_action(**ask)
                except NotImplementedError as err:
                    raise ValueError(f"{agent.env_id} has no expert: the warm start imitates one") from err
                if rng.random() < epsilon:
                    action = admissible[int(rng.integers(len(admissible)))]
                else:
                    action = label
                    out.expert_steps += 1
                out.prompts.append(agent.prompts.for_step(obs, info))
                out.actions.append(label)
                out.played.append(action)
                out.admissible.append(admissible)
                obs, _, terminated, truncated, info = env.step(play(action))
                done = terminated or truncated
            out.episodes += 1
            out.lengths.append(len(out.actions) - start)
            out.won += bool(info["episode"]["won"])  # wrappers.EpisodeStatistics' record of the episode
            if progress is not None:
                progress(1)
    finally:
        env.close()
    return out


def expert_agreement(agent: Any, n_tasks: int, seed_offset: int, expert: str = "oracle") -> dict[str, Any]:
    """Teacher-forced agreement of the agent's greedy choice with the expert's, per action kind (a command's
    first word: "go", "take", "open"...), on tasks ``seed_offset..seed_offset + n_tasks - 1``.

    The expert plays every step, so each decision is scored at a state the expert reaches, with the prompt the
    agent would be shown there (its wrappers: history, memory); a greedy panel's success compounds these.
    """
    env = agent.env_spec.make(text_wrapping(agent.config))
    play = answer_format(agent.config.action_mode)
    ask = {} if expert == "oracle" else {"kind": expert}
    agree: dict[str, int] = {}
    total: dict[str, int] = {}
    try:
        for seed in range(seed_offset, seed_offset + n_tasks):
            obs, info = env.reset(seed=seed)
            done = False
            while not done:
                label = env.unwrapped.expert_action(**ask)
                kind = label.split(" ", 1)[0]
                total[kind] = total.get(kind, 0) + 1
                agree[kind] = agree.get(kind, 0) + (agent.predict(obs, info, deterministic=True)[0] == label)
                obs, _, terminated, truncated, info = env.step(play(label))
                done = terminated or truncated
    finally:
        env.close()
    return {
        "all": sum(agree.values()) / max(1, sum(total.values())),
        "per_kind": {k: agree[k] / total[k] for k in sorted(total, key=total.get, reverse=True)},
        "decisions": dict(sorted(total.items(), key=lambda kv: -kv[1])),
    }


def supervised_epochs(
    policy: Any,
    data: Transcript,
    *,
    epochs: int,
    learning_rate: float,
    batch_size: int,
    rng: np.random.Generator,
    objective: str = "tokens",
    action_mode: str = CHOOSE,
    progress: Any = None,
    resume: tuple[list[float], dict[str, Any], dict[str, Any] | None] | None = None,
    checkpoint: Callable[[list[float], torch.optim.Optimizer, dict[str, Any] | None], None] | None = None,
    checkpoint_due: Callable[[], bool] | None = None,
) -> list[float]:
    """Train on the expert's actions given their prompts; returns the mean loss per epoch.

    ``objective``:

    * ``"tokens"``: next-token cross-entropy on each action's tokens (and its end token), the negative mean token
      log-prob of the action.
    * ``"choice"``: that, plus the cross-entropy of choose mode's own policy (the softmax over the admissible
      actions' scores, ``choose_score`` as configured) at the expert's action: it trains exactly the choice the agent
      makes, where the token loss spends most of its signal on the words the candidates share ("go to").

    ``action_mode`` :data:`GENERATE` trains the tokens of the tagged answer that plays the expert's action (the token
    objective only: the choice loss is choose mode's policy).

    Both are computed by the policy's own packed forward. ``progress`` (an :class:`agents.callbacks.ProgressBar`)
    is advanced by the actions trained on and says the epoch and its running loss.

    ``checkpoint(losses, optimizer, within)`` is called after every epoch (``within`` None) and, where
    ``checkpoint_due()`` says so after a batch, within one: ``within`` is the epoch's place (the generator's state
    that drew its order, the next row, the running loss). ``resume``: the ``(losses, optimizer state, within)`` of a
    stopped fit's last checkpoint; with ``rng`` as it was then, the fit goes on as if never stopped.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    check_action_mode(action_mode)
    if action_mode == GENERATE and objective != "tokens":
        raise ValueError(f"generate mode trains the 'tokens' objective (the answer's text), got {objective!r}")
    # Both losses are sequence log-probs of texts after their prompts: choose mode's packed scorer computes them in
    # either mode (one candidate per prompt for the token loss).
    chooser = policy.actions if isinstance(policy.actions, ChooseMode) else ChooseMode(policy, "sum")
    respond = answer_format(action_mode)
    optimizer = torch.optim.AdamW([p for p in policy.core.parameters() if p.requires_grad], lr=learning_rate)
    if objective == "tokens":
        candidates = [[policy.action_tokens(respond(a))] for a in data.actions]
        expert = [0] * len(data.actions)
    else:
        # each distinct action once, as choose mode scores them (a listed duplicate would double its probability)
        distinct = [distinct_actions(cands) for cands in data.admissible]
        candidates = [[policy.action_tokens(a) for a in cands] for cands in distinct]
        expert = [cands.index(a) for a, cands in zip(data.actions, distinct)]
    losses: list[float] = []
    within: dict[str, Any] | None = None
    if resume is not None:
        losses, within = list(resume[0]), resume[2]
        optimizer.load_state_dict(resume[1])
    policy.train()
    for epoch in range(len(losses), epochs):
        if within is None:
            within = {"rng": rng.bit_generator.state, "next": 0, "total": 0.0, "seen": 0}
            order = rng.permutation(len(data.actions))
        else:  # a resumed epoch: its order drawn again from the generator's state then (``rng`` is past it)
            drawn = np.random.Generator(type(rng.bit_generator)())
            drawn.bit_generator.state = within["rng"]
            order = drawn.permutation(len(data.actions))
        total, seen = within["total"], within["seen"]
        for start in range(within["next"], len(order), batch_size):
            rows = order[start : start + batch_size]
            with policy.precision.autocast():
                seq, counts, _ = chooser.score_candidates(
                    [data.prompts[i] for i in rows], [candidates[i] for i in rows]
                )
            picked = [expert[i] for i in rows]
            loss = -torch.stack([s[k] / n[k] for s, n, k in zip(seq, counts, picked)]).mean()
            if objective == "choice":
                choice = [chooser.choice_log_probs(s, n)[k] for s, n, k in zip(seq, counts, picked)]
                loss = loss - torch.stack(choice).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.core.parameters(), 1.0)
            optimizer.step()
            total += loss.item() * len(rows)
            seen += len(rows)
            if progress is not None:
                progress.set_description(f"warm start: epoch {epoch + 1}/{epochs}, loss {total / seen:.3f}")
                progress.advance(len(rows))
            if checkpoint is not None and checkpoint_due is not None and seen < len(order) and checkpoint_due():
                checkpoint(losses, optimizer, {**within, "next": start + batch_size, "total": total, "seen": seen})
        losses.append(total / len(order))
        within = None
        if checkpoint is not None:
            checkpoint(losses, optimizer, None)
    policy.eval()
    return losses


def save_prior(agent: GAGPOAgent, out: str | Path, record: dict[str, Any]) -> None:
    """Write the agent's model and tokenizer with ``record`` as ``prior.json`` at ``out``: a prior folder."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with quiet_hub():
        agent.policy.model.save_pretrained(out)
        agent.policy.tokenizer.save_pretrained(out)
    (out / PRIOR_FILE).write_text(json.dumps(record, indent=2))
    agent.close()


def warm_start(
    env: str,
    out: str | Path,
    *,
    model: str | Path = "tiny",
    action_mode: str = CHOOSE,
    env_kwargs: dict[str, Any] | None = None,
    episodes: int = 400,
    epsilon: float = 0.3,
    epochs: int = 10,
    learning_rate: float = 1e-3,
    batch_size: int = 32,
    seed: int = 0,
    verbose: int = 1,
    expert: str = "oracle",
    objective: str = "tokens",
    progress: bool | None = None,
    **config: Any,
) -> dict[str, Any]:
    """Train the tiny model on ``episodes`` noisy-expert episodes of training tasks and save it at ``out``.

    ``model``: ``"tiny"`` (a fresh tiny model) or a prior's folder to go on from (its prompt settings and fine-tuning
    additions carry over unless ``config`` sets others). ``action_mode``: the mode the prior is for (the prompt's
    instruction and what is trained: :func:`supervised_epochs`); agents built on it act in that mode by default.

    ``expert``: whose transcripts (see :func:`noisy_expert_transcripts`): ``"oracle"`` (the env's expert) or, on
    MiniHouse, ``"search"`` (it searches for the objects instead of knowing where they are). ``objective``: the
    loss (:func:`supervised_epochs`).

    ``config`` holds agent hyperparameters that shape the prior (``task_pool``: the training tasks;
    ``history_length`` and other prompt settings; the tiny model's size). Returns the record written to
    ``out/prior.json``. ``progress``: progress bars on stderr for the expert episodes and the epochs (``None``:
    when ``verbose`` and stderr is a terminal; see :class:`agents.callbacks.ProgressBar`).
    """
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
    if objective not in OBJECTIVES:  # before the transcripts are played, not after
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if episodes < 1 or epochs < 1 or batch_size < 1:
        raise ValueError("episodes, epochs and batch_size must be >= 1")
    check_action_mode(action_mode)
    if action_mode == GENERATE and objective != "tokens":
        raise ValueError(f"generate mode trains the 'tokens' objective (the answer's text), got {objective!r}")
    parent = read_prior(model) if model != "tiny" else None
    if model != "tiny" and parent is None:
        raise ValueError(f"model must be 'tiny' or a warm-start prior's folder (with {PRIOR_FILE}), got {model!r}")
    started = time.perf_counter()
    # The choice objective trains the ranking that fine-tuning will use: FINE_TUNE's scoring unless told otherwise.
    config = {"choose_score": FINE_TUNE["choose_score"], **config}
    agent = GAGPOAgent(env, str(model), env_kwargs=env_kwargs, seed=seed, verbose=0, action_mode=action_mode, **config)
    rng = np.random.default_rng(seed)
    show = progress if progress is not None else (None if verbose else False)
    with ProgressBar(episodes, f"warm start: {expert} expert episodes", unit="episode", enabled=show) as bar:
        data = noisy_expert_transcripts(agent, episodes, epsilon, rng, expert, progress=bar.advance)
    collect_s = time.perf_counter() - started
    with ProgressBar(epochs * len(data.actions), "warm start: epoch 1", unit="action", enabled=show) as bar:
        losses = supervised_epochs(
            agent.policy, data, epochs=epochs, learning_rate=learning_rate, batch_size=batch_size, rng=rng,
            objective=objective, action_mode=action_mode, progress=bar,
        )  # fmt: skip
    c = agent.config
    record = {
        "model": str(model),
        "action_mode": action_mode,
        "env_id": agent.env_id,
        "env_kwargs": agent.env_kwargs,
        "task_pool": c.task_pool,
        "episodes": episodes,
        "epsilon": epsilon,
        "expert": expert,
        "objective": objective,
        "epochs": epochs,
        "learning_rate": learning_rate,
        "batch_size": batch_size,
        "seed": seed,
        "actions": len(data.actions),
        "expert_share": data.expert_steps / max(1, len(data.actions)),
        "transcript_success": data.won / max(1, data.episodes),
        "losses": losses,
        "prompt": {k: getattr(c, k) for k in PROMPT_FIELDS},
        # A parent prior's additions (the committed full-house priors' episode term) stay; the mode is this one's.
        "fine_tune": {**FINE_TUNE, **(parent or {}).get("fine_tune", {}), "action_mode": action_mode},
        "collect_s": collect_s,
        "train_s": time.perf_counter() - started - collect_s,
    }
    save_prior(agent, out, record)
    if verbose:
        print(
            f"warm start: {len(data.actions)} actions from {episodes} {expert} episodes (epsilon {epsilon}, transcript "
            f"success {record['transcript_success']:.2f}); loss {losses[0]:.3f} -> {losses[-1]:.3f}; "
            f"{record['collect_s'] + record['train_s']:.0f}s; saved {out}"
        )
    return record


def step_prompts(agent: Any, demo: Demonstration) -> list[list[int]]:
    """The prompt the agent is shown at each step of ``demo``, built as its wrappers build it while it plays: the
    last ``history_length`` (observation, played command) pairs, the memory of every observation so far."""
    c = agent.config
    k = c.history_length
    places = PlaceMemory()  # folded one observation a step, as the Memory wrapper does
    prompts = []
    for t, obs in enumerate(demo.observations):
        history = [[o, a] for o, a in zip(demo.observations[max(0, t - k) : t], demo.played[max(0, t - k) : t])]
        places.observe(obs)
        memory = places.render() if c.memory else ""
        info = {"task": demo.task, "admissible_actions": demo.admissible[t]}
        prompts.append(agent.prompts.for_step(obs, info, history, memory, t))
    return prompts


def transcript_of(agent: Any, demos: Iterable[Demonstration]) -> Transcript:
    """The (prompt, expert command) pairs of ``demos`` as a :class:`Transcript` for the agent's
    prompt settings; steps where the expert gave no advice, or advised a command that was not admissible, are
    left out."""
    out = Transcript()
    for demo in demos:
        prompts = step_prompts(agent, demo)
        kept = 0
        for t, prompt in enumerate(prompts):
            if not demo.advised[t] or demo.labels[t] not in demo.admissible[t]:
                continue
            out.prompts.append(prompt)
            out.actions.append(demo.labels[t])
            out.played.append(demo.played[t])
            out.admissible.append(demo.admissible[t])
            out.expert_steps += demo.labels[t] == demo.played[t]
            kept += 1
        out.tasks.append(demo.seed)
        out.lengths.append(kept)
        out.episodes += 1
        out.won += demo.won
    return out


def _relative(path: str | Path) -> str:
    """``path`` relative to the working directory where it lies below it (a record reads the same on any machine)."""
    path = Path(path).resolve()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def fresh_tiny(folder: str | Path, demos: Sequence[Any], seed: int, config: dict[str, Any]) -> str:
    """A fresh tiny model whose tokenizer is trained on the demonstrations' text (tasks, observations, admissible
    commands), saved at ``folder`` as a bare prior; returns the folder."""
    from agents.config import GAGPOConfig
    from agents.models import tiny_spec
    from agents.tiny import build_tiny_model, train_tokenizer

    c = GAGPOConfig.from_dict({**config, "seed": seed}).resolved(True, accelerator=False)
    texts = [d.task for d in demos] + [o for d in demos for o in d.observations]
    texts += [" | ".join(a) for d in demos for a in d.admissible]
    tokenizer = train_tokenizer(texts, c.tiny_vocab_size)
    with quiet_hub():
        build_tiny_model(tokenizer, tiny_spec(c), seed=seed).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    fields = {k: v for k, v in config.items() if k in PROMPT_FIELDS}
    (Path(folder) / PRIOR_FILE).write_text(json.dumps({"model": "tiny", "prompt": fields, "fine_tune": FINE_TUNE}))
    return str(folder)


class ImitationProgress:
    """Where a long imitation run stands, kept in ``<out>/progress`` after every epoch and every few minutes within
    one: the weights, the optimizer state of the fit in progress and its place in the epoch, the numpy generator, the
    finished rounds and the policy's episodes so far.

    Imitation on the real train split runs for hours; a stopped run started again with the same settings goes on
    from its last save and ends as the uninterrupted run would, bit for bit (same CPU and threads). Other
    settings are refused: their progress is not this run's. ``<out>/start`` keeps a fresh tiny model's start (its
    tokenizer is trained on the demonstrations), so that a resumed run builds the same one.
    """

    def __init__(self, out: Path, settings: dict[str, Any]) -> None:
        self.out = out
        self.folder = out / "progress"
        self.start = out / "start"
        text = json.dumps(settings, sort_keys=True, default=str)
        self.fingerprint = hashlib.sha256(text.encode()).hexdigest()

    def _slots(self) -> list[Path]:
        # save() swaps a complete new slot in: a stop between its two renames leaves .new and .old, both complete
        return [self.folder, self.folder.with_name("progress.new"), self.folder.with_name("progress.old")]

    def load(self, agent: GAGPOAgent, rng: np.random.Generator) -> dict[str, Any] | None:
        """The saved state (weights loaded into ``agent``, ``rng`` set), or None where the run starts afresh."""
        folder = next((f for f in self._slots() if (f / "state.json").is_file()), None)
        if folder is None:
            return None
        state = json.loads((folder / "state.json").read_text())
        if state["fingerprint"] != self.fingerprint:
            raise ValueError(
                f"{self.out} holds a stopped imitation run of other settings: remove {folder} to start this one "
                "there, or write it elsewhere"
            )
        load_model(agent.policy.model, str(folder / "model.safetensors"))
        rng.bit_generator.state = state["rng"]
        optimizer = folder / "optimizer.pt"
        state["optimizer"] = torch.load(optimizer, weights_only=True) if optimizer.is_file() else None
        state["played"] = [Demonstration.from_dict(d) for d in state["played"]]
        return state

    def save(self, agent: GAGPOAgent, rng: np.random.Generator, optimizer: torch.optim.Optimizer | None,
             **state: Any) -> None:  # fmt: skip
        """Write the state (``rounds``, ``played``, ``current``: the round being fitted, ``elapsed``) atomically."""
        live, new, old = self._slots()
        shutil.rmtree(new, ignore_errors=True)
        new.mkdir(parents=True)
        save_model(agent.policy.model, str(new / "model.safetensors"))
        if optimizer is not None:
            torch.save(optimizer.state_dict(), new / "optimizer.pt")
        state["played"] = [asdict(d) for d in state["played"]]
        record = {"fingerprint": self.fingerprint, "rng": rng.bit_generator.state, **state}
        (new / "state.json").write_text(json.dumps(record))
        shutil.rmtree(old, ignore_errors=True)
        if live.exists():
            live.rename(old)
        new.rename(live)
        shutil.rmtree(old, ignore_errors=True)

    def clear(self) -> None:
        for folder in (*self._slots(), self.start):
            shutil.rmtree(folder, ignore_errors=True)


def imitate(
    env: str,
    out: str | Path,
    demonstrations: str | Path,
    seeds: Sequence[int],
    *,
    model: str | Path = "tiny",
    env_kwargs: dict[str, Any] | None = None,
    expert: str | None = None,
    action_mode: str = CHOOSE,
    objective: str = "choice",
    epochs: int = 4,
    learning_rate: float = 1e-3,
    batch_size: int = 16,
    seed: int = 0,
    dagger_rounds: int = 0,
    dagger_episodes: int = 200,
    beta: float = 0.0,
    heldout: Sequence[int] | None = None,
    log: Callable[[str], None] | None = None,
    checkpoint_every_s: float = 600.0,
    **config: Any,
) -> dict[str, Any]:
    """Behaviour cloning on the cached expert episodes of ``seeds`` (:mod:`agents.demonstrations`), then
    ``dagger_rounds`` DAgger rounds; writes a prior folder at ``out`` and returns its record.

    Each DAgger round, the policy plays ``dagger_episodes`` tasks drawn from ``seeds`` (greedy; the expert's own
    command with probability ``beta``), the expert labels every state it reached, and the policy trains ``epochs``
    more passes on the expert's episodes and every round's so far. ``heldout``: task seeds (never in ``seeds``)
    played greedily once at the end. ``config``: agent hyperparameters (prompt settings, the tiny model's size).
    The run saves its state after every epoch and every ``checkpoint_every_s`` seconds within one; called again with
    the same arguments, a stopped run resumes from its last save (:class:`ImitationProgress`). ``log`` gets a line
    at every save (the round, the epoch, its loss so far, the run's time so far) and one on resuming.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if epochs < 1 or batch_size < 1 or dagger_rounds < 0 or dagger_episodes < 1:
        raise ValueError("epochs, batch_size and dagger_episodes must be >= 1, dagger_rounds >= 0")
    if heldout is not None and set(heldout) & set(seeds):
        raise ValueError("the held-out seeds must not be training seeds")
    if heldout is not None and list(heldout) != list(range(heldout[0], heldout[0] + len(heldout))):
        raise ValueError("the held-out seeds must be consecutive: a panel is seeds start..start+n-1")
    started = time.perf_counter()
    demos = read_demonstrations(demonstrations, seeds)
    config = {"choose_score": FINE_TUNE["choose_score"], **config}
    settings = {
        "env": env, "env_kwargs": env_kwargs, "demonstrations": str(Path(demonstrations).resolve()),
        "seeds": list(seeds), "model": str(model), "expert": expert, "action_mode": action_mode,
        "objective": objective, "epochs": epochs, "learning_rate": learning_rate, "batch_size": batch_size,
        "seed": seed, "dagger_rounds": dagger_rounds, "dagger_episodes": dagger_episodes, "beta": beta,
        "config": config,
    }  # fmt: skip
    saved = ImitationProgress(Path(out), settings)
    start = str(model)
    if start == "tiny":
        # A fresh tiny model's tokenizer learns the demonstrations' own text (the agent would play the env for it)
        if not (saved.start / PRIOR_FILE).is_file():  # fresh_tiny writes its prior.json last
            saved.start.mkdir(parents=True, exist_ok=True)
            fresh_tiny(saved.start, demos, seed, config)
        start = str(saved.start)
    agent = GAGPOAgent(env, start, env_kwargs=env_kwargs, seed=seed, verbose=0, action_mode=action_mode, **config)
    rng = np.random.default_rng(seed)
    state = saved.load(agent, rng)
    if state is not None and log is not None:
        fitting = state["current"] or {"losses": [], "within": None}
        place = f", and {fitting['within']['seen']} actions of the next" if fitting["within"] else ""
        log(f"resuming the stopped run in {saved.out}: {len(state['rounds'])} round(s) and "
            f"{len(fitting['losses'])} epoch(s) done{place}")  # fmt: skip
    state = state or {"rounds": [], "played": [], "current": None, "elapsed": 0.0}
    rounds: list[dict[str, Any]] = state["rounds"]
    played: list[Demonstration] = state["played"]
    current: dict[str, Any] = state["current"] or {}

    last_save = time.perf_counter()

    def save(optimizer: torch.optim.Optimizer | None = None, **fitting: Any) -> None:
        nonlocal last_save
        last_save = time.perf_counter()
        elapsed = state["elapsed"] + last_save - started
        saved.save(agent, rng, optimizer, rounds=rounds, played=played, current=fitting or None, elapsed=elapsed)
        if fitting and log is not None:
            losses, within = fitting["losses"], fitting["within"]
            if within is None:
                where = f"epoch {len(losses)}/{epochs}: loss {losses[-1]:.4f} ({fitting['actions']} actions"
            else:
                where = (f"epoch {len(losses) + 1}/{epochs}: loss {within['total'] / within['seen']:.4f} "
                         f"({within['seen']} of {fitting['actions']} actions")  # fmt: skip
            log(f"round {fitting['round']}, {where}, {elapsed:.0f}s so far)")

    for r in range(len(rounds), dagger_rounds + 1):
        resume = None
        if current.get("round") == r:  # stopped within this round's fit: its episodes and finished epochs are kept
            resume = (current.pop("losses"), state["optimizer"], current.pop("within"))
        elif r == 0:
            current = {"round": 0, "episodes": len(demos)}
        else:
            drawn = [int(s) for s in rng.choice(np.asarray(seeds), size=dagger_episodes, replace=False)]
            new = policy_demonstrations(agent, drawn, expert=expert, beta=beta)
            played += new
            current = {"round": r, "episodes": len(new), "policy_success": sum(d.won for d in new) / len(new)}
        data = transcript_of(agent, demos + played)
        current["actions"] = len(data.actions)
        losses = supervised_epochs(
            agent.policy, data, epochs=epochs, learning_rate=learning_rate, batch_size=batch_size, rng=rng,
            objective=objective, action_mode=action_mode, resume=resume,
            checkpoint=lambda losses, optimizer, within, fitting=current: save(
                optimizer, **fitting, losses=losses, within=within
            ),
            checkpoint_due=lambda: time.perf_counter() - last_save >= checkpoint_every_s,
        )  # fmt: skip
        rounds.append({**current, "losses": losses})
        current = {}
        save()
    train_s = state["elapsed"] + time.perf_counter() - started
    c = agent.config
    record: dict[str, Any] = {
        "model": str(model),
        "action_mode": action_mode,
        "env_id": agent.env_id,
        "env_kwargs": agent.env_kwargs,
        "demonstrations": _relative(demonstrations),  # where the cache was, as the command named it
        "expert": expert,
        "objective": objective,
        "seeds": f"{min(seeds)}..{max(seeds)} ({len(seeds)} tasks)",
        "distinct_tasks": len({d.seed for d in demos} | {d.seed for d in played}),
        "expert_success": sum(d.won for d in demos) / max(1, len(demos)),
        "epochs": epochs,
        "learning_rate": learning_rate,
        "batch_size": batch_size,
        "seed": seed,
        "dagger_rounds": dagger_rounds,
        "beta": beta,
        "rounds": rounds,
        "parameters": sum(p.numel() for p in agent.policy.core.parameters()),
        "tiny": {"hidden_size": c.tiny_hidden_size, "layers": c.tiny_layers},
        "prompt": {k: getattr(c, k) for k in PROMPT_FIELDS},
        # as the warm start's: a parent prior's fine-tuning additions (the MiniHouse priors' episode term) stay
        "fine_tune": {**FINE_TUNE, **(read_prior(model) or {}).get("fine_tune", {}), "action_mode": action_mode},
        "train_s": train_s,
    }
    if heldout is not None:
        t0 = time.perf_counter()
        heldout = list(heldout)
        m = agent.evaluate(n_tasks=len(heldout), seed_offset=heldout[0], batch_size=16)
        record["heldout"] = {
            "seeds": f"{heldout[0]}..{heldout[-1]}", "greedy_success": m["success_rate"],
            "mean_length": m["mean_length"], "per_type": m["per_type"], "eval_s": time.perf_counter() - t0,
        }  # fmt: skip
    save_prior(agent, out, record)
    saved.clear()
    return record
