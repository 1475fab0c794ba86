"""`specfleet status` shows every node, where each replica and drafter runs (its own actor or the
coordinator) and whether it is up."""
from cluster.status import render_status

STATUS = {
    "policy": "metasd-ucb-cost",
    "nodes": [{"node": "aaaaaaaa1111", "node_ip": "10.0.0.1", "alive": True, "gpus": 2.0},
              {"node": "bbbbbbbb2222", "node_ip": "10.0.0.2", "alive": False, "gpus": 1.0}],
    "replicas": [{"replica": "SERVE_REPLICA::specfleet#SpecfleetServer#x1", "node": "aaaaaaaa1111",
                  "node_ip": "10.0.0.1", "gpu": ["0"], "device": "cuda:0", "forward_costs": "adopted"}],
    "drafters": [
        {"name": "ngram", "kind": "ngram", "model": None, "runs_in": "coordinator", "node": "aaaaaaaa1111",
         "node_ip": "10.0.0.1", "gpu": [], "device": "cpu", "status": "up", "pulls": 12, "acceptance": 0.5},
        {"name": "small", "kind": "hf", "model": "/models/small", "runs_in": "actor", "node": None, "node_ip": None,
         "gpu": [], "device": None, "status": "down", "pulls": 0, "acceptance": None},
    ],
}


def test_status_lists_nodes_replicas_and_drafters_with_their_gpus():
    text = render_status(STATUS)
    assert "nodes (1 alive):" in text and "target replicas (1):" in text and "drafters (1/2 up):" in text
    replica_line = next(line for line in text.splitlines() if "SERVE_REPLICA" in line)
    assert replica_line.split()[1:] == ["aaaaaaaa", "10.0.0.1", "0", "cuda:0", "adopted"]
    ngram_line = next(line for line in text.splitlines() if line.split()[:1] == ["ngram"])
    assert ngram_line.split() == ["ngram", "ngram", "-", "coordinator", "aaaaaaaa", "10.0.0.1", "-", "cpu", "up", "12", "0.50"]


def test_a_drafter_that_does_not_answer_shows_as_down_without_a_node():
    small_line = next(line for line in render_status(STATUS).splitlines() if line.split()[:1] == ["small"])
    assert small_line.split() == ["small", "hf", "/models/small", "actor", "-", "-", "-", "-", "down", "0", "-"]
