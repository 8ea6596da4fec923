"""The Flower back end (``backend: flower``): Flower's Message API carries every message between the server and
the clients; the algorithm, the guard and the callbacks are the engine's own objects.

- :mod:`.codec`: payloads to ``RecordDict`` (``ArrayRecord`` + ``ConfigRecord``) and back, exactly, without pickle;
- :mod:`.executor`: :class:`FlowerExecutor`, the engine's executor whose client jobs run on Flower nodes;
- :mod:`.server`: the ``ServerApp`` (drives an :class:`~secure_fed.engine.runner.Experiment`, passing the executor in);
- :mod:`.client_app`: the ``ClientApp`` (each node's clients: their data, their training function, registered setup
  functions);
- :mod:`.run_checks`: what this back end refuses before a run starts;
- :mod:`.simulation`: ``Experiment.run`` on Flower's simulation engine.
"""
