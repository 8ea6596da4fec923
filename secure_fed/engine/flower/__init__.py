"""The Flower back end (``backend: flower``): Flower's Message API carries every message between the server and
the clients; the algorithm, the guard and the callbacks are the engine's own objects.

- :mod:`.codec`: payloads to ``RecordDict`` (``ArrayRecord`` + ``ConfigRecord``) and back, exactly, without pickle;
- :mod:`.executor`: :class:`FlowerExecutor`, the engine's executor whose client jobs run on Flower nodes;
- :mod:`.apps`: the ``ServerApp`` (drives an :class:`~secure_fed.engine.runner.Experiment`) and the ``ClientApp``
  (each node's clients: their data, their training function, registered setup functions);
- :mod:`.simulation`: ``Experiment.run`` on Flower's simulation engine.
"""
