"""Finding one model's programs among every rank's announcements, in one process."""
from mnpar.links._wiring import Op
from mnpar.links._wiring_match import Announcement, check, counterpart, gather


def S(peer, component=0):
    return Op("send", peer, component)


def R(peer, component=0):
    return Op("recv", peer, component)


def A(*ops, partial=False):
    return Announcement(tuple(ops), partial)


# The issue's case at 3 ranks: a model on {0, 1}, then a ring 0 -> 1 -> 2 -> 0.
PAIR = {0: A(S(1), R(1, 1)), 1: A(R(0), S(0))}
RING = {0: A(S(1), R(2, 1)), 1: A(R(0), S(2)), 2: A(R(1), S(0))}
ISSUE = {0: [PAIR[0], RING[0]], 1: [PAIR[1], RING[1]], 2: [RING[2]]}


def test_a_rank_outside_a_model_skips_its_announcements():
    # Regression: rank 2 took ranks 0 and 1's first announcements (the pair)
    # for its ring's, and reported that its receive from rank 1 never arrives.
    assert counterpart(ISSUE, (2, 0), 0) == 1 and counterpart(ISSUE, (2, 0), 1) == 1
    model = gather(ISSUE, (2, 0))
    assert set(model.members) == {(2, 0), (0, 1), (1, 1)}
    assert model.pending == []
    assert check(ISSUE, (2, 0)) == ([], {0: list(RING[0].ops), 1: list(RING[1].ops),
                                        2: list(RING[2].ops)})


def test_each_model_is_checked_with_its_own_members():
    assert set(gather(ISSUE, (0, 0)).members) == {(0, 0), (1, 0)}
    assert check(ISSUE, (0, 0))[0] == [] and check(ISSUE, (1, 1))[0] == []


def test_a_mismatch_in_a_later_model_is_still_found():
    # The ring again, but rank 2 waits for rank 0 before sending to it.
    history = {0: [PAIR[0], RING[0]], 1: [PAIR[1], RING[1]], 2: [A(R(0), S(1))]}
    problems, _ = check(history, (2, 0))
    assert any(p.rank == 2 and p.op == R(0) for p in problems)
    assert check(history, (0, 1))[0] and check(history, (1, 1))[0]
    assert check(history, (0, 0))[0] == []  # the pair itself is fine


def test_a_member_not_announced_yet_is_pending():
    model = gather({0: [A(S(1))], 1: [], 2: []}, (0, 0))
    assert model.pending == [((0, 0), 1)]


def test_a_peer_whose_newest_model_hides_traffic_is_a_wildcard():
    # Rank 1 runs an RNN inside its component: its program shows no receive.
    history = {0: [A(S(1))], 1: [A(partial=True)]}
    model = gather(history, (0, 0))
    assert model.pending == []
    assert check(history, (0, 0))[0] == []


def test_a_peer_that_has_not_answered_is_waited_for_never_blamed():
    # Rank 1's model does not talk with rank 0, but a model it builds later may.
    history = {0: [A(S(1))], 1: [A()]}
    assert gather(history, (0, 0)).pending == [((0, 0), 1)]
    assert check(history, (0, 0)) == ([], {0: [S(1)]})
    assert check(history, (1, 0)) == ([], {1: []})
    later = {0: [A(S(1))], 1: [A(), A(R(0))]}
    assert set(gather(later, (1, 1)).members) == {(0, 0), (1, 1)}
    assert check(later, (1, 1))[0] == []


def test_several_models_on_one_rank_are_wildcards_where_they_hide_traffic():
    # Rank 0 splits its part into an encoder and a decoder model.
    history = {0: [A(S(1), partial=True), A(R(1), partial=True)], 1: [A(R(0), S(0))]}
    assert check(history, (1, 0))[0] == []
    assert check(history, (0, 1))[0] == []


def test_models_on_disjoint_ranks_do_not_meet():
    history = {0: [A()], 1: [A(S(2), R(2))], 2: [A(R(1), S(1))], 3: []}
    assert set(gather(history, (1, 0)).members) == {(1, 0), (2, 0)}
    assert check(history, (0, 0)) == ([], {0: []})
    assert check(history, (2, 0))[0] == []


def test_a_rank_twice_in_one_model_is_a_wildcard():
    # Links through rank 2 reach two of rank 0's announcements.
    history = {0: [A(S(1)), A(R(2))], 1: [A(R(0), S(2))], 2: [A(R(1), S(0))]}
    problems, programs = check(history, (1, 0))
    assert problems == [] and 0 not in programs
