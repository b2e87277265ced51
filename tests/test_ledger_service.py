"""The ledger service's JSON API against a real uvicorn server on loopback.

One server (a subprocess running ``renyi ledger serve``) over one SQLite store with three
ledgers is shared by the module; each test talks to it over HTTP with ``http.client`` and
``Budget.connect``. Every status code of the API is exercised: 200, 201, 401, 403, 404,
409, 413, 422 (and 503/500 are never tracebacks).
"""

import http.client
import json
import subprocess
import sys

import pytest

from _ledger_server import Server, _env
from renyi.budget import Budget
from renyi.errors import BudgetExceededError, PrivacyParameterError
from renyi.events import GaussianEvent, LaplaceEvent, PoissonSampledEvent, PureDpEvent
from renyi.ledger import LedgerError, open_store
from renyi.ledger.client import LedgerAccessError
from renyi.ledger.tokens import create_token

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

STEP = PoissonSampledEvent(0.01, GaussianEvent(1.1))


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    path = tmp_path_factory.mktemp("svc") / "team.sqlite"
    Budget(epsilon=3.0, delta=1e-5, ledger=f"{path}#default")
    Budget(epsilon=1.0, ledger=f"{path}#census")
    Budget(epsilon=1.0, ledger=f"{path}#clicks", period="month")
    store = open_store(str(path))
    tokens = {
        "admin": create_token(store, name="ada", role="admin"),
        "spend": create_token(store, name="job-1", role="spend", scope="census"),
        "spend_all": create_token(store, name="job-2", role="spend"),
        "read": create_token(store, name="bob", role="read"),
        "clicks": create_token(store, name="etl", role="spend", scope="clicks"),
    }
    server = Server(path)
    yield server, tokens, path
    server.stop()


def call(server, method, path, body=None, token=None, raw=None):
    host, port = server.url[len("http://") :].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    conn.request(method, path, body=data, headers=headers)
    resp = conn.getresponse()
    text = resp.read()
    conn.close()
    try:
        return resp.status, json.loads(text)
    except ValueError:
        return resp.status, text.decode()


def test_health_and_listing_by_scope(service):
    server, tokens, _ = service
    assert call(server, "GET", "/api/v1/health") == (200, {"status": "ok"})
    status, out = call(server, "GET", "/api/v1/ledgers", token=tokens["read"])
    assert status == 200
    assert [x["name"] for x in out["ledgers"]][:3] == ["census", "clicks", "default"]
    status, out = call(server, "GET", "/api/v1/ledgers", token=tokens["spend"])
    assert [x["name"] for x in out["ledgers"]] == ["census"]  # scoped token sees its ledger


def test_ledger_fields_match_the_local_budget(service):
    server, tokens, path = service
    status, out = call(server, "GET", "/api/v1/ledgers/default", token=tokens["read"])
    local = Budget.open(f"{path}#default")
    st = local.status()
    assert status == 200 and out["verified"] is True and out["verification_error"] is None
    assert out["id"] == local.ledger_id and out["head"] == st["head"]
    assert out["entries"] == st["releases"] and out["delta"] == 1e-5 and out["epsilon"] == 3.0
    assert out["epsilon_spent"] == st["epsilon_spent"]
    assert out["epsilon_remaining"] == st["epsilon_remaining"]


def test_spend_200_then_409_in_epsilon_and_the_refusal_is_logged(service):
    server, tokens, path = service
    body = {"event": LaplaceEvent(4.0).to_dict(), "count": 3, "label": "counts"}
    status, out = call(server, "POST", "/api/v1/ledgers/census/spend", body, tokens["spend"])
    assert status == 200, out
    r = out["receipt"]
    assert r["count"] == 3 and r["label"] == "counts" and r["metadata"]["who"] == "job-1"
    assert r["epsilon_cost"] == 0.75 and out["epsilon_remaining"] == 0.25
    status, out = call(server, "POST", "/api/v1/ledgers/census/spend", body, tokens["spend"])
    assert status == 409 and out["error"] == "refused"
    assert out["epsilon_cost"] == 0.75 and out["epsilon_remaining"] == 0.25
    assert "only epsilon=0.25 of 1 remains" in out["detail"]
    assert open_store(f"{path}#census").refusals()[0]["who"] == "job-1"
    assert len(Budget.open(f"{path}#census").entries()) == 1  # nothing charged by the 409


def test_idempotency_key_is_charged_once(service):
    server, tokens, _ = service
    body = {"event": STEP.to_dict(), "count": 10, "idempotency_key": "run-9/step-1"}
    s1, a = call(server, "POST", "/api/v1/ledgers/default/spend", body, tokens["spend_all"])
    s2, b = call(server, "POST", "/api/v1/ledgers/default/spend", body, tokens["spend_all"])
    assert s1 == s2 == 200 and not a["receipt"]["replayed"] and b["receipt"]["replayed"]
    assert a["receipt"]["index"] == b["receipt"]["index"]
    assert a["epsilon_spent"] == b["epsilon_spent"]
    other = {**body, "count": 11}
    status, out = call(server, "POST", "/api/v1/ledgers/default/spend", other, tokens["admin"])
    assert status == 422 and out["error"] == "idempotency_conflict"


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"event": {"type": "gaussiann"}}, "type='gaussiann' is invalid"),
        ({"event": {"type": "gaussian", "noise_multiplier": -1}}, "noise_multiplier=-1"),
        ({"event": "laplace"}, "expected an object"),
        ({"event": LaplaceEvent(1.0).to_dict(), "count": 0}, "count"),
        ({"event": LaplaceEvent(1.0).to_dict(), "count": "2"}, "count"),
        ({"event": LaplaceEvent(1.0).to_dict(), "extra": 1}, "unknown fields ['extra']"),
        ([1, 2], "JSON object"),
        # held-out review: metadata that JSON cannot store was a 500 (raw ValueError)
        ({"event": LaplaceEvent(1.0).to_dict(), "metadata": {"x": float("nan")}}, "metadata"),
        ({"event": LaplaceEvent(1.0).to_dict(), "metadata": {"x": [1, float("inf")]}}, "metadata"),
    ],
)
def test_malformed_spends_are_422_with_a_clear_message(service, body, needle):
    server, tokens, _ = service
    status, out = call(server, "POST", "/api/v1/ledgers/default/spend", body, tokens["admin"])
    assert status == 422 and needle in out["detail"], out


def test_not_json_and_too_large_bodies(service):
    server, tokens, _ = service
    path = "/api/v1/ledgers/default/spend"
    status, out = call(server, "POST", path, raw=b"{nope", token=tokens["admin"])
    assert status == 422 and "not JSON" in out["detail"]
    big = json.dumps({"event": {"type": "x" * 70000}}).encode()
    status, out = call(server, "POST", path, raw=big, token=tokens["admin"])
    assert status == 413 and out["error"] == "too_large"


def test_401_and_403(service):
    server, tokens, _ = service
    spend = "/api/v1/ledgers/census/spend"
    body = {"event": LaplaceEvent(100.0).to_dict()}
    assert call(server, "POST", spend, body)[0] == 401
    assert call(server, "GET", "/api/v1/ledgers", token="rlt_000000000000_" + "a" * 43)[0] == 401
    forged = tokens["admin"][:-3] + "abc"
    assert call(server, "GET", "/api/v1/ledgers", token=forged)[0] == 401
    assert call(server, "POST", spend, body, tokens["read"])[0] == 403  # read-only role
    status, out = call(server, "GET", "/api/v1/ledgers/default", token=tokens["spend"])
    assert status == 403 and "scope 'census'" in out["detail"]  # another ledger
    new = {"name": "x", "epsilon": 1}
    assert (
        call(server, "POST", "/api/v1/ledgers", new, tokens["spend"])[0] == 403
    )  # only admins create ledgers


def test_404s_and_no_tracebacks(service):
    server, tokens, _ = service
    status, out = call(server, "GET", "/api/v1/ledgers/nope", token=tokens["read"])
    assert status == 404 and out["error"] == "not_found"
    status, out = call(server, "GET", "/nope/at/all", token=tokens["read"])
    assert status == 404 and "Traceback" not in json.dumps(out)


def test_admin_creates_ledgers_but_never_raises_a_budget(service):
    server, tokens, _ = service
    new = {"name": "survey", "epsilon": 2.0}
    status, out = call(server, "POST", "/api/v1/ledgers", new, tokens["admin"])
    assert status == 201 and out["epsilon"] == 2.0 and out["entries"] == 0
    assert call(server, "POST", "/api/v1/ledgers", new, tokens["admin"])[0] == 200  # same
    status, out = call(
        server, "POST", "/api/v1/ledgers", {"name": "survey", "epsilon": 20.0}, tokens["admin"]
    )
    assert status == 409 and "different budget" in out["detail"]
    status, out = call(
        server, "POST", "/api/v1/ledgers", {"name": "bad", "epsilon": -1}, tokens["admin"]
    )
    assert status == 422 and "epsilon" in out["detail"]


def test_time_buckets_each_period_its_own_budget(service):
    server, tokens, _ = service
    body = {"event": PureDpEvent(0.6).to_dict()}
    base = "/api/v1/ledgers/clicks"
    status, out = call(server, "POST", base + "/spend", body, tokens["clicks"])
    assert status == 422 and "period" in out["detail"]  # the template is never spent
    for month in ("2026-10", "2026-11"):
        status, out = call(server, "POST", f"{base}@{month}/spend", body, tokens["clicks"])
        assert status == 200 and out["epsilon_remaining"] == 0.4
    status, out = call(server, "POST", base + "@2026-11/spend", body, tokens["clicks"])
    assert status == 409
    status, out = call(server, "POST", base + "@2026-13/spend", body, tokens["clicks"])
    assert status == 422 and "YYYY-MM" in out["detail"]
    status, out = call(server, "GET", base + "@2026-11", token=tokens["read"])
    assert status == 200 and out["budget"]["bucket"] == "2026-11" and out["epsilon"] == 1.0


def test_budget_connect_spends_remotely_like_a_local_budget(service):
    server, tokens, _ = service
    remote = Budget.connect(f"{server.url}#default", token=tokens["spend_all"], job="train-1")
    before = remote.status()
    fits = remote.max_count(STEP)
    r = remote.spend(STEP, 5, label="epoch 0")
    assert r.index == before["entries"] and not r.replayed and r.metadata["job"] == "train-1"
    assert remote.max_count(STEP) == fits - 5
    with pytest.raises(BudgetExceededError, match="refused"):
        remote.spend(STEP, fits)  # nothing released: the call raised
    assert remote.status()["entries"] == before["entries"] + 1
    assert remote.verify()
    with pytest.raises(PrivacyParameterError, match="metadata"):  # was json's raw TypeError
        remote.spend(STEP, metadata={"tags": {"a", "b"}})
    assert remote.status()["entries"] == before["entries"] + 1
    with pytest.raises(LedgerError, match="not the expected"):
        Budget.connect(f"{server.url}#default", token=tokens["read"], expect_id="0" * 32)
    with pytest.raises(LedgerAccessError):
        Budget.connect(f"{server.url}#default", token=tokens["spend"])  # scope census


def test_unreachable_service_raises_before_any_release(service):
    from _ledger_server import free_port

    with pytest.raises(LedgerError, match="cannot reach the ledger service"):
        Budget.connect(f"http://127.0.0.1:{free_port()}#default", token="t" * 10, timeout=0.3)


def test_service_refuses_to_start_on_a_tampered_ledger(tmp_path):
    import sqlite3

    path = tmp_path / "b.sqlite"
    b = Budget(epsilon=10.0, ledger=path)
    for _ in range(3):
        b.spend(PureDpEvent(1.0))
    b.close()
    conn = sqlite3.connect(path)
    conn.execute("DELETE FROM entries WHERE idx = 1")
    conn.commit()
    conn.close()
    done = subprocess.run(
        [sys.executable, "-m", "renyi", "ledger", "serve", str(path), "--port", "0"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert done.returncode == 1 and "entry #1 is missing" in done.stderr
    assert "Traceback" not in done.stderr and "http://" not in done.stdout


def test_token_cli_prints_a_token_once_and_stores_its_hash(tmp_path, capsys):
    from renyi.cli.main import main

    path = tmp_path / "b.sqlite"
    Budget(epsilon=1.0, ledger=path)
    assert main(["ledger", "token", str(path), "--name", "ci", "--role", "spend", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["token"].startswith("rlt_") and out["role"] == "spend" and out["scope"] == "*"
    # only its hash (the secret is the rest after rlt_<id>_: it may hold "_" itself, and a
    # split on every "_" made this test fail when a short piece happened to be in the file)
    assert out["token"].split("_", 2)[2].encode() not in path.read_bytes()
    assert main(["ledger", "token", f"{path}#nope", "--name", "x", "--role", "read"]) == 2


def test_the_api_ignores_the_dashboard_cookie(service):
    """Only pages read the login cookie: another site cannot make a logged-in browser spend."""
    server, tokens, _ = service
    host, port = server.url[len("http://") :].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    body = json.dumps({"event": LaplaceEvent(100.0).to_dict()})
    cookie = {"Cookie": f"renyi_ledger_token={tokens['admin']}"}
    conn.request("POST", "/api/v1/ledgers/default/spend", body=body, headers=cookie)
    assert conn.getresponse().status == 401
    conn.close()


def test_an_internal_error_is_a_500_without_traceback(tmp_path):
    """In process (Starlette's test client): a bug inside the service answers 500 with a
    fixed message; what went wrong goes to the log, never to the client."""
    testclient = pytest.importorskip("starlette.testclient")
    from renyi.ledger.service import LedgerService, create_app

    path = tmp_path / "b.sqlite"
    Budget(epsilon=1.0, ledger=path)
    store = open_store(str(path))
    token = create_token(store, name="r", role="read")
    service = LedgerService(store)

    def broken(*args, **kwargs):
        raise RuntimeError("secret detail /etc/passwd")

    service.summary = broken
    client = testclient.TestClient(create_app(service), raise_server_exceptions=False)
    for path_ in ("/api/v1/ledgers/default", "/api/v1/ledgers"):
        resp = client.get(path_, headers={"Authorization": f"Bearer {token}"})
        assert resp.status_code == 500 and resp.json()["error"] == "internal"
        assert "secret" not in resp.text and "Traceback" not in resp.text
    client.cookies.set("renyi_ledger_token", token)
    page = client.get("/")
    assert page.status_code == 500 and "secret" not in page.text


def test_a_revoked_token_is_refused_from_the_next_request(service, capsys):
    """A leaked job token must be revocable: ``renyi ledger revoke`` deletes its record and
    the running service answers 401 from then on (API and dashboard session alike)."""
    from renyi.cli.main import main

    server, _, path = service
    leaked = create_token(open_store(str(path)), name="leaky-job", role="spend")
    assert call(server, "GET", "/api/v1/ledgers/default", token=leaked)[0] == 200
    assert main(["ledger", "tokens", str(path), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["tokens"]
    token_id = leaked.split("_")[1]
    assert [t["name"] for t in listed if t["id"] == token_id] == ["leaky-job"]
    assert all(set(t) == {"id", "name", "role", "scope", "created"} for t in listed)

    assert main(["ledger", "revoke", f"{path}#default", leaked, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["revoked"] == token_id
    assert call(server, "GET", "/api/v1/ledgers/default", token=leaked)[0] == 401
    body = {"event": STEP.to_dict(), "count": 1}
    status, _ = call(server, "POST", "/api/v1/ledgers/default/spend", body, leaked)
    assert status == 401
    assert token_id not in {r.id for r in open_store(str(path)).list_tokens()}

    # revoking again, or a token that never existed: our error, nothing changed
    assert main(["ledger", "revoke", str(path), token_id]) == 2
    assert "none has it" in capsys.readouterr().err
    assert main(["ledger", "revoke", str(path), "not-a-token"]) == 2
    assert "12-hex-digit id" in capsys.readouterr().err


def test_revoke_on_postgres(postgres_url):
    pytest.importorskip("psycopg")
    from renyi.ledger.tokens import check_token, list_tokens, revoke_token

    Budget(epsilon=1.0, ledger=postgres_url)
    store = open_store(postgres_url)
    token = create_token(store, name="pg-job", role="read")
    assert check_token(store, token) is not None
    assert token.split("_")[1] in {r.id for r in list_tokens(store)}
    assert revoke_token(store, token).name == "pg-job"
    assert check_token(store, token) is None
    with pytest.raises(PrivacyParameterError, match="none has it"):
        revoke_token(store, token)


@pytest.mark.parametrize("count", [0, -1, 10**9 + 1, True, 1.0])
def test_remote_count_out_of_range_is_our_error_before_any_request(service, count):
    from renyi.ledger.client import RemoteBudget

    server, tokens, _ = service
    remote = RemoteBudget(f"{server.url}#default", token=tokens["spend_all"])
    before = remote.status()["entries"]
    with pytest.raises(PrivacyParameterError, match=r"count.*\[1, 1e9\]"):
        remote.spend(STEP, count)
    assert remote.status()["entries"] == before
