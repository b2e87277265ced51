"""Distributed discrete Gaussian under secure aggregation: accounting and protocol."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy.special import logsumexp

from renyi.accountants import RdpAccountant, ZcdpAccountant
from renyi.errors import InsecureRandomnessWarning, PrivacyParameterError
from renyi.events import DiscreteGaussianEvent, Neighbouring, RdpEvent, from_json
from renyi.federated.channels import (
    EphemeralSession,
    IdentityKey,
    KeySubstitutionError,
    Roster,
)
from renyi.federated.ddg import (
    DdgClient,
    DdgServer,
    DistributedDiscreteGaussianEvent,
    ddg_rdp,
    ddg_sensitivities,
    ddg_tau,
)
from renyi.samplers import discrete_gaussian_logpmf

ORDERS = np.arange(2.0, 33.0)


def test_one_client_is_the_discrete_gaussian() -> None:
    ev = DistributedDiscreteGaussianEvent(3.0, 1, 2.0, 2.0, 5)
    dg = DiscreteGaussianEvent(3.0, 2.0, Neighbouring.REPLACE_ONE)
    np.testing.assert_allclose(ev.rdp_epsilons(ORDERS), dg.rdp_epsilons(ORDERS), rtol=1e-14)
    assert ev.zcdp_rho() == pytest.approx(dg.zcdp_rho(), rel=1e-14)
    assert ddg_tau(3.0, 1) == 0.0


def test_tau_closed_form() -> None:
    s, n = 0.8, 4
    want = 10 * sum(math.exp(-2 * math.pi**2 * s * s * k / (k + 1)) for k in range(1, n))
    assert ddg_tau(s, n) == pytest.approx(want, rel=1e-14)


@pytest.mark.parametrize("sigma,shift", [(0.6, 1), (0.8, 2), (1.0, 1)])
def test_bound_is_above_the_exact_divergence_of_two_summed_shares(sigma: float, shift: int) -> None:
    """Ground truth: the exact pmf of N_Z(0, s²) + N_Z(0, s²) shifted by an integer."""
    x = np.arange(-80, 81)
    log_p1 = discrete_gaussian_logpmf(x, sigma * sigma)
    p1 = np.exp(log_p1)
    p = np.convolve(p1, p1)  # support -160..160
    support = np.arange(-160, 161)
    logp = np.log(np.maximum(p, 1e-300))
    bound = ddg_rdp(
        ORDERS,
        local_sigma=sigma,
        clients=2,
        l2_sensitivity=float(shift),
        l1_sensitivity=float(shift),
        dimension=1,
    )
    ok = p > 1e-250
    for i, a in enumerate(ORDERS[:12]):
        # D_a(P(. - shift) || P) on the common support (both directions are equal by symmetry)
        lp = logp[ok][shift:]
        lq = logp[ok][:-shift]
        exact = logsumexp(a * lp + (1 - a) * lq) / (a - 1)
        assert exact <= bound[i] * (1 + 1e-12) + 1e-12, (a, exact, bound[i])
    assert support.size == p.size


def test_event_registry_and_accountants() -> None:
    l2, l1 = ddg_sensitivities(0.5, 0.01, 20)
    ev = DistributedDiscreteGaussianEvent(60.0, 8, l2, l1, 20)
    assert from_json(ev.to_json()) == ev
    by_hand = ddg_rdp(
        ORDERS, local_sigma=60.0, clients=8, l2_sensitivity=l2, l1_sensitivity=l1, dimension=20
    )
    for rounds in (1, 3):
        ours = RdpAccountant(orders=ORDERS).compose(ev, count=rounds).epsilon(1e-5).epsilon
        ref = (
            RdpAccountant(orders=ORDERS)
            .compose(RdpEvent(tuple(ORDERS), tuple(rounds * by_hand), Neighbouring.REPLACE_ONE))
            .epsilon(1e-5)
            .epsilon
        )
        assert ours == pytest.approx(ref, rel=1e-12)
        z = ZcdpAccountant().compose(ev, count=rounds)
        assert z.epsilon(1e-5).epsilon > 0
    with pytest.raises(PrivacyParameterError, match="local_sigma"):
        DistributedDiscreteGaussianEvent(0.4, 8, l2, l1, 20)


def _run(n: int, d: int, *, seed: int, swap: bool = False) -> tuple:
    rng = np.random.default_rng(seed)
    updates = rng.normal(size=(n, d)) * 0.3
    ids = [IdentityKey(f"c{i}") for i in range(n)]
    roster = Roster.of(ids)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureRandomnessWarning)
        clients = [
            DdgClient(
                ids[i],
                roster,
                updates[i],
                clip_norm=1.0,
                gamma=1e-3,
                local_sigma=30.0,
                rng=np.random.default_rng(seed + 1 + i),
            )
            for i in range(n)
        ]
        sid = bytes(16)
        directory = {c.name: c.join(sid).to_bytes() for c in clients}
        if swap:
            mallory = IdentityKey("c1")
            directory["c1"] = (
                EphemeralSession(mallory, Roster.of([mallory]), sid).advertisement().to_bytes()
            )
        masked = {c.name: c.masked(directory) for c in clients}
    server = DdgServer(
        [c.name for c in clients], clip_norm=1.0, gamma=1e-3, local_sigma=30.0, dimension=d
    )
    return updates, clients, masked, server


def test_server_sees_only_the_sum() -> None:
    n, d = 6, 2000
    updates, clients, masked, server = _run(n, d, seed=3)
    avg = server.aggregate(masked)
    encoded = np.stack([c.encoded for c in clients])
    np.testing.assert_array_equal(avg, encoded.sum(axis=0) * 1e-3 / n)  # exact sum
    # each message on its own is a one-time pad: top bits uniform, unrelated to the update
    for c in clients:
        m = masked[c.name]
        assert not np.array_equal(m, c.encoded.view(np.uint64))
        top = (m >> np.uint64(63)).astype(np.float64)
        assert abs(top.mean() - 0.5) < 5 * 0.5 / math.sqrt(d)
    # leaving one message out gives garbage, not a partial sum
    with pytest.raises(PrivacyParameterError, match="every participant"):
        server.aggregate({k: v for k, v in masked.items() if k != "c0"})
    # utility: error of the average ~ gamma sqrt(n) sigma / n, plus rounding
    clipped = updates * np.minimum(1.0, 1.0 / np.linalg.norm(updates, axis=1))[:, None]
    err = avg - clipped.sum(axis=0) / n
    assert abs(err.std() / (1e-3 * math.sqrt(n) * 30.0 / n) - 1) < 0.1


def test_substituted_key_is_detected_before_sending() -> None:
    with pytest.raises(KeySubstitutionError, match="pinned"):
        _run(4, 10, seed=5, swap=True)


def _client_process(conn, name: str, key: bytes, roster_json: str, update, seed: int) -> None:
    """One DDG participant in its own process: it holds only its update and key."""
    import warnings as w

    import numpy as np_

    from renyi.errors import InsecureRandomnessWarning as Iw
    from renyi.federated.channels import IdentityKey as Ik
    from renyi.federated.channels import Roster as Ro
    from renyi.federated.ddg import DdgClient as Dc

    w.simplefilter("ignore", Iw)
    client = Dc(
        Ik.from_private_bytes(name, key),
        Ro.from_json(roster_json),
        update,
        clip_norm=1.0,
        gamma=1e-3,
        local_sigma=30.0,
        rng=np_.random.default_rng(seed),
    )
    conn.send(client.join(conn.recv()).to_bytes())
    try:
        conn.send(client.masked(conn.recv()).tobytes())
    except Exception as exc:  # the refusal reason goes back instead of a vector
        conn.send(f"abort: {type(exc).__name__}: {exc}")
    conn.close()


@pytest.mark.parametrize("swap", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_ddg_secure_aggregation_across_processes(swap: bool) -> None:
    """Participants are separate processes talking to the server over pipes; the server
    receives only masked vectors and releases their exact sum (or, with a relay swapping a
    key, every neighbour of the victim refuses before sending a vector)."""
    import multiprocessing as mp

    n, d = 4, 50
    rng = np.random.default_rng(8)
    updates = rng.normal(size=(n, d)) * 0.05
    ids = [IdentityKey(f"c{i}") for i in range(n)]
    roster = Roster.of(ids)
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    for i, ident in enumerate(ids):
        here, there = ctx.Pipe()
        p = ctx.Process(
            target=_client_process,
            args=(there, ident.name, ident.private_bytes(), roster.to_json(), updates[i], 100 + i),
        )
        p.start()
        pipes.append(here)
        procs.append(p)
    try:
        sid = bytes(range(16))
        for c in pipes:
            c.send(sid)
        directory = {ident.name: c.recv() for ident, c in zip(ids, pipes, strict=True)}
        if swap:  # the relay substitutes c1's key with one it signed itself
            mallory = IdentityKey("c1")
            fake = EphemeralSession(mallory, Roster.of([mallory]), sid).advertisement()
            directory["c1"] = fake.to_bytes()
        for c in pipes:
            c.send(directory)
        replies = {ident.name: c.recv() for ident, c in zip(ids, pipes, strict=True)}
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    if swap:
        refused = [k for k, v in replies.items() if isinstance(v, str)]
        assert set(refused) >= {"c0", "c2", "c3"}  # everyone who checked c1's key
        assert all("pinned" in replies[k] for k in refused if k != "c1")
        return
    masked = {k: np.frombuffer(v, dtype=np.uint64).copy() for k, v in replies.items()}
    server = DdgServer(
        [i.name for i in ids], clip_norm=1.0, gamma=1e-3, local_sigma=30.0, dimension=d
    )
    avg = server.aggregate(masked)
    # the same participants recomputed in this process (same seeds): the exact sum
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureRandomnessWarning)
        twins = [
            DdgClient(
                ids[i],
                roster,
                updates[i],
                clip_norm=1.0,
                gamma=1e-3,
                local_sigma=30.0,
                rng=np.random.default_rng(100 + i),
            )
            for i in range(n)
        ]
        tdir = {t.name: t.join(bytes(16)).to_bytes() for t in twins}
        for t in twins:
            t.masked(tdir)
    encoded = np.stack([t.encoded for t in twins])
    np.testing.assert_array_equal(avg, encoded.sum(axis=0) * 1e-3 / n)
    for i, ident in enumerate(ids):  # no single message reveals its participant's encoding
        assert not np.array_equal(masked[ident.name], twins[i].encoded.view(np.uint64))


@pytest.mark.parametrize("n", [2, 3, 10])
def test_ddg_release_carries_no_residue_of_the_inputs(n: int) -> None:
    """Issue 22.2's audit for the distributed discrete Gaussian: the update is rounded to
    the integers (randomized rounding, accounted in ddg_sensitivities) before the integer
    noise and the masks, so ``n * release / gamma`` is an integer for inputs 0 and 0.01
    alike (a residue of 0.01 / gamma would tell them apart, as it did for GOPA)."""
    gamma = 1e-3
    for first in (0.0, 0.01 + 1e-7):
        ids = [IdentityKey(f"c{i}") for i in range(n)]
        roster = Roster.of(ids)
        ups = np.zeros((n, 3))
        ups[0, 0] = first
        clients = [
            DdgClient(ids[i], roster, ups[i], clip_norm=1.0, gamma=gamma, local_sigma=5.0)
            for i in range(n)
        ]
        directory = {c.name: c.join(bytes(16)).to_bytes() for c in clients}
        masked = {c.name: c.masked(directory) for c in clients}
        server = DdgServer(
            [c.name for c in clients], clip_norm=1.0, gamma=gamma, local_sigma=5.0, dimension=3
        )
        index = server.aggregate(masked) * n / gamma
        assert np.all(np.abs(index - np.rint(index)) < 1e-6)
