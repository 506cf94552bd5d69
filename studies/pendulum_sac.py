"""SAC on Pendulum-v1: learning rates, discount, Polyak rate, entropy target."""

from harness import Budget, Study
from studies._spaces import SAC

STUDY = Study(
    name="pendulum_sac",
    description="SAC on Pendulum-v1: actor/critic/alpha learning rates, gamma, tau, entropy target",
    env="Pendulum-v1",
    algo="sac",
    # the final return saturates within the budget, so it cannot tell configurations apart; the
    # area under the curve ranks how soon they get there
    objective="auc",
    config=dict(hidden=(64, 64), num_envs=4, updates_per_step=4, steps_per_chunk=250),
    space=SAC,
    cpu=Budget(trials=12, configs_per_trial=2, seeds=2, timesteps=16_000),
    gpu=Budget(trials=12, configs_per_trial=32, seeds=8, timesteps=20_000),
    smoke=Budget(trials=2, configs_per_trial=2, seeds=2, timesteps=2_000),
)
