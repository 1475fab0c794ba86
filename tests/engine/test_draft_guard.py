"""The guard per batch size (deploy/engine/draft_guard.py): a size first runs plain probes, then
drafting ones; it keeps drafting while drafting realises at least a plain iteration's gain, and
stops where it does not, retrying now and then so that it drafts again once drafting pays; each
batch size is judged on its own."""
from deploy.engine.draft_guard import PROBES, REPROBE_EVERY, RETRY_EVERY, DraftGuard


def run(guard: DraftGuard, rows: int, iterations: int, drafted_gain: float, plain_gain: float = 1.0) -> list[bool]:
    """`iterations` decisions, each iteration realising the given gain; -> the decisions."""
    decisions = []
    for _ in range(iterations):
        drafts = guard.drafts(rows)
        guard.observe(rows, drafts, drafted_gain if drafts else plain_gain)
        decisions.append(drafts)
    return decisions


def test_a_new_batch_size_probes_plain_iterations_first_then_drafting_ones():
    decisions = run(DraftGuard(), 8, 2 * PROBES, drafted_gain=1.3)
    assert decisions == [False] * PROBES + [True] * PROBES


def test_where_drafting_pays_the_size_drafts_but_for_a_plain_probe_now_and_then():
    guard = DraftGuard()
    decisions = run(guard, 8, 2 * PROBES + 4 * REPROBE_EVERY, drafted_gain=1.3)[2 * PROBES:]
    assert decisions.count(False) == 4 and guard.pays(8) is True


def test_where_drafting_costs_throughput_the_size_stays_plain_but_retries_drafting():
    guard = DraftGuard()
    decisions = run(guard, 28, 2 * PROBES + 5 * RETRY_EVERY, drafted_gain=0.9)[2 * PROBES:]
    assert decisions.count(True) == 5 and guard.pays(28) is False


def test_a_size_that_stopped_drafting_drafts_again_once_drafting_pays():
    guard = DraftGuard()
    run(guard, 28, 2 * PROBES + 3 * RETRY_EVERY, drafted_gain=0.9)
    later = run(guard, 28, 40 * RETRY_EVERY, drafted_gain=1.5)
    assert guard.pays(28) is True and later[-2 * REPROBE_EVERY:].count(False) <= 2


def test_each_batch_size_is_judged_on_its_own():
    guard = DraftGuard()
    run(guard, 28, 2 * PROBES + 2 * RETRY_EVERY, drafted_gain=0.9)
    run(guard, 8, 2 * PROBES, drafted_gain=1.3)
    assert guard.pays(28) is False and guard.pays(8) is True and guard.pays(16) is None
    report = guard.report()
    assert report["25-32"]["drafting"] is False and report["7-8"]["drafting"] is True
    assert report["25-32"]["plain_iterations"] > report["25-32"]["drafted_iterations"]


def test_a_new_replica_seeded_from_a_peers_figures_drafts_at_once_where_the_peer_found_it_pays():
    peer = DraftGuard()
    run(peer, 8, 2 * PROBES + 10, drafted_gain=1.3)
    newcomer = DraftGuard()
    newcomer.seed(peer.state())
    assert newcomer.pays(8) is True and run(newcomer, 8, 5, drafted_gain=1.3) == [True] * 5
    assert newcomer.pays(28) is None  # a size the peer never saw is still probed


def test_a_seed_never_overrides_what_the_guard_measured_itself_and_its_own_iterations_soon_outweigh_it():
    own = DraftGuard()
    run(own, 8, 2 * PROBES, drafted_gain=0.8)
    peer = DraftGuard()
    run(peer, 8, 2 * PROBES + 10, drafted_gain=1.5)
    own.seed(peer.state())
    assert own.pays(8) is False
    seeded = DraftGuard()
    seeded.seed(peer.state())  # drafting paid for the peer; here it does not
    run(seeded, 8, 3 * RETRY_EVERY, drafted_gain=0.7)
    assert seeded.pays(8) is False
