"""The step-time model (mnpar.pipeline.CostModel), in one process: no MPI."""
import pytest

from mnpar.pipeline import CostModel, Graph, Group, Link, hosts_of, plan
from mnpar.pipeline._schedule import component_costs

FREE = Link(0.0, float("inf"))
TICK = 1e-3


def chain(ranks):
    """A chain of one component per rank."""
    return Graph({r: [(None if r == 0 else (r - 1,), None if r == ranks - 1 else (r + 1,))]
                  for r in range(ranks)})


def seconds(costs):
    """Tick costs as seconds: forward, B, W."""
    return {n: tuple(TICK * c for c in cost) for n, cost in costs.items()}


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("kind", ["gpipe", "1f1b", "zb1", "zb2"])
@pytest.mark.parametrize("m", [1, 3, 6])
def test_free_links_give_the_plans_makespan(p, kind, m):
    graph = chain(p)
    costs = component_costs(graph, {n: 100 * (1 + n[0]) for n in graph.nodes()}, scale=5)
    proven = plan(graph, m, kind, costs)
    model = CostModel(hosts_of([1] * p), FREE, FREE)
    ends = model.pipeline(graph, proven, seconds(costs), {e.id: 1e6 for e in graph.edges})
    assert max(ends.values()) == pytest.approx(proven.makespan * TICK)
    assert model.predict_step(ends) == pytest.approx(proven.makespan * TICK)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_a_two_stage_chain_pays_two_messages(kind):
    # One micro-batch, F = 1 ms, whole backward 2 ms, on two hosts:
    # rank0 F | msg | rank1 F, B | msg | rank0 B  =  1 + 1 + 2 + 2 ms + 2 messages.
    graph = chain(2)
    costs = {n: (1, 2) for n in graph.nodes()}
    inter = Link(latency=50e-6, bandwidth=1e9)
    model = CostModel(hosts_of([1, 1]), FREE, inter)
    times = {n: (1e-3, 2e-3, 0.0) for n in graph.nodes()}
    ends = model.pipeline(graph, plan(graph, 1, kind, costs), times, {0: 4000})
    message = 50e-6 + 4000 / 1e9
    assert ends[0] == pytest.approx(6e-3 + 2 * message)
    assert ends[1] == pytest.approx(4e-3 + message)  # rank 1 ends with its B
    # The same ranks on one host cross the (free) link inside it.
    inside = CostModel(hosts_of([2]), FREE, inter)
    assert max(inside.pipeline(graph, plan(graph, 1, kind, costs), times,
                               {0: 4000}).values()) == pytest.approx(6e-3)


def test_ring_allreduce_on_small_cases():
    link = Link(latency=10e-6, bandwidth=1e9)
    model = CostModel(hosts_of([1, 1, 1, 1]), FREE, link)
    assert model.ring([0], 1e6) == 0.0
    # p = 2: 2 alpha + n / beta.
    assert model.ring([0, 1], 1e6) == pytest.approx(20e-6 + 1e-3)
    # p = 4: 6 alpha + 1.5 n / beta.
    assert model.ring([0, 1, 2, 3], 1e6) == pytest.approx(60e-6 + 1.5e-3)
    summing = CostModel(hosts_of([1, 1]), FREE, link, sum_rate=2e9)
    assert summing.ring([0, 1], 1e6) == pytest.approx(20e-6 + 1e-3 + 0.5e6 / 2e9)


def test_naive_pays_a_latency_per_array_and_flat_one():
    link = Link(latency=10e-6, bandwidth=1e9)
    model = CostModel(hosts_of([1, 1]), FREE, link)
    sizes = [1000] * 10
    assert model.allreduce([0, 1], sizes, "flat") == pytest.approx(20e-6 + 10e-6)
    assert model.allreduce([0, 1], sizes, "naive") == pytest.approx(10 * (20e-6 + 1e-6))


def test_hierarchical_is_a_ring_inside_hosts_and_one_among_leaders():
    intra, inter = Link(1e-6, 10e9), Link(10e-6, 1e9)
    model = CostModel(hosts_of([2, 2]), intra, inter)
    n = 4e6
    inside = 2 * 1e-6 + n / 10e9  # q = 2
    among = 2 * 10e-6 + n / 1e9  # h = 2
    assert model.allreduce([0, 1, 2, 3], [int(n)], "hierarchical") == pytest.approx(inside + among)
    # A ring over all four ranks crosses hosts: the inter link paces it.
    assert model.allreduce([0, 1, 2, 3], [int(n)], "flat") == pytest.approx(
        6 * 10e-6 + 1.5 * n / 1e9)
    with pytest.raises(ValueError, match="strategy='ring' is not one of"):
        model.allreduce([0, 1], [1], "ring")


def test_a_group_waits_for_its_slowest_rank_then_updates():
    link = Link(latency=0.0, bandwidth=1e9)
    model = CostModel(hosts_of([1, 1, 1]), FREE, link)
    ends = {0: 1e-3, 1: 3e-3, 2: 2e-3}
    step = model.predict_step(ends, [Group([0, 1], [int(1e6)], "flat")], {0: 5e-4})
    assert step == pytest.approx(3e-3 + 1e-3 + 5e-4)
    assert model.predict_step(ends) == pytest.approx(3e-3)


def test_collective_links_pace_the_allreduce_not_the_messages():
    slow = Link(latency=1e-3, bandwidth=1e8)
    model = CostModel(hosts_of([1, 1]), FREE, Link(0.0, 1e9), collective=(FREE, slow))
    assert model.allreduce([0, 1], [int(1e6)], "flat") == pytest.approx(2e-3 + 1e-2)
    assert model.message(0, 1, 1e6) == pytest.approx(1e-3)
