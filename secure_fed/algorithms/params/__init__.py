"""Each algorithm's parameters (``algorithm:`` in the YAML), one pydantic model per algorithm.

Light on purpose (pydantic and the standard library only): ``secure-fed validate`` builds the ``algorithm:``
section's discriminated union from these models without importing torch. A module here holds an algorithm's
parameters model, whose :attr:`~base.AlgorithmParams.capabilities` declare what the algorithm is, and its
:class:`~secure_fed.algorithms.spec.AlgorithmSpec` (registered in :mod:`secure_fed.algorithms.registry`).
"""
