"""SAC on ContinuousCartPole-v1 (force in [-1, 1]): learning rates, gamma, tau, batch size."""

from harness import Budget, Categorical, Study
from studies._spaces import SAC

STUDY = Study(
    name="cartpole_sac",
    description="SAC on ContinuousCartPole-v1: learning rates, gamma, tau, entropy target; batch size",
    env="ContinuousCartPole-v1",
    # Ranked by the final return (ties, common at 500, broken by train_auc: sooner first), not by
    # auc: under auc the winner learned fastest but ended at 500/392/500/276 on fresh seeds while
    # the defaults ended at 500 on every seed; this study's question is a policy that holds.
    objective="final",
    algo="sac",
    # 4 updates per step of 4 envs: one per env step. At 1 (a quarter per env step) even the best of
    # 12 trials re-evaluated at 397 and the defaults plateaued near 230; at 4 every seed of the
    # defaults and of three variants reached 500 within 60k steps (bench/RESULTS.md).
    config=dict(hidden=(64, 64), num_envs=4, updates_per_step=4, steps_per_chunk=500),
    space=dict(
        **SAC,
        batch_size=Categorical((128, 256)),  # static: splits trials
    ),
    cpu=Budget(trials=12, configs_per_trial=2, seeds=2, timesteps=60_000),
    gpu=Budget(trials=12, configs_per_trial=32, seeds=8, timesteps=60_000),
    smoke=Budget(trials=2, configs_per_trial=2, seeds=2, timesteps=3_000),
)
