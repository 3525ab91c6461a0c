"""Hub mode: AppWrappers queued in one cluster run in one of several worker clusters.

``clusters`` (the configuration file, each worker's health state machine, connecting with its credentials),
``connections`` (``Hub``: one thread per worker probing it, its informers and writers), ``placement`` (which worker a
gang goes to: pure) and ``sites`` (creating objects there, and deleting what is left there).
"""
