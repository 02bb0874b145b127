"""The pure parts of benchmarks/bench_batch_quality.py: the summary over seeds (also of a study cut
short) and the order in which runs start and are recorded."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest

from benchmarks import bench_batch_quality as bq


def _run(batch: int, seed: int, psnr: float) -> dict:
    return {
        "batch_size": batch,
        "seed": seed,
        "final_eval_psnr": psnr,
        "final_gaussian_count": 100,
        "train_wall_s": 1.0,
    }


def test_summary_pairs_each_seed_with_its_own_b1_run() -> None:
    runs = [_run(1, 0, 20.0), _run(1, 1, 22.0), _run(4, 0, 19.5), _run(4, 1, 21.9)]
    summary = bq.summarise(runs)
    assert summary["4"]["paired_gaps_db"] == pytest.approx([-0.5, -0.1])
    assert summary["4"]["gap_to_b1_db"] == pytest.approx(-0.3)
    assert summary["4"]["psnr_sd"] == pytest.approx(math.sqrt(2 * 1.2**2))  # sample s.d. of 19.5, 21.9
    assert summary["1"]["seeds"] == [0, 1]


def test_summary_of_a_study_cut_short_keeps_what_finished() -> None:
    # Seed 1 has no B = 1 run yet: its B = 4 run counts in the mean but has no pair.
    summary = bq.summarise([_run(1, 0, 20.0), _run(4, 0, 19.0), _run(4, 1, 21.0)])
    assert summary["4"]["paired_gaps_db"] == pytest.approx([-1.0])
    assert summary["4"]["gap_to_b1_db"] == pytest.approx(0.0)
    no_reference = bq.summarise([_run(16, 0, 19.0)])
    assert math.isnan(no_reference["16"]["gap_to_b1_db"]) and no_reference["16"]["paired_gaps_db"] == []
    assert "| 16 | 0 |" in bq.markdown_table(no_reference)


def test_runs_go_seed_by_seed_and_each_finished_run_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[tuple[int, int]] = []
    monkeypatch.setattr(bq, "train", lambda b, s, args, out: started.append((b, s)) or _run(b, s, 20.0))
    recorded: list[int] = []
    args = argparse.Namespace(batch_sizes=[1, 4, 16], seeds=[0, 1], jobs=1)
    runs = bq.train_all(args, Path("unused"), lambda done: recorded.append(len(done)))
    assert started == [(16, 0), (4, 0), (1, 0), (16, 1), (4, 1), (1, 1)]
    assert recorded == [1, 2, 3, 4, 5, 6]
    assert [(r["batch_size"], r["seed"]) for r in runs] == sorted(started)


def test_a_resumed_study_trains_only_the_missing_runs_and_keeps_the_finished(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[tuple[int, int]] = []
    monkeypatch.setattr(bq, "train", lambda b, s, args, out: started.append((b, s)) or _run(b, s, 21.0))
    finished = [_run(1, 0, 20.0), _run(4, 0, 19.0)]
    recorded: list[int] = []
    args = argparse.Namespace(batch_sizes=[1, 4], seeds=[0, 1], jobs=1)
    runs = bq.train_all(args, Path("unused"), lambda done: recorded.append(len(done)), finished)
    assert started == [(4, 1), (1, 1)]
    assert recorded == [3, 4]
    assert [(r["batch_size"], r["seed"], r["final_eval_psnr"]) for r in runs] == [
        (1, 0, 20.0),
        (1, 1, 21.0),
        (4, 0, 19.0),
        (4, 1, 21.0),
    ]


def test_resume_refuses_a_file_with_other_settings() -> None:
    header = {key: 1 for key in bq.SETTINGS}
    assert bq.resumable_runs(dict(header, runs=[_run(1, 0, 20.0)]), header, Path("r.json")) == [_run(1, 0, 20.0)]
    with pytest.raises(SystemExit, match=r"--resume r.json: its images is 2, this run's is 1"):
        bq.resumable_runs(dict(header, images=2, runs=[]), header, Path("r.json"))
