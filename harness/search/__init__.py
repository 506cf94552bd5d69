"""Optuna's side of the search: the Tune searcher asking Optuna C times per trial (``searcher``),
where Optuna's records live (``storage``), and the Optuna private names relied on, in one module
(``optuna_private``)."""
