"""What a study's records show, read from disk with no Ray (the builder and its command are
``harness.report``): hyperparameter importance, PBT lineages, the ablation table, plots and the
page, TensorBoard; and the pictures of an env (``render``, for ``harness.play``) and which envs of
the libraries' registries train (``coverage``)."""
