"""GOPA: exact cancellation, secure channels, exact accounting, calibration, dropouts."""

import math

import numpy as np
import pytest
from scipy.stats import norm

from renyi import noise
from renyi.errors import PrivacyParameterError
from renyi.federated.channels import (
    ChaCha20Source,
    ChannelIntegrityError,
    EphemeralSession,
    IdentityKey,
    KeySubstitutionError,
    Roster,
)
from renyi.federated.gopa import (
    FRACTION_BITS,
    GopaParty,
    GopaProtocol,
    ProtocolAbortedError,
    calibrate_gopa,
    gopa_mu,
    gopa_mu_complete,
    random_peer_graph,
    recommended_peers,
    simulate_gopa_std,
)
from renyi.federated.gopa_party import GopaAggregator, lattice_mean, to_fixed

pytestmark = pytest.mark.filterwarnings("ignore::renyi.errors.InsecureRandomnessWarning")
SCALE = 2**FRACTION_BITS


def _near_mean(estimate, values):
    """Without independent noise, each message and the revealed correction are rounded
    once to 2**-32: the mean is off by less than one step."""
    return abs(estimate - np.mean(values)) <= 1.0 / SCALE


# ----------------------------------------------------------------- protocol and channels


@pytest.mark.parametrize("shape", [(12,), (9, 4)])
def test_pairwise_terms_cancel_up_to_the_lattice(shape):
    rng = np.random.default_rng(1)
    vals = rng.uniform(size=shape) / (4 if len(shape) == 2 else 1)
    proto = GopaProtocol(vals, sigma_eta=0.0, sigma_delta=50.0, peers=3, rng=rng)
    res = proto.run()
    g = res.lattice
    assert g == 2.0**-FRACTION_BITS  # no independent noise: the fine fixed-point lattice
    # each message is rounded once: the sum is off by at most half a step per message
    err = np.atleast_1d(res.estimate) - vals.mean(axis=0)
    assert np.all(np.abs(err) <= g / 2 * (1 + 1e-9) + 1e-15)
    for eid, (u, v) in enumerate(proto.edges.tolist()):
        a, b = proto.parties[u]._terms[eid], proto.parties[v]._terms[eid]
        assert np.array_equal(a, -b) and (a != 0).all()


def test_estimate_is_a_lattice_sum():
    """The release is ``g S / K`` with ``S`` an integer, ``g = lattice_step(sigma_eta)``; the
    same values and noise keys with another graph give the same release up to rounding."""
    rng = np.random.default_rng(2)
    vals = rng.uniform(size=15)
    keys = [bytes([i + 1]) * 32 for i in range(15)]
    res = GopaProtocol(vals, sigma_eta=0.3, sigma_delta=20.0, peers=4, rng=rng, noise_keys=keys)
    r = res.run()
    g = noise.lattice_step(0.3)
    assert r.lattice == g and r.total.dtype == np.int64
    assert r.estimate == float(lattice_mean(r.total.view(np.uint64), 15, g)[0])
    # the independent noise is the keyed normals of renyi.noise, one draw per party
    eta = [0.3 * noise.standard_normal(1, rng=ChaCha20Source(k))[0] for k in keys]
    assert abs(r.estimate - (vals.sum() + sum(eta)) / 15) <= g / 2
    again = GopaProtocol(vals, sigma_eta=0.3, sigma_delta=7.0, peers=2, noise_keys=keys).run()
    assert abs(again.estimate - r.estimate) <= g  # another graph and session: same noise


@pytest.mark.parametrize("k", [2, 3, 10])
def test_release_carries_no_residue_of_the_inputs(k):
    """Issue 22.2: ``K * estimate mod g_eta`` equalled ``sum X mod g_eta`` in every run (eta
    on its lattice, the values in fixed point 2**-32): one release told 0 from 0.01. Now the
    release lies on ``g Z / K`` for both inputs, run after run."""
    sigma = 0.3
    g = noise.lattice_step(sigma)
    residues = {}
    for x0 in (0.0, 0.01):
        vals = np.full(k, 0.5)
        vals[0] = x0
        r = []
        for _ in range(12):
            res = GopaProtocol(vals, sigma_eta=sigma, sigma_delta=3.0, peers=1).run()
            r.append(math.remainder(k * float(res.estimate), g))  # in [-g/2, g/2]
        residues[x0] = np.abs(r)
    # a release on the lattice: K * estimate is g S up to the rounding of the division by K
    for x0, r in residues.items():
        assert np.all(r <= 1e-12), (x0, r.max())


def test_large_pairwise_noise_no_spurious_overflow():
    """sigma_delta = 1e7 used to abort ('would overflow int64'); modular sums stay exact up
    to each message's rounding."""
    rng = np.random.default_rng(9)
    vals = rng.uniform(size=40)
    res = GopaProtocol(vals, sigma_eta=0.5, sigma_delta=1e7, peers=5, rng=rng).run()
    assert abs(res.estimate - vals.mean()) < 20 * 0.5 / math.sqrt(40)
    with pytest.raises(PrivacyParameterError, match="sigma_delta"):
        GopaProtocol(vals, sigma_eta=0.0, sigma_delta=1e9, peers=5, rng=rng)
    with pytest.raises(PrivacyParameterError, match="lattice index"):
        GopaProtocol(vals, sigma_eta=1e-6, sigma_delta=1e7, peers=5, rng=rng)


def test_restoring_a_party_twice_answers_with_the_same_bytes():
    """Issue 22.6: a party restored twice from the same stored state used to draw a fresh
    eta over the same pairwise terms (two releases); now the state holds the session's
    noise and seeds, so each round's answer is the same bytes."""
    rng = np.random.default_rng(3)
    proto = GopaProtocol(rng.uniform(size=6), sigma_eta=0.2, sigma_delta=5.0, peers=2)
    s = proto.session
    ads = {p.name: p.join(s).to_bytes() for p in proto.parties}
    saved = [p.export_state() for p in proto.parties]
    boxes = [p.pair(ads) for p in proto.parties]
    inboxes = GopaAggregator.route({p.name: b for p, b in zip(proto.parties, boxes, strict=True)})
    target = proto.parties[0]
    # pairing again from the same joined state: same seeds inside (fresh AEAD keys outside)
    twin = GopaParty(target.identity, proto.roster, target._value)
    twin.restore_state(s, saved[0])
    assert twin._seeds == {e: v for e, v in target._seeds.items()}
    after_pair = target.export_state()
    names = [p.name for p in proto.parties]
    answers = []
    for _ in range(2):
        p = GopaParty(target.identity, proto.roster, target._value)
        p.restore_state(s, after_pair)
        answers.append(p.mask(inboxes[p.name], names).tobytes())
    assert answers[0] == answers[1]


def test_pairwise_noise_is_gaussian_and_key_dependent():
    z = ChaCha20Source(b"k" * 32).normal(20000)
    # Kolmogorov-Smirnov against N(0, 1); false-alarm rate 1e-3 at a fixed key
    from scipy.stats import kstest

    assert kstest(z, norm.cdf).pvalue > 1e-3
    assert np.array_equal(z, ChaCha20Source(b"k" * 32).normal(20000))
    other = ChaCha20Source(b"j" * 32).normal(20000)
    assert abs(np.corrcoef(z, other)[0, 1]) < 0.05


def test_tampered_pairing_message_aborts_before_masking():
    rng = np.random.default_rng(3)
    proto = GopaProtocol(rng.uniform(size=6), sigma_eta=0.1, sigma_delta=5.0, peers=2, rng=rng)
    proto.send_seeds()
    receiver = next(iter(proto.inboxes))
    sender = next(iter(proto.inboxes[receiver]))
    bad = bytearray(proto.inboxes[receiver][sender])
    bad[-1] ^= 0x01
    proto.inboxes[receiver][sender] = bytes(bad)
    with pytest.raises(ChannelIntegrityError, match="failed authentication"):
        proto.aggregate()
    party = next(p for p in proto.parties if p.name == receiver)
    assert party.eta is None  # nothing derived from the value was produced


def test_relay_key_substitution_aborts_before_any_value():
    """A relay that swaps a party's ephemeral key for its own (classic MITM) is detected."""
    rng = np.random.default_rng(6)
    proto = GopaProtocol(rng.uniform(size=8), sigma_eta=0.1, sigma_delta=5.0, peers=3, rng=rng)
    proto.session  # noqa: B018
    parties = proto.parties
    ads = {p.name: p.join(proto.session) for p in parties}
    # the relay makes its own session key for party-1 and signs with a key it owns
    mallory = IdentityKey("party-1")
    fake = EphemeralSession(mallory, Roster.of([mallory]), proto.session.session).advertisement()
    directory = {n: a.to_bytes() for n, a in ads.items()}
    directory["party-1"] = fake.to_bytes()
    victims = [p for p in parties if 1 in proto.session.neighbours(proto.session.index(p.name))]
    assert victims
    for p in victims:
        with pytest.raises(KeySubstitutionError, match="not signed by its pinned"):
            p.pair(directory)
        assert p.eta is None
    # an advertisement replayed from another session is refused too
    other = EphemeralSession(parties[1].identity, proto.roster, bytes(16)).advertisement()
    with pytest.raises(KeySubstitutionError, match="another session"):
        other.verify(proto.roster, proto.session.session)


def test_garbage_message_is_rejected_and_recovered_as_dropout():
    rng = np.random.default_rng(7)
    vals = rng.uniform(size=12)
    proto = GopaProtocol(vals, sigma_eta=0.0, sigma_delta=3.0, peers=2, rng=rng, reveal_budget=12)
    proto.send_seeds()
    garbage = to_fixed([1e6])  # one party sends 1e6 instead of a value in [0, 1]
    res = proto.aggregate(replace={4: garbage})
    assert res.rejected == (4,) and res.dropped == (4,)
    alive = np.setdiff1d(np.arange(12), [4])
    assert _near_mean(res.estimate, vals[alive])
    assert res.false_rejection_bound == pytest.approx(12 * 1e-9)
    # malformed types and shapes are rejected the same way, never summed
    server = proto.server
    for junk in (b"xx", np.zeros(3, np.uint64), np.zeros(1, np.float64), [1, 2]):
        assert server.check_message(0, junk, range(12)) is not None
    # the acceptance range is z sigma wide: an honest message is within it (z = 6.1)
    _, hi = proto.session.acceptance_bound(0, 4)
    assert hi - 1 == pytest.approx(norm.isf(0.5e-9) * 6.0, rel=1e-6)


def test_party_validates_or_clips_its_own_value():
    ident = IdentityKey("a")
    roster = Roster.of([ident, IdentityKey("b")])
    with pytest.raises(PrivacyParameterError, match="value"):
        GopaParty(ident, roster, 1.5)
    with pytest.raises(PrivacyParameterError, match="value"):
        GopaParty(ident, roster, float("nan"), clip=True)
    p = GopaParty(ident, roster, 1.5, clip=True)
    assert p._value[0] == 1.0
    q = GopaParty(ident, roster, [3.0, 4.0], vector=True, clip=True)
    assert np.linalg.norm(q._value) == pytest.approx(0.5)
    with pytest.raises(PrivacyParameterError, match="roster"):
        GopaParty(IdentityKey("c"), roster, 0.5)


def test_dropout_recovery_within_and_beyond_reveal_budget():
    rng = np.random.default_rng(4)
    vals = rng.uniform(size=20)
    edges = random_peer_graph(20, 3, rng)
    # within the budget: every survivor reveals at most 2 neighbours
    proto = GopaProtocol(
        vals, sigma_eta=0.0, sigma_delta=30.0, peers=3, edges=edges, rng=rng, reveal_budget=2
    )
    proto.send_seeds()
    res = proto.aggregate([3, 7])
    with pytest.raises(ProtocolAbortedError, match="already released"):
        proto.server.release({}, range(20), None)  # one release per session
    alive = np.setdiff1d(np.arange(20), [3, 7])
    assert _near_mean(res.estimate, vals[alive])
    touching = np.flatnonzero(np.isin(edges, [3, 7]).any(axis=1))
    assert set(res.revealed_edges) == set(touching.tolist()) - set(
        np.flatnonzero(np.isin(edges, [3, 7]).all(axis=1)).tolist()
    )
    after = proto.privacy(dropouts=[3, 7])
    mask = np.ones(20, dtype=bool)
    mask[[3, 7]] = False
    assert after.mu == gopa_mu(edges, 0.0, 30.0, parties=20, honest=mask).mu
    # beyond: a neighbour of both 3 and 7 (or of 3 with budget 0) refuses; nothing released
    for budget, drop in ((0, [3]), (1, [3, 7])):
        p2 = GopaProtocol(
            vals,
            sigma_eta=0.0,
            sigma_delta=30.0,
            peers=3,
            edges=edges,
            rng=rng,
            reveal_budget=budget,
        )
        p2.send_seeds()
        both = [u for u in range(20) if set(drop) <= set(p2.session.neighbours(u))]
        if budget == 1 and not both:
            continue
        with pytest.raises(ProtocolAbortedError, match="reveal budget"):
            p2.aggregate(drop)
    # abort mode never recovers
    p3 = GopaProtocol(
        vals, sigma_eta=0.0, sigma_delta=30.0, peers=3, edges=edges, rng=rng, reveal_budget=5
    )
    p3.send_seeds()
    with pytest.raises(ProtocolAbortedError, match="dropped"):
        p3.aggregate([3], on_dropout="abort")


def test_absent_before_masking_counts_against_the_budget():
    rng = np.random.default_rng(8)
    vals = rng.uniform(size=10)
    proto = GopaProtocol(vals, sigma_eta=0.0, sigma_delta=5.0, peers=2, rng=rng, reveal_budget=2)
    proto.send_seeds(absent=[5])
    res = proto.aggregate()
    alive = np.setdiff1d(np.arange(10), [5])
    assert _near_mean(res.estimate, vals[alive]) and res.revealed_edges == ()
    # a lying server telling a party that all its neighbours are gone is refused
    p2 = GopaProtocol(vals, sigma_eta=0.0, sigma_delta=5.0, peers=3, rng=rng, reveal_budget=1)
    p2.send_seeds()
    victim = p2.parties[0]
    with pytest.raises(ProtocolAbortedError, match="reveal budget"):
        victim.mask(p2.inboxes[victim.name], [victim.name])
    assert p2.session.lying_server_mu() == 1.0 / p2.sigma_eta if p2.sigma_eta else True


def test_lying_server_worst_case_is_stated():
    rng = np.random.default_rng(10)
    vals = rng.uniform(size=10)
    for budget, want in ((0, 0.0), (1, 1 / 0.4), (3, 1 / 0.4)):
        proto = GopaProtocol(
            vals, sigma_eta=0.4, sigma_delta=5.0, peers=2, rng=rng, reveal_budget=budget
        )
        assert proto.session.lying_server_mu() == want
    # the bound is attained: a lying server strips the target's edges
    proto = GopaProtocol(vals, sigma_eta=0.4, sigma_delta=5.0, peers=2, rng=rng, reveal_budget=1)
    s = proto.session
    target = 0
    stripped = np.flatnonzero(~(s.edges == target).any(axis=1))
    mu = gopa_mu(s.edges[stripped], 0.4, 5.0, parties=10).mu
    assert mu == pytest.approx(1 / 0.4, rel=1e-9)


def test_protocol_privacy_matches_accounting():
    rng = np.random.default_rng(5)
    proto = GopaProtocol(rng.uniform(size=10), sigma_eta=0.5, sigma_delta=4.0, peers=2, rng=rng)
    p = proto.privacy(honest=np.arange(6))
    q = gopa_mu(proto.edges, 0.5, 4.0, parties=10, honest=np.arange(6))
    assert p.mu == q.mu


# ----------------------------------------------------------------- accounting


def _brute_force_mu(edges, sigma_eta, sigma_delta, honest, parties):
    pos = {u: i for i, u in enumerate(honest)}
    n = len(honest)
    lap = np.zeros((n, n))
    for u, v in edges:
        if u in pos and v in pos:
            i, j = pos[u], pos[v]
            lap[i, i] += 1
            lap[j, j] += 1
            lap[i, j] -= 1
            lap[j, i] -= 1
    cov = sigma_eta**2 * np.eye(n) + sigma_delta**2 * lap
    return math.sqrt(np.diag(np.linalg.inv(cov)).max())


@pytest.mark.parametrize("seed", range(6))
def test_accounting_against_dense_inverse(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(4, 30))
    edges = random_peer_graph(k, int(rng.integers(1, min(4, k - 1) + 1)), rng)
    honest = np.sort(rng.choice(k, size=int(rng.integers(2, k + 1)), replace=False))
    se, sd = float(rng.uniform(0.1, 2)), float(rng.uniform(0, 20))
    ref = _brute_force_mu(edges.tolist(), se, sd, honest.tolist(), k)
    for method in ("dense", "sparse"):
        got = gopa_mu(edges, se, sd, parties=k, honest=honest, method=method).mu
        assert got >= ref * (1 - 1e-12)  # conservative (residual-checked upper bound)
        assert got == pytest.approx(ref, rel=1e-9)


@pytest.mark.parametrize(("n", "se", "sd"), [(2, 1.0, 1.0), (7, 0.3, 5.0), (40, 2.0, 100.0)])
def test_complete_graph_closed_form(n, se, sd):
    edges = np.array([(u, v) for u in range(n) for v in range(u + 1, n)])
    got = gopa_mu(edges, se, sd, parties=n)
    sparse = gopa_mu(edges, se, sd, parties=n, method="sparse")
    closed_form = math.sqrt(1 / (n * se**2) + (1 - 1 / n) / (n * sd**2 + se**2))
    assert closed_form * (1 - 1e-15) <= sparse.mu <= closed_form * (1 + 1e-9)
    closed = math.sqrt(1 / (n * se**2) + (1 - 1 / n) / (n * sd**2 + se**2))
    assert got.mu >= closed * (1 - 1e-15)  # an upper bound ...
    assert got.mu == pytest.approx(closed, rel=1e-7)  # ... and a tight one
    assert gopa_mu_complete(n, se, sd) == pytest.approx(closed, rel=1e-14)
    assert got.connected and got.components == (n,)


@pytest.mark.parametrize("method", ["dense", "sparse"])
def test_limits_no_edges_and_huge_pairwise_noise(method):
    # no pairwise noise: local DP, mu = 1 / sigma_eta
    none = gopa_mu(np.zeros((0, 2), int), 0.5, 3.0, parties=5, method=method)
    assert none.mu == pytest.approx(2.0)
    # connected graph, sigma_delta -> inf: trusted-curator limit 1 / (sqrt(n) sigma_eta)
    ring = np.array([(i, (i + 1) % 8) for i in range(8)])
    p = gopa_mu(ring, 1.0, 1e3, parties=8, method=method)
    assert p.mu == pytest.approx(1 / math.sqrt(8), rel=1e-4) and p.degradation >= 1
    # ill-conditioned (kappa ~ 1e10): still an upper bound, loose only by ~ eps * kappa
    q = gopa_mu(ring, 1.0, 1e5, parties=8, method=method)
    assert 1 / math.sqrt(8) <= q.mu <= 1 / math.sqrt(8) * (1 + 1e-4)


@pytest.mark.parametrize("method", ["dense", "sparse"])
def test_disconnected_honest_graph_is_detected_and_degraded(method):
    tri = [(0, 1), (1, 2), (2, 0), (3, 4), (4, 5), (5, 3)]
    p = gopa_mu(tri, 1.0, 1e4, parties=6, method=method)
    assert not p.connected and p.components == (3, 3)
    # each component only hides among itself: mu -> 1/sqrt(3), not the curator 1/sqrt(6)
    assert p.mu == pytest.approx(1 / math.sqrt(3), rel=1e-5)
    assert p.degradation == pytest.approx(math.sqrt(2), rel=1e-5)
    # corrupting the bridge disconnects the honest graph
    path = [(0, 1), (1, 2), (2, 3)]
    q = gopa_mu(path, 1.0, 1e4, parties=4, honest=[0, 1, 3], method=method)
    assert not q.connected and q.components == (2, 1)
    # party 3 is alone: local DP (kappa ~ 1e8 here, so the rigorous bound loses ~ eps kappa)
    assert 1.0 <= q.mu <= 1.0 + 1e-6


def test_gdp_to_dp_and_rdp():
    p = gopa_mu([(0, 1), (1, 2)], 1.0, 3.0, parties=3)
    eps = p.epsilon(1e-5)
    d = norm.cdf(-eps / p.mu + p.mu / 2) - math.exp(eps) * norm.cdf(-eps / p.mu - p.mu / 2)
    assert d <= 1e-5 * (1 + 1e-9) and d > 0.99e-5
    assert p.delta(eps) == pytest.approx(d, rel=1e-6)
    np.testing.assert_allclose(p.rdp([2.0, 10.0]), np.array([2.0, 10.0]) * p.mu**2 / 2)


def test_sparse_path_large_graph():
    rng = np.random.default_rng(9)
    edges = random_peer_graph(700, 4, rng)
    honest = np.sort(rng.choice(700, 600, replace=False))
    sp = gopa_mu(edges, 1.0, 10.0, parties=700, honest=honest, method="sparse")
    assert sp.method == "sparse"
    de = gopa_mu(edges, 1.0, 10.0, parties=700, honest=honest)
    assert de.method == "dense"
    assert sp.mu == pytest.approx(de.mu, rel=1e-9)


# ----------------------------------------------------------------- calibration


@pytest.mark.parametrize(("k", "m"), [(30, 4), (3000, 6)])  # key ranking / rejection path
def test_random_peer_graph_is_uniform(k, m):
    from scipy.stats import chisquare

    e = random_peer_graph(k, m, np.random.default_rng(21))
    assert e.shape == (k * m, 2) and (e[:, 0] != e[:, 1]).all()
    rows = e[:, 1].reshape(k, m)
    assert all(np.unique(r).size == m for r in rows[:50])
    # offsets v - u (mod k) are uniform on 1..k-1 for a uniform m-subset of the others;
    # chi-square on 10 bins, false-alarm rate 1e-3
    off = (e[:, 1] - e[:, 0]) % k
    counts = np.histogram(off, bins=10, range=(1, k))[0]
    exp = np.diff(np.ceil(np.linspace(1, k, 11)))  # integers per bin
    assert chisquare(counts, exp / exp.sum() * counts.sum()).pvalue > 1e-3


def test_recommended_peers():
    assert recommended_peers(1000, 0.5) == math.ceil(math.log(500) / 0.5) == 13
    assert recommended_peers(1000, 1.0) == math.ceil(math.log(1000))


@pytest.mark.parametrize(
    ("rho", "factor", "tol"),
    [(1.0, 100.0, 0.04), (0.8, 100.0, 0.04), (0.5, 100.0, 0.04), (0.2, 100.0, 0.04),
     (0.2, 1000.0, 0.01)],
)  # fmt: skip
def test_std_ratio_to_central_is_one_over_sqrt_rho(rho, factor, tol):
    cal = calibrate_gopa(500, rho, 1.0, 1e-5, pairwise_factor=factor, rng=np.random.default_rng(11))
    assert cal.privacy.mu <= cal.target_mu
    assert cal.privacy.connected
    # the guarantee is met and the cost over the trusted curator is ~ 1/sqrt(rho)
    assert cal.ratio_to_central == pytest.approx(1 / math.sqrt(rho), rel=tol)
    assert cal.ratio_to_central >= 1 / math.sqrt(rho) * (1 - 1e-9)
    assert cal.local_std / cal.output_std == pytest.approx(math.sqrt(rho * 500), rel=tol)


def test_lecture_setting_is_within_two_percent_of_the_curator():
    cal = calibrate_gopa(1000, 0.5, 1.0, 1e-5, rng=np.random.default_rng(12))
    assert cal.peers == 13 and cal.honest_count == 500
    assert cal.privacy.degradation < 1.025
    eps = cal.privacy.epsilon(1e-5)
    assert eps <= 1.0


def test_simulated_std_matches_calibration():
    cal = calibrate_gopa(200, 0.5, 1.0, 1e-5, rng=np.random.default_rng(13))
    sim = simulate_gopa_std(cal, trials=1500, rng=np.random.default_rng(14))
    assert sim == pytest.approx(cal.output_std, rel=0.06)  # sd of the estimate ~1.8%


def test_bad_inputs():
    with pytest.raises(PrivacyParameterError, match="peers=5"):
        random_peer_graph(5, 5)
    with pytest.raises(PrivacyParameterError, match="edges"):
        gopa_mu([(0, 9)], 1.0, 1.0, parties=3)
    with pytest.raises(PrivacyParameterError, match="honest"):
        gopa_mu([(0, 1)], 1.0, 1.0, parties=3, honest=[])
    with pytest.raises(PrivacyParameterError, match="sigma_eta"):
        gopa_mu([(0, 1)], -1.0, 1.0, parties=3)
    with pytest.raises(PrivacyParameterError, match="honest_fraction"):
        calibrate_gopa(100, 0.0, 1.0, 1e-5)


def test_targeted_coalition_reports_the_worst_honest_party():
    """A coalition built around one target, not a random honest set (issue: K = 1000,
    rho = 0.5 calibrated, 32 parties around one target leave it at local-DP level)."""
    from renyi.federated.gopa import gopa_targeted

    rng = np.random.default_rng(21)
    k, m = 40, 3
    edges = random_peer_graph(k, m, rng)
    distinct = [len(set(edges[(edges == u).any(axis=1)].ravel().tolist()) - {u}) for u in range(k)]
    # enough corrupted parties to surround the least connected party: exact local level
    t = gopa_targeted(edges, 0.5, 20.0, parties=k, coalition_size=min(distinct))
    assert t.isolated and t.mu == 2.0 and t.epsilon(1e-5) > 8
    # fewer: the reported mu is the exact value for the attacked target (numpy inverse)
    c = min(distinct) - 1
    t = gopa_targeted(edges, 0.5, 20.0, parties=k, coalition_size=c, candidates=4)
    assert not t.isolated and t.mu <= t.bound_mu
    from scipy.sparse.csgraph import breadth_first_order

    adj = np.zeros((k, k))
    for a, b in edges.tolist():
        adj[a, b] = adj[b, a] = 1
    order = breadth_first_order(adj, t.target, directed=False)[0]
    honest = np.setdiff1d(np.arange(k), order[1 : c + 1])
    hset = set(honest.tolist())
    lap = np.zeros((k, k))
    for a, b in edges.tolist():
        if a in hset and b in hset:  # edges to the coalition are known to it
            lap[a, a] += 1
            lap[b, b] += 1
            lap[a, b] -= 1
            lap[b, a] -= 1
    sub = 0.25 * np.eye(honest.size) + 400.0 * lap[np.ix_(honest, honest)]
    p = int(np.searchsorted(honest, t.target))
    exact = np.linalg.inv(sub)[p, p]
    assert t.mu == pytest.approx(math.sqrt(exact), rel=1e-9)
    # and it is far worse than the random-honest-set figure for the same coalition size
    random_set = gopa_mu(edges, 0.5, 20.0, parties=k, honest=np.arange(c, k))
    assert t.mu > random_set.mu


def test_false_rejection_rate_is_as_stated():
    """Honest masked messages against the server's range check: with rejection probability
    p per message, the empirical rate over 10000 messages is within binomial error of <= p;
    the check uses the party's active degree (variance sigma_eta² + d sigma_delta²)."""
    from renyi.federated.gopa_party import GopaAggregator, GopaSession

    p = 0.05
    sess = GopaSession(
        session=bytes(16), names=("a", "b", "c"), edges=[[0, 1], [1, 2], [0, 2], [0, 1]],
        sigma_eta=0.7, sigma_delta=3.0, rejection_probability=p,
    )  # fmt: skip
    server = GopaAggregator(sess)
    rng = np.random.default_rng(12)
    n = 10000
    deg = server.active_degree(0, range(3))
    assert deg == 3
    worst = np.where(rng.uniform(size=n) < 0.5, 0.0, 1.0)  # values at the domain's edges
    noise = rng.normal(size=n) * math.sqrt(0.7**2 + deg * 3.0**2)
    msgs = np.rint((worst + noise) / sess.lattice).astype(np.int64).view(np.uint64)
    rejected = sum(server.check_message(0, msgs[i : i + 1], range(3)) is not None for i in range(n))
    # each tail is at least z sigma away whatever the value in [0, 1]: at most p in all;
    # at the edges one tail is exactly z sigma away: at least p / 2 (the bound is not vacuous)
    assert rejected / n <= p + 4 * math.sqrt(p / n)
    assert rejected / n >= p / 2 - 4 * math.sqrt(p / 2 / n)


def test_wire_formats_reject_fuzzed_input():
    """Random and truncated bytes never crash the parsers: a clean integrity error."""
    from renyi.federated.channels import KeyAdvertisement, SecureChannel

    rng = np.random.default_rng(13)
    a = IdentityKey("a")
    roster = Roster.of([a, IdentityKey("b")])
    good = EphemeralSession(a, roster, bytes(16)).advertisement().to_bytes()
    for i in range(300):
        raw = bytes(rng.integers(0, 256, size=int(rng.integers(0, 200)), dtype=np.uint8))
        if i % 3 == 0:
            raw = good[: int(rng.integers(0, len(good)))]
        elif i % 3 == 1:
            flip = bytearray(good)
            flip[int(rng.integers(0, len(good)))] ^= 1 << int(rng.integers(0, 8))
            raw = bytes(flip)
        try:
            adv = KeyAdvertisement.from_bytes(raw)
        except ChannelIntegrityError:
            continue
        if raw != good:
            with pytest.raises(ChannelIntegrityError):
                adv.verify(roster, bytes(16))
    for raw in (b"", b"\x00" * 7, b"\xff" * 40):
        with pytest.raises(ChannelIntegrityError):
            SecureChannel.restore(raw)
