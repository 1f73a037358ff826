"""Benchmark: our trajectory Parquet against JSON Lines (plain and zstd) on realistic trajectories.

    python bench/trajectory_store.py --n 10000

Each trajectory is a multi-turn chat (system, user, two sampled assistant choices with a tool result
between them); each choice carries ~64 completion token ids with their logprobs and its prompt token
ids, as vLLM returns them. Groups hold 8 trajectories. Prints a markdown table of sizes and CPU seconds
(process time, best of ``--repeat``), each with its ratio to our Parquet.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from activities import trajectory_store as ts
from schemas.trajectory import Choice, ChoiceLogprobs, TokenLogprob, Trajectory, TrajectoryGroup

WORDS = "the board move left right up down merge tile score best next state game agent plan try".split()


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def choice(rng: random.Random, prompt_len: int, content: str) -> Choice:
    n = rng.randint(48, 80)
    ids = [rng.randrange(49152) for _ in range(n)]
    return Choice(
        finish_reason="stop",
        message={"role": "assistant", "content": content},
        logprobs=ChoiceLogprobs(
            content=[TokenLogprob(token=f"token_id:{i}", logprob=-rng.expovariate(2.0)) for i in ids]
        ),
        token_ids=ids,
        prompt_token_ids=[rng.randrange(49152) for _ in range(prompt_len)],
    )


def trajectory(rng: random.Random, i: int) -> Trajectory:
    return Trajectory(
        messages_and_choices=[
            {"role": "system", "content": "You are an agent playing 2048. " + sentence(rng, 30)},
            {"role": "user", "content": sentence(rng, 40)},
            choice(rng, 150, sentence(rng, 40)),
            {"role": "tool", "tool_call_id": f"call_{i}", "content": sentence(rng, 25)},
            choice(rng, 300, sentence(rng, 40)),
        ],
        reward=rng.random(),
        metrics={"moves": rng.randint(1, 50), "won": rng.random() < 0.3},
        metadata={"scenario": f"s{i // 8}", "difficulty": rng.choice(["easy", "hard"])},
        policy_step=7,
    )


def make_groups(n: int, seed: int = 0) -> list[TrajectoryGroup]:
    rng = random.Random(seed)
    trajs = [trajectory(rng, i) for i in range(n)]
    return [TrajectoryGroup(trajs[i : i + 8], metadata={"scenario": f"s{i // 8}"}) for i in range(0, n, 8)]


def timed(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()  # CPU time: steady on a shared, busy machine
        fn()
        best = min(best, time.process_time() - start)
    return best


def write_jsonl(groups: list[TrajectoryGroup], path: Path, zstd: bool) -> None:
    data = "".join(g.model_dump_json() + "\n" for g in groups).encode()
    path.write_bytes(pa.compress(data, "zstd", asbytes=True) if zstd else data)


def read_jsonl(path: Path, zstd: bool, raw_size: int) -> list[TrajectoryGroup]:
    data = path.read_bytes()
    if zstd:
        data = pa.decompress(data, raw_size, "zstd", asbytes=True)
    return [TrajectoryGroup.model_validate_json(line) for line in data.splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="trajectories (groups of 8)")
    parser.add_argument("--repeat", type=int, default=2, help="timing runs; the best is reported")
    args = parser.parse_args()

    groups = make_groups(args.n)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        parquet, jsonl, jsonl_zst = d / "t.parquet", d / "t.jsonl", d / "t.jsonl.zst"
        rows = []

        w = timed(lambda: ts.write_groups(groups, parquet), args.repeat)
        r = timed(lambda: ts.read_groups(parquet), args.repeat)
        assert [g.model_dump_json() for g in ts.read_groups(parquet)] == [g.model_dump_json() for g in groups]
        rewards = timed(lambda: pq.read_table(parquet, columns=["group_index", "reward"]), args.repeat)
        rows.append(("Parquet (zstd, ours)", parquet.stat().st_size, w, r, rewards))

        w = timed(lambda: write_jsonl(groups, jsonl, zstd=False), args.repeat)
        raw = jsonl.stat().st_size
        r = timed(lambda: read_jsonl(jsonl, False, raw), args.repeat)
        rows.append(("JSON Lines", raw, w, r, r))

        w = timed(lambda: write_jsonl(groups, jsonl_zst, zstd=True), args.repeat)
        r = timed(lambda: read_jsonl(jsonl_zst, True, raw), args.repeat)
        rows.append(("JSON Lines + zstd", jsonl_zst.stat().st_size, w, r, r))

    base_size, base_w, base_r, base_q = rows[0][1], rows[0][2], rows[0][3], rows[0][4]
    n_tokens = sum(len(c.token_ids or []) for g in groups for t in g.trajectories for c in t.choices())
    print(
        f"{args.n} trajectories in {len(groups)} groups, {n_tokens} sampled tokens (best of {args.repeat})\n"
    )
    print(
        "| format | size (MB) | size × | write (CPU s) | write × | read all (CPU s) | read × | rewards only (CPU s) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, size, w, r, q in rows:
        print(
            f"| {name} | {size / 1e6:.1f} | {size / base_size:.2f} | {w:.2f} | {w / base_w:.2f} "
            f"| {r:.2f} | {r / base_r:.2f} | {q:.3f} ({q / base_q:.0f}×) |"
        )


if __name__ == "__main__":
    main()
