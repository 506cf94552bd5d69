"""A study's results folder on disk: its layout and files (``folder``: ``ResultsFolder``,
``StudyMeta``, ``InFlight``) and the atomic writes and reads under it (``records``). No JAX, Ray or
Optuna: the reports, the searcher and the trials' workers all read or write here."""
