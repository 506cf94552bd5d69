"""PQN on gymnax's Breakout-MinAtar (needs the adapters extra): purejaxql's MinAtar shape, a
LayerNorm MLP over the 10x10x4 grid; learning rate, discounting, Q(lambda), exploration."""

from harness import Budget, Categorical, LogUniform, Study, Uniform

STUDY = Study(
    name="breakout_pqn",
    description="PQN on Breakout-MinAtar: lr, gamma, Q(lambda), epsilon schedule; minibatches",
    env="gymnax:Breakout-MinAtar",
    algo="pqn",
    objective="auc",
    config=dict(num_envs=128, num_steps=32, update_epochs=2, hidden=(128, 128), updates_per_chunk=10),
    space=dict(
        lr=LogUniform(1e-4, 3e-3),
        gamma=Uniform(0.95, 0.995),
        td_lambda=Uniform(0.4, 0.95),
        exploration_fraction=Uniform(0.05, 0.4),
        eps_end=LogUniform(0.01, 0.1),
        num_minibatches=Categorical((16, 32)),  # static: splits trials
    ),
    baseline=dict(lr=5e-4, td_lambda=0.65, exploration_fraction=0.1, num_minibatches=32),  # purejaxql's MinAtar
    reference=0.38,
    reference_label="random play",
    cpu=Budget(trials=6, configs_per_trial=4, seeds=2, timesteps=245_760),
    gpu=Budget(trials=16, configs_per_trial=64, seeds=8, timesteps=5_000_000),
    smoke=Budget(trials=2, configs_per_trial=2, seeds=1, timesteps=40_960),
)
