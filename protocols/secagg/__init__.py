"""The ``secure_aggregation`` layer: the SecAgg+ secure sum, its graph bounds, fixed-point encoding and signing."""
