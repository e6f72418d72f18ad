"""One module per provider, each behind :class:`~teibatch.fleet.base.Provider`.

``local`` (the built-in server), ``localdocker`` (``local`` with a Docker engine), ``static``, ``ssh``,
``lambdacloud``, ``runpod`` and ``vast``. They build on the shared machinery one level up (``hosted``,
``containercloud``, ``rental``, ``shell`` ...) and never import one another nor :mod:`teibatch.fleet`
itself; :mod:`teibatch.fleet` re-exports what users need. Nothing is imported here, so using one
provider loads only its own module.
"""
