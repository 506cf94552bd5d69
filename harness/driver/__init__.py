"""The driver's values and rules: the resolved invocation (``settings``), the disk-error policy
(``guard``), the lines a running study prints and ends with (``progress``, ``summary``) and the
``--time`` plan (``timeplan``). No Ray or Optuna at import."""
