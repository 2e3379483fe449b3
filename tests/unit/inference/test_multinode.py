"""One model across several containers: each node's command line and environment from the same service data, the
plan's refusals of what the engines cannot do well, and the plan module rendering only the services a node runs."""

import copy

import pytest
from inference import command, known_bad, plan
from inference_refdata import MODELS, REFERENCE
from module_runner import load_module, run_module

PLAN = load_module("inference_service_plan")
ADDRESSES = {"ct-a": "10.0.0.1", "ct-b": "10.0.0.2", "ct-c": "10.0.0.3"}


def spanning(services, name, nodes=("ct-a", "ct-b"), **changes):
    service = copy.deepcopy(services[name])
    service.update(nodes=list(nodes), **changes)
    return service


def argv_of(service, host, addresses=ADDRESSES):
    where = command.placement(service, host, addresses)
    return command.build_argv(service, where=where), where


def after(argv, flag):
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize(("host", "rank"), [("ct-a", 0), ("ct-b", 1)])
def test_vllm_ranks_get_the_group_the_head_and_headless_above_rank_0(services, host, rank):
    service = spanning(services, "minimax-m25", dist_port=29600)
    argv, where = argv_of(service, host)
    assert where["rank"] == rank and where["head"] == "ct-a"
    assert after(argv, "--nnodes") == "2" and after(argv, "--node-rank") == str(rank)
    assert after(argv, "--master-addr") == "10.0.0.1" and after(argv, "--master-port") == "29600"
    assert ("--headless" in argv) is (rank > 0)
    # Four GPUs on each of two nodes: tensor parallel within a node, pipeline parallel across them.
    assert after(argv, "--tensor-parallel-size") == "4" and after(argv, "--pipeline-parallel-size") == "2"
    assert "--dist-init-addr" not in argv


@pytest.mark.parametrize(("host", "rank"), [("ct-a", 0), ("ct-b", 1)])
def test_sglang_ranks_get_the_group_and_the_heads_init_address(services, host, rank):
    service = spanning(services, "qwen35")
    argv, _ = argv_of(service, host)
    assert after(argv, "--nnodes") == "2" and after(argv, "--node-rank") == str(rank)
    assert after(argv, "--dist-init-addr") == f"10.0.0.1:{command.DEFAULT_DIST_PORT}"
    assert after(argv, "--tp-size") == "8" and after(argv, "--pp-size") == "2"
    assert not {"--headless", "--master-addr", "--master-port"} & set(argv)


def test_a_nodes_own_address_wins_and_an_ipv6_head_is_bracketed_for_sglang(services):
    service = spanning(services, "qwen35", nodes=[{"host": "ct-a", "address": "fd00::1"}, "ct-b"])
    argv, _ = argv_of(service, "ct-b")
    assert after(argv, "--dist-init-addr") == f"[fd00::1]:{command.DEFAULT_DIST_PORT}"
    vllm = spanning(services, "minimax-m25", nodes=[{"host": "ct-a", "address": "192.0.2.7"}, "ct-b"])
    assert after(argv_of(vllm, "ct-b")[0], "--master-addr") == "192.0.2.7"


def test_one_node_or_none_renders_no_group_flags(services):
    for nodes in ([], ["ct-a"]):
        service = spanning(services, "minimax-m25", nodes=nodes)
        assert command.placement(service, "ct-a", ADDRESSES) is None
        argv = command.build_argv(service)
        assert "--nnodes" not in argv and "--pipeline-parallel-size" not in argv


def test_a_host_the_service_does_not_name_has_no_place(services):
    with pytest.raises(ValueError, match="ct-c is not one of the nodes"):
        command.placement(spanning(services, "minimax-m25"), "ct-c", ADDRESSES)


def test_the_nodes_interface_carries_nccl_and_gloo_and_a_per_node_one_wins(services):
    service = spanning(
        services, "minimax-m25", nodes=["ct-a", {"host": "ct-b", "network_interface": "ib0"}], network_interface="eth1"
    )
    for host, interface in (("ct-a", "eth1"), ("ct-b", "ib0")):
        where = command.placement(service, host, ADDRESSES)
        env = command.build_environment(service, unit="u", where=where)
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == interface
    plain = command.build_environment(spanning(services, "minimax-m25"), unit="u", where=None)
    assert "NCCL_SOCKET_IFNAME" not in plain


def checked(service, inventory=tuple(ADDRESSES)):
    return {r["id"]: r for r in plan.check_nodes(service, list(inventory))}


def test_tensor_parallel_across_hosts_is_refused_without_a_fast_fabric(services):
    service = spanning(services, "minimax-m25", tensor_parallel_size=8)
    hit = checked(service)["nodes.tensor_parallel"]
    assert "spans hosts" in hit["reason"] and "fabric ethernet" in hit["reason"]
    assert "pipeline_parallel_size 2" in hit["fix"] and "tensor_parallel_size 4" in hit["fix"]
    for fabric in ("infiniband", "nvlink"):
        assert "nodes.tensor_parallel" not in checked({**service, "fabric": fabric})
    assert "nodes.tensor_parallel" in checked({**service, "fabric": "pcie"})
    # Its fix passes.
    assert checked(spanning(services, "minimax-m25", tensor_parallel_size=4, pipeline_parallel_size=2)) == {}


def test_the_gpu_count_is_the_nodes_times_the_gpus_of_each(services):
    hit = checked(spanning(services, "minimax-m25", pipeline_parallel_size=3))["nodes.gpus"]
    assert "= 12 GPUs" in hit["reason"] and "2 nodes x 4 GPUs" in hit["reason"] and "= 8" in hit["reason"]


def test_duplicates_and_hosts_outside_the_inventory_are_refused(services):
    assert (
        "ct-a more than once"
        in checked(spanning(services, "minimax-m25", nodes=["ct-a", "ct-a"]))["nodes.duplicate"]["reason"]
    )
    hit = checked(spanning(services, "minimax-m25", nodes=["ct-x", "ct-b"]))["nodes.inventory"]
    assert "ct-x" in hit["reason"] and "its head" in hit["reason"]
    assert "nodes.inventory" not in plan.check_nodes(spanning(services, "minimax-m25", nodes=["ct-x", "ct-b"]))


@pytest.mark.parametrize(
    ("changes", "ident"),
    [
        ({"network_interface": "eth 1"}, "network_interface"),
        ({"fabric": "token-ring"}, "fabric"),
        ({"dist_port": 8000}, "dist_port"),
        ({"dist_port": 70000}, "dist_port"),
        ({"args": {"nnodes": 2}}, "args.nnodes"),
        ({"args": {"headless": True}}, "args.headless"),
        ({"args": {"pipeline-parallel-size": 2}}, "args.pipeline-parallel-size"),
    ],
)
def test_bad_group_fields_are_refused(services, changes, ident):
    service = spanning(services, "minimax-m25", **changes)
    found = {r["id"] for r in plan.plan_service(service, known_bad=known_bad.rules(), gpu_count=8)["refusals"]}
    assert ident in found


def test_group_fields_without_nodes_are_refused(services):
    service = {**services["minimax-m25"], "fabric": "infiniband"}
    [hit] = plan.check_nodes(service)
    assert hit["id"] == "fabric" and "names no nodes" in hit["reason"]


def plan_module(services, node, **kw):
    fixtures = []
    for name, service in services.items():
        fixtures.append({**service, "model": {**service["model"], "path": str(MODELS / REFERENCE[name])}})
    args = {"services": fixtures, "compute_capability": "12.0", "gpu_count": 8, "node": node}
    args.update(node_addresses=ADDRESSES, inventory_hosts=list(ADDRESSES), **kw)
    return run_module(PLAN, args)


@pytest.fixture
def group_services(services):
    return {**services, "minimax-m25": spanning(services, "minimax-m25", network_interface="eth1")}


def test_each_node_renders_its_own_rank_and_only_the_head_serves(group_services):
    head = plan_module(group_services, "ct-a", active="minimax-m25")
    worker = plan_module(group_services, "ct-b", active="minimax-m25")
    for result, rank in ((head, 0), (worker, 1)):
        assert not result.get("failed"), result.get("msg")
        mine = next(s for s in result["services"] if s["name"] == "minimax-m25")
        assert mine["group"] == {"service": "minimax-m25", "nodes": ["ct-a", "ct-b"], "rank": rank}
        assert mine["serves"] is (rank == 0)
        assert f"--node-rank {rank}" in mine["exec_start"] and ("--headless" in mine["argv"]) is (rank > 0)
        assert '"NCCL_SOCKET_IFNAME=eth1"' in mine["environment_lines"]
        assert result["active"] == "minimax-m25" and result["elsewhere"] == []
    single = next(s for s in head["services"] if s["name"] == "qwen35")
    assert single["group"] is None and single["serves"] is True


def test_a_container_the_service_does_not_name_runs_none_of_it(group_services):
    result = plan_module(group_services, "ct-c", active="minimax-m25")
    assert not result.get("failed"), result.get("msg")
    assert result["elsewhere"] == ["minimax-m25"] and result["active"] == ""
    assert "minimax-m25" not in {s["name"] for s in result["services"]}
    assert all("inference-minimax-m25.service" not in s["conflicts"] for s in result["services"])


def test_tensor_parallel_across_hosts_stops_the_plan_module(group_services):
    group_services["minimax-m25"]["tensor_parallel_size"] = 8
    result = plan_module(group_services, "ct-a", active="minimax-m25")
    assert result["failed"] and "spans hosts" in result["msg"] and "Fix: tensor_parallel_size 4" in result["msg"]


def test_a_service_with_nodes_needs_the_node(group_services):
    result = plan_module(group_services, "")
    assert result["failed"] and "node (this host) is needed" in result["msg"]
