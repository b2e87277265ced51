import math
import sqlite3

import numpy as np
import pytest

from renyi.budget import Budget
from renyi.curves import RdpCurve
from renyi.errors import BudgetExceededError, PrivacyParameterError, UnsupportedEventError
from renyi.events import (
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
    PureDpEvent,
    ZcdpEvent,
)
from renyi.ledger import LedgerError, SQLiteLedgerStore


def test_ten_tenths_fit_exactly_in_one():
    b = Budget(epsilon=1.0)
    for _ in range(10):
        b.spend(PureDpEvent(0.1))
    assert b.remaining() == 0.0
    with pytest.raises(BudgetExceededError, match="only epsilon=0 of 1 remains"):
        b.spend(PureDpEvent(1e-12))
    assert len(b.entries()) == 10


def test_laplace_scale_ten_is_epsilon_tenth():
    b = Budget(epsilon=1.0)
    assert b.max_count(LaplaceEvent(10.0)) == 10


def test_boundary_is_exact_not_lenient():
    b = Budget(epsilon=0.3)
    b.spend(PureDpEvent(0.1))
    b.spend(PureDpEvent(0.2))  # 0.1 + 0.2 == 0.3 in decimal arithmetic
    with pytest.raises(BudgetExceededError):
        b.spend(PureDpEvent(5e-324))


def test_refusal_leaves_budget_untouched_and_cheaper_request_served():
    b = Budget(epsilon=1.0)
    b.spend(PureDpEvent(0.7))
    with pytest.raises(BudgetExceededError) as err:
        b.spend(PureDpEvent(0.5), label="too big")
    assert "0.3" in str(err.value) and "0.5" in str(err.value)
    assert b.remaining() == pytest.approx(0.3)
    assert len(b.entries()) == 1
    b.spend(PureDpEvent(0.3))  # a later request that fits is still served
    assert b.remaining() == 0.0


def test_release_context_manager_refuses_before_body():
    b = Budget(epsilon=0.5)
    ran = []
    with pytest.raises(BudgetExceededError):
        with b.release(PureDpEvent(1.0)):
            ran.append(True)
    assert ran == []
    with b.release(PureDpEvent(0.5), label="q1") as receipt:
        ran.append(receipt.index)
    assert ran == [0]


def test_pure_budget_rejects_gaussian():
    with pytest.raises(UnsupportedEventError, match="pure"):
        Budget(epsilon=1.0).spend(GaussianEvent(1.0))


def test_zcdp_budget():
    b = Budget(rho=1.0)
    sigma = 1.0  # rho = 0.5 each
    b.spend(GaussianEvent(sigma))
    b.spend(GaussianEvent(sigma))
    with pytest.raises(BudgetExceededError, match="rho"):
        b.spend(ZcdpEvent(1e-9))


def test_approx_budget_counts_dpsgd_steps_like_the_accountant():
    """max_count agrees with the RDP filter's definition: some order within b(α)."""
    b = Budget(epsilon=2.0, delta=1e-5)
    step = PoissonSampledEvent(0.01, GaussianEvent(1.0))
    n = b.max_count(step)
    assert n > 100
    b.spend(step, n)
    with pytest.raises(BudgetExceededError, match="order"):
        b.spend(step)
    # the filter's guarantee via Mironov's conversion is within the target
    assert b.spent_epsilon() <= 2.0
    # and the one-more-step composition would break every order's budget
    acc = b.accountant().compose(step)
    curve = acc.curve
    limits = 2.0 - math.log(1e5) / (curve.orders - 1)
    assert np.all(curve.epsilons > limits)


def test_adaptive_sequence_within_filter():
    b = Budget(epsilon=1.0, delta=1e-6)
    sigmas = [5.0, 3.0, 8.0, 2.0]
    served = 0
    for s in sigmas * 50:
        try:
            b.spend(GaussianEvent(s))
            served += 1
        except BudgetExceededError:
            continue
    assert served > 0
    assert b.spent_epsilon() <= 1.0


def test_largest_laplace_epsilon():
    b = Budget(epsilon=1.0)
    b.spend(PureDpEvent(0.25))
    x = b.largest(lambda e: LaplaceEvent(1.0 / e), 1e-6, 10.0)
    assert x == pytest.approx(0.75, rel=1e-5) and x <= 0.75


def test_rdp_curve_budget():
    orders = np.array([2.0, 4.0, 8.0])
    b = Budget(curve=RdpCurve(orders, np.array([1.0, 2.0, 4.0])))
    # costs alpha/2 = 1, 2, 4 exactly at the limit: computed RDP costs are rounded up by a
    # few ulps, so the exact boundary is refused (conservative) and just inside is served
    assert not b.can_spend(GaussianEvent(1.0))
    b.spend(GaussianEvent(1.0 + 1e-12))
    with pytest.raises(BudgetExceededError, match="order"):
        b.spend(GaussianEvent(100.0))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"epsilon": float("nan")}, "epsilon"),
        ({"epsilon": -1.0}, "epsilon"),
        ({"epsilon": 1.0, "delta": 0.0}, "delta"),
        ({"epsilon": 1.0, "delta": 1.5}, "delta"),
        ({"rho": -0.1}, "rho"),
        ({}, "exactly one"),
        ({"epsilon": 1.0, "rho": 1.0}, "exactly one"),
        ({"epsilon": 1e-9, "delta": 1e-300}, "no positive RDP budget"),
    ],
)
def test_bad_budgets(kwargs, name):
    with pytest.raises(PrivacyParameterError, match=name):
        Budget(**kwargs)


def test_ledger_persists_and_resumes_bit_exact(tmp_path):
    path = tmp_path / "budget.sqlite"
    b = Budget(epsilon=3.0, delta=1e-5, ledger=path)
    step = PoissonSampledEvent(256 / 60000, GaussianEvent(1.1))
    for i in range(5):
        b.spend(step, 100, label=f"epoch {i}", metadata={"lr": 0.1})
    eps_before = b.accountant().epsilon(1e-5).epsilon
    again = Budget.open(path)
    assert again.accountant().epsilon(1e-5).epsilon == eps_before
    assert again.verify()
    entries = again.entries()
    assert [e.label for e in entries] == [f"epoch {i}" for i in range(5)]
    assert entries[0].metadata == {"lr": 0.1} and entries[0].count == 100
    assert np.array_equal(again.remaining().epsilons, b.remaining().epsilons)
    # re-creating with the same spec reopens; a different spec is refused
    Budget(epsilon=3.0, delta=1e-5, ledger=path)
    with pytest.raises(LedgerError, match="different budget"):
        Budget(epsilon=4.0, delta=1e-5, ledger=path)


def test_foreign_and_corrupted_files_are_never_overwritten(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database at all" * 10)
    with pytest.raises(LedgerError, match="not a SQLite"):
        Budget(epsilon=1.0, ledger=junk)
    assert junk.read_bytes() == b"this is not a database at all" * 10

    foreign = tmp_path / "foreign.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE users (name TEXT)")
    conn.commit()
    conn.close()
    before = foreign.read_bytes()
    with pytest.raises(LedgerError, match="not a renyi ledger"):
        Budget(epsilon=1.0, ledger=foreign)
    assert foreign.read_bytes() == before

    with pytest.raises(LedgerError, match="no ledger"):
        Budget.open(tmp_path / "missing.db")


def test_sqlite_store_rejects_wrong_schema(tmp_path):
    path = tmp_path / "b.sqlite"
    Budget(epsilon=1.0, ledger=path)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(LedgerError, match="schema"):
        SQLiteLedgerStore(path)


def test_exact_sum_never_undercharges():
    """The issue's case: three Laplace(3) cost exactly 1 > 0.9999999999999999."""
    b = Budget(epsilon=0.9999999999999999)
    b.spend(LaplaceEvent(3.0))
    b.spend(LaplaceEvent(3.0))
    with pytest.raises(BudgetExceededError, match=r"costs epsilon=0\.333"):
        b.spend(LaplaceEvent(3.0))
    # and exactly 1 does take all three
    ok = Budget(epsilon=1.0)
    for _ in range(3):
        ok.spend(LaplaceEvent(3.0))
    assert ok.remaining() == 0.0 and not ok.can_spend(PureDpEvent(5e-324))


def test_costs_from_noise_charge_the_larger_reading():
    from fractions import Fraction

    from renyi.budget import event_pure_epsilon, event_rho_exact
    from renyi.events import RandomizedResponseEvent

    # scale 0.1: the float is slightly above 1/10, the decimal is 1/10 -> charge 10 (larger)
    assert event_pure_epsilon(LaplaceEvent(0.1)) == Fraction(10)
    # scale 0.3: the float is below 3/10 -> charge 1/float (above 10/3)
    assert event_pure_epsilon(LaplaceEvent(0.3)) == 1 / Fraction(0.3) > Fraction(10, 3)
    assert event_rho_exact(GaussianEvent(1.0)) == Fraction(1, 2)
    rr = float(event_pure_epsilon(RandomizedResponseEvent(0.75)))
    assert rr >= math.log(3) and rr == pytest.approx(math.log(3), rel=1e-14)


@pytest.mark.parametrize("value, shown", [(10, "10"), (70, "70"), (100, "100"), (2.5, "2.5")])
def test_amounts_print_with_their_zeros(value, shown):
    b = Budget(epsilon=1000.0)
    r = b.spend(PureDpEvent(value))
    assert r.cost["epsilon"] == shown
    b2 = Budget(epsilon=value + 60)
    b2.spend(PureDpEvent(value))
    with pytest.raises(BudgetExceededError, match=r"only epsilon=60 of"):
        b2.spend(PureDpEvent(61))


def test_status_in_user_units():
    b = Budget(epsilon=3.0, delta=1e-5)
    step = PoissonSampledEvent(0.01, GaussianEvent(1.1))
    b.spend(step, 500)
    st = b.status()
    from renyi.conversions import rdp_to_dp_mironov

    curve = b.accountant().curve  # the same composition, rebuilt by the accountant
    eps, order = rdp_to_dp_mironov(curve.orders, curve.epsilons, 1e-5)
    assert st["epsilon_spent"] == pytest.approx(eps, rel=1e-12) and st["order"] == order
    # Mironov's bound (what the filter enforces) is above the accountant's tighter figure
    assert st["epsilon_spent"] >= b.accountant().epsilon(1e-5).epsilon
    assert st["epsilon_spent"] + st["epsilon_remaining"] == pytest.approx(3.0)
    assert st["delta"] == 1e-5 and st["releases"] == 1
    with pytest.raises(BudgetExceededError, match=r"epsilon spent from .* remains"):
        b.spend(step, 100000)


def test_entries_without_a_bound_at_high_orders_reopen(tmp_path):
    # an event with no RDP bound above some order (inf there): re-pricing on open compares
    # inf with inf, which must not read as an edited state row
    from renyi.events import RdpEvent

    event = RdpEvent((2.0, 8.0, 64.0), (0.1, 0.5, math.inf))
    path = tmp_path / "l.sqlite"
    budget = Budget(epsilon=5.0, delta=1e-5, ledger=path)
    budget.spend(event)
    budget.spend(event)
    assert len(Budget.open(path).entries()) == 2


@pytest.mark.parametrize(
    "metadata", [{"x": float("nan")}, {"x": [1.0, float("inf")]}, {"x": {1, 2}}, {1: "a"}, [1]]
)
def test_metadata_json_cannot_store_is_refused_by_name(metadata):
    """Held-out review: such metadata raised json's raw ValueError/TypeError from inside the
    spend (and the ledger service answered 500); now our error names ``metadata``, and
    nothing is charged."""
    b = Budget(epsilon=1.0)
    with pytest.raises(PrivacyParameterError, match="metadata"):
        b.spend(PureDpEvent(0.5), metadata=metadata)
    assert b.remaining() == 1.0 and not b.entries()
