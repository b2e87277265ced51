"""Learning without a trusted curator: DP aggregation, GOPA, network DP and DP-FedAvg.

* :mod:`renyi.federated.aggregation`: central vs local DP averaging (the sqrt(K) gap);
* :mod:`renyi.federated.channels`: authenticated channels (Ed25519 roster, signed ephemeral
  X25519, HKDF key schedule, ChaCha20-Poly1305) and keyed noise;
* :mod:`renyi.federated.gopa_party`: GOPA's per-party API (a party holds only its own value
  and key) and the server's checks;
* :mod:`renyi.federated.secagg`: GOPA against a malicious server (party-pinned policy,
  joint randomness, double masking, consistency round); :mod:`~.secagg_accounting` its
  worst-set epsilon;
* :mod:`renyi.federated.gopa`: the GOPA protocol (Sabater, Bellet & Ramon 2022) run in one
  process, and its exact Gaussian accounting for a given graph, honest set or coalition;
* :mod:`renyi.federated.relay`: a protocol between parties relayed by an untrusted server
  (endpoint and driver interfaces, in-process run);
* :mod:`renyi.federated.flower_relay`, :mod:`renyi.federated.flower_node`,
  :mod:`renyi.federated.flower_deploy`: that relay over Flower messages, a long-lived
  SuperNode running a pinned ClientApp, a loopback deployment (optional ``flwr``);
* :mod:`renyi.federated.gopa_flower`: GOPA parties as Flower nodes (optional ``flwr``);
* :mod:`renyi.federated.ddg`: distributed discrete Gaussian under secure aggregation;
* :mod:`renyi.federated.network`: network DP for random-walk DP-SGD (Cyffers & Bellet 2022);
* :mod:`renyi.federated.fedavg`: client-level DP-FedAvg with fixed or adaptive clipping;
* :mod:`renyi.federated.flower`: DP-FedAvg as a Flower strategy (optional ``flwr``);
* :mod:`renyi.federated.plots`: the figures (optional ``matplotlib``).

Submodules are imported on demand: ``channels`` and ``gopa`` need the ``cryptography``
package (the ``federated`` extra); ``aggregation``, ``network`` and ``fedavg`` need only
numpy and scipy (``network.walk_experiment`` also scikit-learn).
"""
