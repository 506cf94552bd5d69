"""Lane-level successive halving (``--scheduler lanes``): the Optuna side (``broker``) and the
trial's side in its worker (``trial``), one round trip per chunk."""
