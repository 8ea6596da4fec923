"""The ``dp`` layer: differential privacy for the released model (client-level DP-FedAvg, DP-SGD on W and in client
training), its mechanisms, accountants and privacy report."""
