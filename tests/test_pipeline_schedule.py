"""The component graph and the schedules, in one process: no MPI."""
import pytest

from mnpar import WiringError
from mnpar.pipeline import SCHEDULES, Action, Graph, ScheduleError, plan, simulate, table
from mnpar.pipeline._schedule import component_costs, dependencies, generate

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
    assert len(ran) == len(set(ran)) == per_action * k * len(graph.nodes())


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
    assert lines[1].split() == ["0", "F0"]
    assert lines[2].split() == ["1", "F1", "F0"]


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
    assert costs == {(0, 0): (20, 40), (0, 1): (1, 2), (1, 0): (5, 10)}
    assert component_costs(graph, {}) == {n: (1, 2) for n in graph.nodes()}


def makespan(graph, schedule, costs):
    """When the last action ends if every rank runs its list in order, as soon as it can."""
    pos = {r: 0 for r in schedule}
    free = {r: 0 for r in schedule}
    end = {}
    moved = True
    while moved:
        moved = False
        for r, actions in schedule.items():
            while pos[r] < len(actions):
                a = actions[pos[r]]
                deps = dependencies(graph, r, a)
                if not all(d in end for d in deps):
                    break
                start = max([free[r]] + [end[d] for d in deps])
                end[(r, a)] = free[r] = start + costs[(r, a.component)][a.backward]
                pos[r] += 1
                moved = True
    assert all(pos[r] == len(actions) for r, actions in schedule.items())
    return max(free.values())


@pytest.mark.parametrize("k", [4, 8, 16])
def test_1f1b_keeps_the_seed_loop_as_busy_as_gpipe(k):
    # Regression: on the seed MLP's loop, rank 0 ran its parameterless loss
    # component after its own heavy backwards, so rank 1 waited for the loss's
    # gradient; 1f1b took 71 units at K=16 where gpipe took 51.
    graph = Graph(LOOP)
    costs = cheap_outputs(graph)
    heavy = 20 + 40  # one micro-batch's forward and backward on one rank
    bound = (k + 1) * heavy + 3 * k  # two equal stages, plus the loss's own ticks on rank 0
    for kind in ("gpipe", "1f1b"):
        assert makespan(graph, plan(graph, k, kind, costs), costs) <= bound, kind
