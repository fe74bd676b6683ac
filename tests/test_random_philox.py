"""Philox4x64-10 as mnpar computes it: the authors' known answers, NumPy's own bit
generator, and runs that give the same numbers however they are cut."""
import numpy as np
import pytest

from mnpar.random import _philox as P

KEY = (0x243F6A8885A308D3, 0x13198A2E03707344)


def test_the_known_answer_vectors_of_random123():
    # Random123's kat_vectors, philox4x64 with 10 rounds.
    assert [int(w) for w in P.philox((0, 0, 0, 0), (0, 0))] == [
        0x16554D9ECA36314C, 0xDB20FE9D672D0FDC, 0xD7E772CEE186176B, 0x7E68B68AEC7BA23B]
    ones = (1 << 64) - 1
    assert [int(w) for w in P.philox((ones,) * 4, (ones, ones))] == [
        0x87B092C3013FE90B, 0x438C3C67BE8D0224, 0x9CC7D7C69CD777B6, 0xA09CAEBF594F0BA0]


@pytest.mark.parametrize("block", [0, 1, 5, (1 << 64) - 1, (7 << 64) + 3])
def test_blocks_equal_numpys_philox(block):
    key = np.array(KEY, np.uint64)
    ours = [int(w) for w in P.philox((block & P.FULL, block >> 64, 0, 0), KEY)]
    # NumPy's generator adds one to its counter before each block.
    theirs = np.random.Philox(counter=(block - 1) % (1 << 256), key=key).random_raw(4)
    assert ours == theirs.tolist()


def test_numpys_fast_path_and_the_array_operations_give_the_same_uniforms():
    whole = P._short_runs(np.array([0], np.uint64), 3001, 7, KEY, np)[0]
    assert np.array_equal(P.uniform(np.array([0]), 3001, 7, KEY)[0], whole)  # NumPy's
    for start in (1, 2, 3, 5, 999, 2990):
        assert np.array_equal(P.uniform(np.array([start]), 3001 - start, 7, KEY)[0],
                              whole[start:])
        assert np.array_equal(P._short_runs(np.array([start], np.uint64), 3001 - start, 7,
                                            KEY, np)[0], whole[start:])
        one_each = P.uniform(np.arange(start, 3001, dtype=np.uint64), 1, 7, KEY)[:, 0]
        assert np.array_equal(one_each, whole[start:])


def test_runs_of_rows_are_the_rows_of_the_whole_run():
    whole = P.uniform(np.array([0]), 40, 2, KEY)[0]
    rows = P.uniform(np.array([3, 13, 23]), 7, 2, KEY)
    assert np.array_equal(rows, np.stack([whole[3:10], whole[13:20], whole[23:30]]))


def test_steps_and_keys_draw_other_numbers():
    a = P.uniform(np.array([0]), 100, 0, KEY)
    assert not np.array_equal(a, P.uniform(np.array([0]), 100, 1, KEY))
    assert not np.array_equal(a, P.uniform(np.array([0]), 100, 0, (KEY[0] + 1, KEY[1])))


def test_normals_are_box_muller_of_pairs_of_uniforms_and_cut_alike():
    u = P.uniform(np.array([0]), 2000, 3, KEY)[0]
    expected = np.sqrt(-2 * np.log(1 - u[0::2])) * np.cos(2 * np.pi * u[1::2])
    z = P.normal(np.array([0]), 1000, 3, KEY)[0]
    assert np.array_equal(z, expected)
    assert np.array_equal(P.normal(np.array([400]), 600, 3, KEY)[0], z[400:])
    assert abs(z.mean()) < 0.1 and abs(z.std() - 1) < 0.1


def test_uniforms_look_uniform():
    u = P.uniform(np.array([0]), 100000, 0, KEY)[0]
    assert u.min() >= 0 and u.max() < 1
    counts = np.histogram(u, bins=10, range=(0, 1))[0]
    assert np.all(np.abs(counts - 10000) < 500)  # about 5 standard deviations


@pytest.mark.parametrize("stretch", [1 << 20, 100])
def test_short_runs_close_together_come_from_numpys_stretch_alike(monkeypatch, stretch):
    # A 2 x 2 tile's rows of 9 numbers, 18 apart: picked out of one stretch of NumPy's (or
    # of several, when a stretch holds only a few rows), as the array operations give them.
    monkeypatch.setattr(P, "STRETCH", stretch)
    starts = (np.arange(0, 30 * 18, 18) + 9).astype(np.uint64).reshape(5, 6)
    expected = P._short_runs(starts, 9, 4, KEY, np)
    assert np.array_equal(P.uniform(starts, 9, 4, KEY), expected)
    spread = np.array([0, 1000, 5000], np.uint64)  # too far apart: the array operations
    assert np.array_equal(P.uniform(spread, 9, 4, KEY), P._short_runs(spread, 9, 4, KEY, np))
