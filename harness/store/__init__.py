"""A study's results folder on disk: its layout and files (``folder``: ``ResultsFolder``,
``StudyMeta``, ``InFlight``), the records in it (``records``: ``TrialRecord``, ``FinalRecord``,
``AblationRecord``) and the atomic writes and reads under it. No JAX, Ray or Optuna: the reports,
the searcher and the trials' workers all read or write here."""
