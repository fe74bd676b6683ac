"""The component graph and the schedules, in one process: no MPI."""
import pytest

from mnpar import WiringError
from mnpar.pipeline import SCHEDULES, Action, Graph, ScheduleError, plan, simulate, table
from mnpar.pipeline._schedule import (
    component_costs,
    generate,
    makespan,
    peak_activations,
    split_components,
)

LOOP = {0: [(None, (1,)), ((1,), None)], 1: [((0,), (0,))]}  # the seed MLP
CHAIN3 = {0: [(None, (1,))], 1: [((0,), (2,))], 2: [((1,), None)]}
RING4 = {0: [(None, (1,)), ((3,), None)], 1: [((0,), (2,))], 2: [((1,), (3,))],
         3: [((2,), (0,))]}
BRANCH = {0: [(None, (1, 2)), ((1, 2), None)], 1: [((0,), (0,))], 2: [((0,), (0,))]}
SELF = {0: [(None, (0, 1)), ((0, 1), None)], 1: [((0,), (0,))]}  # a local edge beside a remote one
GRAPHS = {"loop": LOOP, "chain3": CHAIN3, "ring4": RING4, "branch": BRANCH, "self": SELF}


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("kind", SCHEDULES)
@pytest.mark.parametrize("k", [1, 2, 5])
def test_every_generated_schedule_runs_to_the_end(name, kind, k):
    graph = Graph(GRAPHS[name])
    schedule = plan(graph, k, kind)
    steps = simulate(graph, schedule, k)
    ran = [(r, a) for s in steps for r, a in s.items()]
    per_action = 1 if kind == "forward" else 2
    weights = len(split_components(graph, kind))  # zb1, zb2: a W per split component
    assert len(ran) == len(set(ran)) == per_action * k * len(graph.nodes()) + k * weights
    assert sum(1 for _, a in ran if a.weight) == k * weights


def test_graph_of_the_seed_loop():
    graph = Graph(LOOP)
    assert [(e.src, e.dst, e.position) for e in graph.edges] == [((0, 0), (1, 0), 0),
                                                                  ((1, 0), (0, 1), 0)]
    assert graph.depth == {(0, 0): 0, (1, 0): 1, (0, 1): 2}


def test_branch_and_merge_takes_arguments_in_rank_in_order():
    graph = Graph(BRANCH)
    assert [e.src for e in graph.ins[(0, 1)]] == [(1, 0), (2, 0)]
    assert [e.dst for e in graph.outs[(0, 0)]] == [(1, 0), (2, 0)]


def test_gpipe_runs_every_forward_before_any_backward():
    graph = Graph(CHAIN3)
    for actions in plan(graph, 4, "gpipe").values():
        kinds = [a.backward for a in actions]
        assert kinds == sorted(kinds)


def cheap_outputs(graph):
    """Costs of a model whose output components (a loss, say) have no parameters."""
    return component_costs(graph, {n: 0 if graph.is_output(n) else 1000 for n in graph.nodes()})


@pytest.mark.parametrize("costed", [False, True])
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_1f1b_bounds_micro_batches_in_flight_by_the_stages(name, costed):
    graph = Graph(GRAPHS[name])
    stages = max(graph.depth.values()) + 1
    costs = cheap_outputs(graph) if costed else None
    for rank, actions in plan(graph, 8, "1f1b", costs).items():
        n = len(graph.components(rank))
        started, finished, peak = set(), {}, 0
        for a in actions:
            if a.backward:
                finished[a.microbatch] = finished.get(a.microbatch, 0) + 1
            else:
                started.add(a.microbatch)
            peak = max(peak, sum(1 for m in started if finished.get(m, 0) < n))
        assert peak <= stages
    gpipe = plan(graph, 8, "gpipe")
    assert max(sum(1 for a in acts if not a.backward) for acts in gpipe.values()) >= 8


def test_1f1b_on_a_chain_is_the_classic_schedule():
    schedule = plan(Graph(CHAIN3), 4, "1f1b")
    label = [a.label(True) for a in schedule[0]]
    assert label == ["F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"]
    assert [a.label(True) for a in schedule[2]] == ["F0", "B0", "F1", "B1", "F2", "B2",
                                                    "F3", "B3"]


def test_table_prints_steps_by_rank():
    graph = Graph(CHAIN3)
    text = table(graph, simulate(graph, plan(graph, 2, "gpipe"), 2))
    lines = text.splitlines()
    assert lines[0].split() == ["step", "rank0", "rank1", "rank2"]
    assert lines[1].split() == ["0", "F0", ".", "."]
    assert lines[2].split() == ["1", "F1", "F0", "."]


def test_a_schedule_whose_order_would_hang_is_rejected():
    graph = Graph(CHAIN3)
    schedule = plan(graph, 2, "gpipe")
    schedule[1] = [Action(0, 1, False), Action(0, 0, True)] + [
        a for a in schedule[1] if a not in (Action(0, 1, False), Action(0, 0, True))]
    with pytest.raises(ScheduleError, match=r"rank 1 B0.c0 waits for rank 1 F0.c0"):
        simulate(graph, schedule, 2)


def test_circular_waits_are_rejected():
    graph = Graph(LOOP)
    schedule = generate(graph, 1, "forward")
    schedule[0] = [Action(1, 0, False), Action(0, 0, False)]  # B before A: rank 1 waits on A
    with pytest.raises(ScheduleError, match="rank 0 F0.c1 waits for rank 1 F0"):
        simulate(graph, schedule, 1)


def test_a_missing_action_is_rejected():
    graph = Graph(CHAIN3)
    schedule = plan(graph, 2, "1f1b")
    schedule[2] = schedule[2][:-1]
    with pytest.raises(ScheduleError, match="rank 2's schedule must run each"):
        simulate(graph, schedule, 2)


def test_unpaired_sends_are_a_wiring_error():
    with pytest.raises(WiringError, match="rank 0 sends 1 time.*rank 1 receives 0"):
        Graph({0: [(None, (1,))], 1: [(None, None)]})


def test_receiving_from_itself_first_is_a_wiring_error():
    with pytest.raises(WiringError, match="receives from its own rank"):
        Graph({0: [((0,), None), (None, (0,))]})


def test_a_send_to_itself_never_received_is_the_links_wiring_error():
    with pytest.raises(WiringError, match="rank 0 component 0 sends to its own rank 0.*no later"):
        Graph({0: [(None, (0,)), (None, None)]})


def test_edges_pair_sends_and_receives_first_in_first_out():
    graph = Graph({0: [(None, (1,)), (None, (1,)), ((1, 1), None)],
                   1: [((0,), (0,)), ((0,), (0,))]})
    assert [(e.src, e.dst, e.position) for e in graph.edges] == [
        ((0, 0), (1, 0), 0), ((0, 1), (1, 1), 0), ((1, 0), (0, 2), 0), ((1, 1), (0, 2), 1)]


def test_a_forward_order_that_would_hang_is_still_a_graph():
    # Same matching, different question: a MultiNodeChainList's forward runs this
    # wiring in order and hangs (both ranks receive first); the pipeline runs each
    # component when its inputs are there, so it schedules it.
    from mnpar.links._wiring import hangs, program

    wirings = {0: [((1,), None), (None, (1,))], 1: [((0,), None), (None, (0,))]}
    assert hangs({r: program(r, w) for r, w in wirings.items()})
    graph = Graph(wirings)
    assert [(e.src, e.dst) for e in graph.edges] == [((0, 1), (1, 0)), ((1, 1), (0, 0))]
    simulate(graph, plan(graph, 2, "1f1b"), 2)


def test_a_cycle_of_components_is_a_wiring_error():
    with pytest.raises(WiringError, match="in a cycle"):
        Graph({0: [((1,), (1,))], 1: [((0,), (0,))]})


def test_unknown_schedule_is_a_clear_error():
    with pytest.raises(ValueError, match="schedule='zigzag' is not one of"):
        generate(Graph(LOOP), 2, "zigzag")


def test_component_costs_follow_the_parameter_counts():
    graph = Graph(LOOP)
    costs = component_costs(graph, {(0, 0): 4000, (0, 1): 0, (1, 0): 1000})
    assert costs == {(0, 0): (20, 20, 20), (0, 1): (1, 2, 0), (1, 0): (5, 5, 5)}
    assert component_costs(graph, {}) == {n: (1, 2, 0) for n in graph.nodes()}


@pytest.mark.parametrize("k", [4, 8, 16])
def test_1f1b_keeps_the_seed_loop_as_busy_as_gpipe(k):
    # Regression: on the seed MLP's loop, rank 0 ran its parameterless loss
    # component after its own heavy backwards, so rank 1 waited for the loss's
    # gradient; 1f1b took 71 units at K=16 where gpipe took 51.
    graph = Graph(LOOP)
    costs = cheap_outputs(graph)
    heavy = 20 + 40  # one micro-batch's forward and backward on one rank
    bound = (k + 1) * heavy + 3 * k  # two equal stages, plus the loss's own ticks on rank 0
    for kind in ("gpipe", "1f1b", "zb1", "zb2"):
        assert makespan(graph, plan(graph, k, kind, costs), costs) <= bound, kind


def chain(ranks, chunks=1):
    """A chain of ``ranks * chunks`` components; component i on rank i % ranks
    (interleaved virtual stages, as build_stage(..., chunks=...) wires them)."""
    n = ranks * chunks
    wirings = {r: [] for r in range(ranks)}
    for i in range(n):
        wirings[i % ranks].append((None if i == 0 else ((i - 1) % ranks,),
                                   None if i == n - 1 else ((i + 1) % ranks,)))
    return Graph(wirings)


@pytest.mark.parametrize("p", [2, 3, 4])
def test_makespans_on_chains_equal_their_formulas(p):
    # F = B = W = 1 (a whole backward 2). GPipe and 1F1B: 3(m + p - 1); ZB-H1
    # hides all but one tick per stage of the bubble: 3m + p - 1, once m >= p.
    graph = chain(p)
    for m in range(p, 9):
        assert plan(graph, m, "gpipe").makespan == 3 * (m + p - 1)
        assert plan(graph, m, "1f1b").makespan == 3 * (m + p - 1)
        for kind in ("zb1", "zb2"):
            assert plan(graph, m, kind).makespan == 3 * m + p - 1, (kind, m)
    assert plan(chain(4), 4, "zb1").makespan == 15 and plan(chain(4), 4, "1f1b").makespan == 21


def test_zb1_splits_every_component_but_the_first_and_keeps_1f1b_s_peak_memory():
    graph = chain(4)
    for m in (4, 8, 16):
        zb1, one = plan(graph, m, "zb1"), plan(graph, m, "1f1b")
        assert not any(a.weight for a in zb1[0])  # the first stage has no input gradient
        assert all(sum(a.weight for a in zb1[r]) == m for r in (1, 2, 3))
        assert max(zb1.peak_activations.values()) == max(one.peak_activations.values()) == 4
        assert one.peak_activations == {0: 4, 1: 3, 2: 2, 3: 1}  # S - d
        assert max(plan(graph, m, "zb2").peak_activations.values()) <= 2 * 4 - 1
        assert max(plan(graph, m, "gpipe").peak_activations.values()) == m


def test_peak_activations_count_segments_from_f_to_their_last_backward():
    schedule = {0: [Action(0, 0, False), Action(0, 1, False), Action(0, 0, True),
                    Action(0, 0, True, True), Action(0, 1, True), Action(0, 1, True, True)]}
    assert peak_activations(Graph({0: [(None, None)]}), schedule) == {0: 2}
    schedule[0] = schedule[0][:2] + [Action(0, 0, True), Action(0, 1, True)]
    assert peak_activations(Graph({0: [(None, None)]}), schedule) == {0: 2}


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("v", [2, 3])
def test_interleaved_virtual_stages_shrink_the_bubble_to_p_minus_1_over_v_m(p, v):
    # Each rank holds v components; a whole component's F + B costs 3, so a
    # rank works 3 v m and the bubble is (p - 1) components' worth: (p-1)/(v m).
    graph = chain(p, v)
    for m in (p, 2 * p):
        work = 3 * v * m
        assert plan(graph, m, "gpipe").makespan == work + 3 * (p - 1)
        assert plan(graph, m, "zb1").makespan == work + p - 1
        # 1F1B's per-component bound keeps less in flight; it loses up to 12% here.
        assert plan(graph, m, "1f1b").makespan <= (work + 3 * (p - 1)) * 1.15


def test_the_loop_with_real_costs_runs_zb1_ahead_of_1f1b():
    graph = Graph(LOOP)
    costs = cheap_outputs(graph)  # layers 20 ticks a phase, the loss 1 and 2
    for m in (2, 4, 8, 16):
        zb1, one = plan(graph, m, "zb1", costs), plan(graph, m, "1f1b", costs)
        assert zb1.makespan < one.makespan
        # rank 1 never idles once its first input arrives, but for rank 0's last B
        assert zb1.makespan <= 20 + 60 * m + 40 + 3 * m + 20


def test_a_graph_past_its_schedules_bound_is_an_error_not_a_silent_raise(monkeypatch):
    from mnpar.pipeline import _rules

    monkeypatch.setattr(_rules.InFlight, "limits", lambda self, stages, depth: (0, 0))
    with pytest.raises(ScheduleError, match="cannot run this graph within its bound.*gpipe"):
        generate(chain(2), 4, "1f1b")


def test_table_marks_a_rank_waiting_for_a_message():
    graph = chain(3)
    lines = table(graph, simulate(graph, plan(graph, 2, "zb1"), 2)).splitlines()
    assert lines[1].split() == ["0", "F0", ".", "."]  # ranks 1 and 2 wait for F0
    assert any("W1" in line for line in lines)


def v_shape(ranks):
    """A chain of ``2 * ranks`` components in a V: component j on rank j for j < ranks,
    else on rank 2 ranks - 1 - j (build_stage(..., chunks=2, placement='v'))."""
    n = 2 * ranks
    owner = [j if j < ranks else n - 1 - j for j in range(n)]
    wirings = {r: [] for r in range(ranks)}
    for j in range(n):
        wirings[owner[j]].append((None if j == 0 else (owner[j - 1],),
                                  None if j == n - 1 else (owner[j + 1],)))
    return Graph(wirings)


@pytest.mark.parametrize("p", [2, 3, 4, 5])
def test_zb1_over_a_v_reaches_zb_v_makespan(p):
    """ZB-V's makespan for one step (Qi et al., "Zero Bubble Pipeline Parallelism",
    arXiv 2401.10241, ZB-V): 2p chunks in a V, rank i holding chunks i and 2p - 1 - i,
    with F = B = W = 1 per chunk (a stage of two chunks: 2 each). Every rank works 6m
    ticks, and one synchronous step leaves only the warm-up idle, the p - 1 chunk
    forwards before the last rank's first action:

        makespan(ZB-V) = 6m + p - 1         ZB-H1, a stage a rank: 6m + 2(p - 1)

    once m > p (list scheduling loses one tick at m = p from p = 4 on). The paper's
    zero bubble rate counts steps whose optimizer step overlaps the next one, which a
    synchronous step cannot. Its memory is 1F1B's, p micro-batches of a stage or 2p
    chunk segments; zb1 over the V reaches the makespan within 2p + 1 segments once
    m >= 2p (a W left for later keeps its segment alive), and ``plan`` predicts each
    rank's peak.
    """
    v, stages = v_shape(p), chain(p)
    stage_costs = {n: (2, 2, 2) for n in stages.nodes()}
    for m in range(p + 1, 3 * p + 1):
        zbv = plan(v, m, "zb1")
        assert zbv.makespan == 6 * m + p - 1, m
        assert plan(stages, m, "zb1", stage_costs).makespan == 6 * m + 2 * (p - 1)
        assert plan(v, m, "1f1b").makespan > zbv.makespan
        assert zbv.peak_activations == peak_activations(v, zbv)
        assert zbv.split == {n for n in v.nodes() if n != (0, 0)}  # all but the first chunk
    for m in range(2 * p, 3 * p + 1):
        budgeted = plan(v, m, "zb1", memory=2 * p + 1)
        assert budgeted.makespan == 6 * m + p - 1, m
        assert budgeted.memory == {r: 2 * p + 1 for r in range(p)}
        assert max(budgeted.peak_activations.values()) == 2 * p + 1
        assert max(plan(v, m, "zb1").peak_activations.values()) > 2 * p + 1


def random_wirings(rng):
    """A chain of 1 to 7 components on 1 to 4 ranks, each component on a random rank."""
    ranks, n = rng.randint(1, 4), rng.randint(1, 7)
    owner = [rng.randrange(ranks) for _ in range(n)]
    wirings = {r: [] for r in range(ranks)}
    for j in range(n):
        wirings[owner[j]].append((None if j == 0 else (owner[j - 1],),
                                  None if j == n - 1 else (owner[j + 1],)))
    return {r: w for r, w in wirings.items() if w}


@pytest.mark.parametrize("kind", ["1f1b", "zb1", "zb2"])
def test_a_memory_budget_bounds_every_rank_and_never_deadlocks(kind):
    import random

    rng = random.Random(kind)
    graphs = [Graph(w) for w in GRAPHS.values()] + [chain(3, 2), v_shape(3)]
    graphs += [Graph(random_wirings(rng)) for _ in range(60)]
    for graph in graphs:
        least = {r: len(graph.components(r)) for r in graph.ranks}
        for m in (1, 5):
            for extra in (0, 2):
                budget = {r: n + rng.randint(0, extra) for r, n in least.items()}
                proven = plan(graph, m, kind, cheap_outputs(graph), memory=budget)
                assert all(proven.peak_activations[r] <= budget[r] for r in graph.ranks)
    tight = plan(chain(3), 6, kind, memory=1)  # one micro-batch at a time on each rank
    assert set(tight.peak_activations.values()) == {1}
    assert tight.makespan > plan(chain(3), 6, kind).makespan


def test_a_budget_for_one_rank_leaves_the_others_alone():
    graph = v_shape(3)
    free, bounded = plan(graph, 9, "zb1"), plan(graph, 9, "zb1", memory={0: 4})
    assert bounded.peak_activations[0] <= 4 < free.peak_activations[0]
    assert bounded.memory == {0: 4}


@pytest.mark.parametrize("kind, memory, error, match", [
    ("zb1", 1, ValueError, r"memory=1: rank 0's budget \(1\) is too small: one micro-batch "
     r"may keep a segment in each of its 2 components at once; give it at least 2 segments"),
    ("1f1b", {1: 1, 0: 2}, ValueError, r"rank 1's budget \(1\) is too small.*at least 2"),
    ("gpipe", 6, ValueError, r"rank 0's budget \(6\) is too small for schedule='gpipe', which "
     r"keeps all 4 micro-batches in each of its 2 components; give it at least 8 segments, or "
     r"use a schedule whose forwards wait for memory: \('1f1b', 'zb1', 'zb2'\)"),
    ("zb1", {5: 3}, ValueError, r"memory=\{5: 3\} names rank 5; the ranks are \[0, 1, 2\]"),
    ("zb1", 2.5, TypeError, "rank 0's budget must be an int \\(segments\\), not float"),
])
def test_a_budget_too_small_or_not_a_count_says_which(kind, memory, error, match):
    with pytest.raises(error, match=match):
        plan(v_shape(3), 4, kind, memory=memory)


def test_gpipe_within_its_budget_and_evaluation_are_unchanged_by_one():
    graph = v_shape(2)
    assert plan(graph, 4, "gpipe", memory=8) == plan(graph, 4, "gpipe")
    assert plan(graph, 4, "forward", memory=1) == plan(graph, 4, "forward")  # keeps nothing
