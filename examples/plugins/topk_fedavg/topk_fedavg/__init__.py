"""An example third-party algorithm: FedAvg whose clients send only the largest entries of their update
(``algorithm: {name: topk_fedavg, density: 0.1}``).

:mod:`.params` (light: pydantic) is what ``secure-fed validate`` imports; :mod:`.algorithm` (torch) only a run.
"""
