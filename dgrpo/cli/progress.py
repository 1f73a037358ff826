"""What a user watching a run sees: a live progress bar and a per-step table (rich)."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console, Group
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from schemas.run_state import RunStatus


def _reward(mean: float | None, std: float | None) -> str:
    if mean is None:
        return "-"
    return f"{mean:.3f}" + (f" ± {std:.3f}" if std is not None else "")


def history_table(status: RunStatus) -> Table:
    table = Table(title=f"run {status.run_id}: reward per step", title_justify="left")
    for col in ("step", "reward (mean ± std)", "policy", "loss", "trajectories", "seconds"):
        table.add_column(col, justify="right")
    for h in status.history:
        table.add_row(
            str(h.step),
            _reward(h.reward_mean, h.reward_std),
            str(h.policy_step),
            "-" if h.loss is None else f"{h.loss:.4f}",
            str(h.n_trajectories),
            f"{h.seconds.get('step', 0.0):.0f}",
        )
    return table


def status_summary(status: RunStatus) -> str:
    flags = [f for f, on in (("paused", status.paused), ("stopping", status.stopping)) if on]
    lines = [
        f"run {status.run_id} ({status.mode}): step {status.step}/{status.steps}, phase {status.phase}"
        + (f" (working on step {status.working_on})" if status.working_on else "")
        + (f" [{', '.join(flags)}]" if flags else ""),
        f"served adapter: {status.adapter or '-'}",
        f"last checkpoint: {status.last_checkpoint.uri if status.last_checkpoint else '-'}",
    ]
    if status.dropped_stale_groups:
        lines.append(f"groups dropped as stale: {status.dropped_stale_groups}")
    if status.error:
        lines.append(f"error: {status.error}")
    return "\n".join(lines)


def status_view(status: RunStatus) -> Group:
    return Group(status_summary(status), history_table(status))


class RunProgress:
    """A live bar: steps served of all, the phase in progress, the newest step's reward.

    Where the console is no terminal (output to a file or a pipe) a live bar draws nothing until the end,
    so each newly served step is printed as a line instead.
    """

    def __init__(self, console: Console | None = None) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[phase]:<10}"),
            TextColumn("reward {task.fields[reward]}"),
            TimeElapsedColumn(),
            console=console,
        )
        self.task: TaskID | None = None
        self.lines = not self.progress.console.is_terminal
        self.printed_step = 0

    def __enter__(self) -> RunProgress:
        self.progress.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.progress.__exit__(exc_type, exc, tb)

    def update(self, status: RunStatus) -> None:
        last = status.history[-1] if status.history else None
        reward = _reward(last.reward_mean, last.reward_std) if last else "-"
        phase = status.phase if not status.working_on else f"{status.phase} (step {status.working_on})"
        if self.task is None:
            self.task = self.progress.add_task(status.run_id, total=status.steps, phase=phase, reward=reward)
        self.progress.update(self.task, total=status.steps, completed=status.step, phase=phase, reward=reward)
        if self.lines and status.step > self.printed_step:
            self.printed_step = status.step
            self.progress.console.print(
                f"{status.run_id}: step {status.step}/{status.steps} served, reward {reward}"
            )
