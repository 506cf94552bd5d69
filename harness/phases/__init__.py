"""A study's phases, run in order by ``harness.study``: the search (``search_phase``), the top-k and
the default re-trained on fresh seeds (``final_phase``), the ablation path between them
(``ablation``). Ray is imported inside their functions, once the study's session has started it."""
