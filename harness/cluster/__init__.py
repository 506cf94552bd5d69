"""Ray: its lifetime for a study (``session``), what each trial gets of the machine and of device
memory (``placement``), the one Ray Tune wiring (``tuning``), the trainable in each worker
(``trainable``), and the Ray private names relied on, in one module (``ray_private``). No module
imports Ray at its top but ``tuning`` and ``trainable``: Ray reads variables that ``session`` sets
before Ray's first import."""
