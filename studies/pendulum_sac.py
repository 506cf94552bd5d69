"""SAC on Pendulum-v1: learning rates, discount, Polyak rate, entropy target."""

from harness.space import Budget, LogUniform, Study, Uniform

STUDY = Study(
    name="pendulum_sac",
    description="SAC on Pendulum-v1: actor/critic/alpha learning rates, gamma, tau, entropy target",
    env="Pendulum-v1",
    algo="sac",
    config=dict(hidden=(64, 64), num_envs=4, updates_per_step=4, steps_per_chunk=250),
    space=dict(
        actor_lr=LogUniform(1e-4, 3e-3),
        critic_lr=LogUniform(1e-4, 3e-3),
        alpha_lr=LogUniform(1e-4, 3e-3),
        gamma=Uniform(0.95, 0.995),
        tau=LogUniform(1e-3, 5e-2),
        target_entropy_scale=Uniform(0.25, 1.5),
    ),
    cpu=Budget(trials=12, configs_per_trial=2, seeds=2, timesteps=16_000),
    gpu=Budget(trials=12, configs_per_trial=32, seeds=8, timesteps=20_000),
    smoke=Budget(trials=2, configs_per_trial=2, seeds=2, timesteps=2_000),
)
