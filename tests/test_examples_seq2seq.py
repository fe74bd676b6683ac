"""examples/seq2seq/train_seq2seq.py, launched with ``mpiexec -n 2`` as a user would.

Runs are kept to a few iterations on a cut-down toy corpus; each has a hard
timeout, so a deadlock fails the test instead of hanging the suite.
"""
import math
import os
import re

import pytest
from test_examples_mlp import ROOT, TIMEOUT, arrays, finish, log_of, run, start

SCRIPT = os.path.join(ROOT, "examples", "seq2seq", "train_seq2seq.py")
SHORT = ["--toy-pairs", "320", "--epoch", "2", "--unit", "32", "--layer", "2", "--seed", "2",
         "--max-length", "12"]  # 10 iterations; translations cut at 12 words


DEFAULT_RUN = 400  # seconds: the default ten epochs take 135 s on a loaded 2-core VM


def seq2seq(args, timeout=TIMEOUT):
    return run(args, script=SCRIPT, timeout=timeout)


@pytest.mark.slow
def test_learns_the_toy_corpus_at_two_ranks_and_reports_bleu(tmp_path):
    out = seq2seq(["--toy-pairs", "640", "--epoch", "2", "--max-length", "12", "--out",
                   str(tmp_path)])
    log = log_of(tmp_path)
    assert [entry["epoch"] for entry in log] == [1, 2]
    losses = [entry["main/loss"] for entry in log]
    assert all(math.isfinite(x) for x in losses) and losses[1] < losses[0] < math.log(12) + 1
    for entry in log:
        assert entry["main/perplexity"] == pytest.approx(math.exp(entry["main/loss"]), rel=0.3)
        assert 0 <= entry["validation/main/bleu"] <= 1
        assert entry["validation/main/perplexity"] < 12  # below guessing among 12 words
    for name in ("model_rank0.npz", "model_rank1.npz", "loss.png", "perplexity.png",
                 "bleu.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert "seq2seq on the toy corpus: 640 training and 200 validation pairs" in out
    assert re.search(r"source 'yu su mo yu', reference 'snow dog sun snow', translation '", out)
    assert f"log:    {tmp_path / 'log'}" in out and "\033[J" not in out


@pytest.mark.slow
def test_resuming_from_a_snapshot_file_equals_an_uninterrupted_run(tmp_path):
    # Two layers: dropout (0.1) between them, so the resumed run must draw the same masks.
    seq2seq(SHORT + ["--snapshot-interval", "4", "--out", str(tmp_path / "whole")])
    snapshot = tmp_path / "whole" / "snapshot_iter_4.rank1.npz"  # any rank's file will do
    out = seq2seq(SHORT + ["--resume", str(snapshot), "--out", str(tmp_path / "resumed")])
    assert "resumed from iteration 4" in out
    for rank in (0, 1):
        whole = arrays(tmp_path / "whole" / f"model_rank{rank}.npz")
        resumed = arrays(tmp_path / "resumed" / f"model_rank{rank}.npz")
        assert sorted(whole) == sorted(resumed)
        for name in whole:
            assert whole[name] == resumed[name], f"rank {rank}: {name} differs"


@pytest.mark.slow
def test_trains_on_a_parallel_corpus_from_text_files(tmp_path):
    source = ["the cat sleeps", "a dog runs", "the dog sleeps", "a cat runs"] * 10
    target = ["le chat dort", "un chien court", "le chien dort", "un chat court"] * 10
    for name, lines in (("train.en", source), ("train.fr", target), ("dev.en", source[:4]),
                        ("dev.fr", target[:4])):
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = seq2seq(["--source", str(tmp_path / "train.en"), "--target", str(tmp_path / "train.fr"),
                   "--validation-source", str(tmp_path / "dev.en"),
                   "--validation-target", str(tmp_path / "dev.fr"), "--epoch", "1",
                   "--batchsize", "8", "--out", str(tmp_path / "out")])
    assert (f"seq2seq on {tmp_path / 'train.en'}: 40 training and 4 validation pairs, "
            "vocabularies 8 and 8") in out
    assert "source 'the cat sleeps', reference 'le chat dort', translation '" in out
    assert math.isfinite(log_of(tmp_path / "out")[-1]["main/loss"])


def test_a_wrong_rank_count_is_one_message_and_a_failing_exit(tmp_path):
    code, out, err = finish(start(["--out", str(tmp_path)], n=3, script=SCRIPT))
    assert code != 0 and "Traceback" not in out + err
    errors = [line for line in (out + err).splitlines() if "ranks" in line]
    assert errors == [line for line in errors if line.startswith(
        "error: train_seq2seq.py puts the encoder and the decoder on exactly 2 ranks, but it "
        "runs on 3; launch it as: mpiexec -n 2 python")] and len(errors) == 1, out + err


@pytest.mark.slow
@pytest.mark.timeout(DEFAULT_RUN + 30)
def test_the_default_run_translates_the_toy_corpus_almost_perfectly(tmp_path):
    # examples/README.rst: the toy task has a known right answer, and BLEU
    # reaches about 0.95 after the default 10 epochs (nltk's corpus_bleu).
    out = seq2seq(["--out", str(tmp_path)], timeout=DEFAULT_RUN)
    final = log_of(tmp_path)[-1]
    assert final["epoch"] == 10
    assert final["validation/main/bleu"] >= 0.9
    assert final["validation/main/perplexity"] < 1.2
    assert re.search(r"BLEU 0\.9\d+ after 10 epochs", out), out
